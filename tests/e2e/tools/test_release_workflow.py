"""The publishing workflow (.github/workflows/release.yml): actionlint passes it; it builds
in a job that holds no token that writes, and publishes what `make release` built and
verified, checked, signed and attested, from a second job in a protected environment;
and the documented verification pins the tag's workflow identity.

actionlint (built from the Go module proxy, like the control plane) checks the
workflow's syntax, expressions and step outputs, and the scripts of its `run:`
steps with shellcheck (Debian's, installed by `make e2e-deps`). Marked e2e: it
needs the binaries of `make e2e-deps`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.workflows import lint_clean_then_broken

pytestmark = pytest.mark.e2e

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "release.yml"


def test_actionlint_passes_the_release_workflow(actionlint: Path, tmp_path: Path) -> None:
    """No finding on the workflow; the same workflow with an undefined step output and an
    unquoted expansion in a script is refused (actionlint, and shellcheck through it,
    are really looking)."""
    refused = lint_clean_then_broken(
        actionlint,
        WORKFLOW,
        tmp_path,
        {
            "steps.image.outputs.digest": "steps.imgae.outputs.digest",
            'digest="$(cat "$RUNNER_TEMP/image.digest")"': (
                "digest=$(cat $RUNNER_TEMP/image.digest)"
            ),
        },
    )
    assert refused.returncode == 1
    assert 'property "imgae" is not defined' in refused.stdout
    assert "SC2086" in refused.stdout


IDENTITY = "https://github.com/OWNER/mirrorgate/.github/workflows/release.yml@refs/tags/vX.Y.Z"
ISSUER = "https://token.actions.githubusercontent.com"
# What a token that writes is granted through: a permission, or the token itself.
WRITES = {"packages", "id-token", "attestations", "contents", "actions", "deployments"}


def _workflow() -> dict[Any, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _scripts(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_it_builds_in_a_job_that_holds_no_token_that_writes() -> None:
    """On a version tag, two jobs: build runs `make release` with `contents: read` alone,
    reaches no secret and no write token, and hands on its files as the run's artifact
    and the SHA-256 of SHA256SUMS as its output; every action pinned by commit."""
    workflow = _workflow()
    assert workflow[True]["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+"]  # YAML 1.1: on → True
    assert workflow["permissions"] == {}
    assert list(workflow["jobs"]) == ["build", "publish"]
    build = workflow["jobs"]["build"]
    assert build["permissions"] == {"contents": "read"}
    assert "environment" not in build
    assert "needs" not in build
    text = yaml.safe_dump(build)
    assert "secrets." not in text
    assert "github.token" not in text
    assert re.search(r"^\s*make release VERSION=", _scripts(build), re.M)
    for step in build["steps"]:
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False
    [upload] = [
        s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")
    ]
    assert (upload["with"]["name"], upload["with"]["path"]) == ("release", "dist/")
    assert build["outputs"] == {"sums": "${{ steps.sums.outputs.sha256 }}"}
    for job in workflow["jobs"].values():
        uses = [step["uses"] for step in job["steps"] if "uses" in step]
        assert all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", use) for use in uses), uses
    pins = re.findall(r"uses: ([\w./-]+@[0-9a-f]{40})  # (v[\d.]+)$", WORKFLOW.read_text(), re.M)
    assert len(pins) == sum(
        1 for job in workflow["jobs"].values() for step in job["steps"] if "uses" in step
    )


def test_only_publish_signs_and_pushes_after_checking_builds_files() -> None:
    """publish needs build and runs in the environment `release`; it alone holds id-token,
    packages, attestations and contents write. It takes only the checksum from build, and
    checks every file against it before the first step that pushes, logs in or signs; then
    the image and chart are pushed by digest, signed keylessly, and attested."""
    jobs = _workflow()["jobs"]
    publish = jobs["publish"]
    assert publish["needs"] == "build"
    assert publish["environment"] == "release"
    assert publish["permissions"] == {
        "contents": "write",
        "packages": "write",
        "id-token": "write",
        "attestations": "write",
    }
    writing = [
        name
        for name, job in jobs.items()
        if any(job.get("permissions", {}).get(p) == "write" for p in WRITES)
    ]
    assert writing == ["publish"]
    text = WORKFLOW.read_text()
    assert set(re.findall(r"needs\.build\.outputs\.(\w+)", text)) == {"sums"}
    assert "make " not in _scripts(publish)
    steps = publish["steps"]
    [download] = [
        i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/download-artifact@")
    ]
    assert steps[download]["with"] == {"name": "release", "path": "dist"}
    [checked] = [i for i, s in enumerate(steps) if "sha256sum --check" in s.get("run", "")]
    check = steps[checked]
    assert check["env"] == {"SUMS": "${{ needs.build.outputs.sums }}"}
    assert 'echo "$SUMS  SHA256SUMS" | sha256sum --check --strict' in check["run"]
    assert "sha256sum --check --strict SHA256SUMS" in check["run"]
    publishing = [
        i
        for i, s in enumerate(steps)
        if re.search(r"login|skopeo|helm\" push|cosign|gh release", s.get("run", ""))
        or s.get("uses", "").startswith("actions/attest-build-provenance@")
    ]
    assert publishing
    assert download < checked < min(publishing)
    scripts = _scripts(publish)
    assert 'cosign sign --yes "$IMAGE@$digest"' in scripts
    assert 'cosign sign --yes "$CHARTS/mirrorgate@$digest"' in scripts
    assert "--type cyclonedx" in scripts
    assert 'cosign sign-blob --yes --bundle "$RUNNER_TEMP/SHA256SUMS.sigstore.json"' in scripts
    assert '"$RUNNER_TEMP/SHA256SUMS.sigstore.json"' in steps[-1]["run"]  # on the release
    attested = [
        step["with"]
        for step in steps
        if step.get("uses", "").startswith("actions/attest-build-provenance@")
    ]
    assert [a.get("subject-name", a.get("subject-checksums")) for a in attested] == [
        "${{ steps.names.outputs.image }}",
        "${{ steps.names.outputs.charts }}/mirrorgate",
        "dist/SHA256SUMS",
    ]


def _verification() -> list[str]:
    """The commands of docs/releasing.md's "Checking a release" block, one a line."""
    text = (REPO_ROOT / "docs" / "releasing.md").read_text()
    section = text.split("### Checking a release", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def test_the_documented_verification_pins_the_tags_workflow_identity() -> None:
    """Every documented check of the image, the chart, the SBOM attestation, the
    provenance and SHA256SUMS's signature takes the exact identity of this workflow at
    the tag and GitHub's issuer; no pattern, no mere owner, anywhere in the docs."""
    workflow_path = WORKFLOW.relative_to(REPO_ROOT).as_posix()
    assert f"https://github.com/OWNER/mirrorgate/{workflow_path}@refs/tags/vX.Y.Z" == IDENTITY
    commands = _verification()
    assert commands[:2] == [f"identity={IDENTITY}", f"issuer={ISSUER}"]
    cosign = [c for c in commands if c.startswith("cosign ")]
    gh = [c for c in commands if c.startswith("gh attestation verify ")]
    assert [c.split()[1] for c in cosign] == [
        "verify",
        "verify",
        "verify-attestation",
        "verify-blob",
    ]
    assert len(gh) == 3
    for command in cosign:
        assert '--certificate-identity "$identity" --certificate-oidc-issuer "$issuer"' in command
    for command in gh:
        assert '--cert-identity "$identity" --cert-oidc-issuer "$issuer"' in command
        assert "--repo OWNER/mirrorgate" in command
    assert any("ghcr.io/OWNER/charts/mirrorgate:X.Y.Z" in c for c in cosign)
    assert "sha256sum -c SHA256SUMS" in commands
    header = WORKFLOW.read_text().split("\nname:", 1)[0]
    assert f"--certificate-identity {IDENTITY}" in header
    assert f"--certificate-oidc-issuer {ISSUER}" in header
    for page in [WORKFLOW, REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        assert "identity-regex" not in text, page  # and -regexp
        assert "--owner OWNER" not in text, page
