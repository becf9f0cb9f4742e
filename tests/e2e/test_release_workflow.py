"""The publishing workflow (.github/workflows/release.yml): actionlint passes it, and it
publishes what `make release` built and verified, signed and attested.

actionlint (built from the Go module proxy, like the control plane) checks the
workflow syntax, expressions, the inputs of the pinned actions, and the scripts
of its `run:` steps with shellcheck when that is installed. Marked e2e: it
needs a Go-built binary of `make e2e-deps`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "release.yml"


def _lint(actionlint: Path, workflow: Path) -> subprocess.CompletedProcess[str]:
    # From the workflow's repository: actionlint reads its .github/ from the working directory.
    return subprocess.run([str(actionlint), "-no-color", str(workflow)], capture_output=True,
                          text=True, timeout=120, check=False, cwd=workflow.parents[2])


def test_actionlint_passes_the_release_workflow(actionlint: Path, tmp_path: Path) -> None:
    """No finding on the workflow; the same workflow with an unknown action input and an
    undefined step output is refused (the linter is really looking)."""
    done = _lint(actionlint, WORKFLOW)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    broken = tmp_path / ".github" / "workflows" / "release.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(WORKFLOW.read_text()
                      .replace("persist-credentials: false", "persist-credentails: false")
                      .replace("steps.image.outputs.digest", "steps.imgae.outputs.digest"))
    refused = _lint(actionlint, broken)
    assert refused.returncode == 1
    assert "persist-credentails" in refused.stdout
    assert "imgae" in refused.stdout


def test_it_publishes_what_make_release_verified() -> None:
    """On a version tag: `make release`, then the image and chart pushed by digest, signed
    keylessly, with provenance attestations; every action pinned by commit."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow[True]["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+"]  # YAML 1.1: on → True
    assert workflow["permissions"] == {}
    [job] = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "write", "packages": "write",
                                  "id-token": "write", "attestations": "write"}
    scripts = "\n".join(step.get("run", "") for step in job["steps"])
    assert re.search(r"^\s*make release VERSION=", scripts, re.M)
    assert "cosign sign --yes \"$IMAGE@$digest\"" in scripts
    assert "cosign sign --yes \"$CHARTS/mirrorgate@$digest\"" in scripts
    assert "--type cyclonedx" in scripts
    uses = [step["uses"] for step in job["steps"] if "uses" in step]
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", use) for use in uses), uses
    attested = [step["with"] for step in job["steps"]
                if step.get("uses", "").startswith("actions/attest-build-provenance@")]
    assert [a.get("subject-name", a.get("subject-checksums")) for a in attested] == [
        "${{ steps.names.outputs.image }}", "${{ steps.names.outputs.charts }}/mirrorgate",
        "dist/SHA256SUMS"]
