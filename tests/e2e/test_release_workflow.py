"""The publishing workflow (.github/workflows/release.yml): actionlint passes it, and it
publishes what `make release` built and verified, signed and attested.

actionlint (built from the Go module proxy, like the control plane) checks the
workflow's syntax, expressions and step outputs, and the scripts of its `run:`
steps with shellcheck (Debian's, installed by `make e2e-deps`). Marked e2e: it
needs the binaries of `make e2e-deps`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "release.yml"


def _lint(actionlint: Path, workflow: Path) -> subprocess.CompletedProcess[str]:
    # From the workflow's repository: actionlint reads its .github/ from the working directory.
    return subprocess.run(
        [str(actionlint), "-no-color", str(workflow)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=workflow.parents[2],
    )


def test_actionlint_passes_the_release_workflow(actionlint: Path, tmp_path: Path) -> None:
    """No finding on the workflow; the same workflow with an undefined step output and an
    unquoted expansion in a script is refused (actionlint, and shellcheck through it,
    are really looking)."""
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck not on PATH: make e2e-deps installs it", pytrace=False)
    done = _lint(actionlint, WORKFLOW)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    broken = tmp_path / ".github" / "workflows" / "release.yml"
    broken.parent.mkdir(parents=True)
    text = WORKFLOW.read_text()
    assert 'digest="$(cat "$RUNNER_TEMP/image.digest")"' in text
    broken.write_text(
        text.replace("steps.image.outputs.digest", "steps.imgae.outputs.digest").replace(
            'digest="$(cat "$RUNNER_TEMP/image.digest")"', "digest=$(cat $RUNNER_TEMP/image.digest)"
        )
    )
    refused = _lint(actionlint, broken)
    assert refused.returncode == 1
    assert 'property "imgae" is not defined' in refused.stdout
    assert "SC2086" in refused.stdout


def test_it_publishes_what_make_release_verified() -> None:
    """On a version tag: `make release`, then the image and chart pushed by digest, signed
    keylessly, with provenance attestations; every action pinned by commit."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow[True]["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+"]  # YAML 1.1: on → True
    assert workflow["permissions"] == {}
    [job] = workflow["jobs"].values()
    assert job["permissions"] == {
        "contents": "write",
        "packages": "write",
        "id-token": "write",
        "attestations": "write",
    }
    scripts = "\n".join(step.get("run", "") for step in job["steps"])
    assert re.search(r"^\s*make release VERSION=", scripts, re.M)
    assert 'cosign sign --yes "$IMAGE@$digest"' in scripts
    assert 'cosign sign --yes "$CHARTS/mirrorgate@$digest"' in scripts
    assert "--type cyclonedx" in scripts
    uses = [step["uses"] for step in job["steps"] if "uses" in step]
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", use) for use in uses), uses
    attested = [
        step["with"]
        for step in job["steps"]
        if step.get("uses", "").startswith("actions/attest-build-provenance@")
    ]
    assert [a.get("subject-name", a.get("subject-checksums")) for a in attested] == [
        "${{ steps.names.outputs.image }}",
        "${{ steps.names.outputs.charts }}/mirrorgate",
        "dist/SHA256SUMS",
    ]
