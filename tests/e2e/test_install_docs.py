"""README "Installing" as written: the kustomization it shows sets the image
through `images:` on top of the overlay it names."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e import mirrorgate as mg

pytestmark = pytest.mark.e2e

README = (mg.REPO / "README.md").read_text()


def _readme_kustomization() -> str:
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", README, re.DOTALL)
                if "kind: Kustomization" in b]
    return str(block)


def test_readme_kustomization_sets_the_image(kustomize: Path, tmp_path: Path) -> None:
    """The block verbatim, in a directory beside a checkout named `mirrorgate`."""
    (tmp_path / "mirrorgate").symlink_to(mg.REPO)
    mine = tmp_path / "mine"
    mine.mkdir()
    text = _readme_kustomization()
    (mine / "kustomization.yaml").write_text(text)
    done = subprocess.run([str(kustomize), "build", str(mine)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (deployment,) = [d for d in yaml.safe_load_all(done.stdout)
                     if d and d["kind"] == "Deployment"]
    image = yaml.safe_load(text)["images"][0]
    expected = f"{image['newName']}:{image['newTag']}"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == expected
    # `name` is the overlays' own image: nothing is left pointing at it.
    assert image["name"] not in done.stdout
