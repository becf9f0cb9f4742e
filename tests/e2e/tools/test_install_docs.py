"""The install docs as written (README "Install" and docs/install.md): the
kustomization each shows sets the image through `images:` on top of the overlay
it names."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness.binaries import REPO_ROOT

pytestmark = pytest.mark.e2e

PAGES = ("README.md", "docs/install.md")


def _shown_kustomization(page: str) -> str:
    (block,) = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", (REPO_ROOT / page).read_text(), re.DOTALL)
        if "kind: Kustomization" in b
    ]
    return str(block)


@pytest.mark.parametrize("page", PAGES)
def test_the_shown_kustomization_sets_the_image(page: str, kustomize: Path, tmp_path: Path) -> None:
    """The block verbatim, in a directory beside a checkout named `mirrorgate`."""
    (tmp_path / "mirrorgate").symlink_to(REPO_ROOT)
    mine = tmp_path / "mine"
    mine.mkdir()
    text = _shown_kustomization(page)
    (mine / "kustomization.yaml").write_text(text)
    done = subprocess.run(
        [str(kustomize), "build", str(mine)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (deployment,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Deployment"]
    image = yaml.safe_load(text)["images"][0]
    expected = f"{image['newName']}:{image['newTag']}"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == expected
    # `name` is the overlays' own image: nothing is left pointing at it.
    assert image["name"] not in done.stdout
