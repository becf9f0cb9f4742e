"""The test workflow (.github/workflows/e2e.yml): actionlint passes it; it runs `make test`
on every push of a branch and `make test-versions` nightly, on tags and by hand, with a
token that only reads. Marked e2e: actionlint is one of `make e2e-deps`' binaries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.workflows import lint_clean_then_broken

pytestmark = pytest.mark.e2e

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "e2e.yml"


def _workflow() -> dict[Any, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_actionlint_passes_the_e2e_workflow(actionlint: Path, tmp_path: Path) -> None:
    """No finding; the same file with a job condition on an unknown context and an
    unquoted expansion in its script is refused (actionlint and shellcheck really look)."""
    refused = lint_clean_then_broken(
        actionlint,
        WORKFLOW,
        tmp_path,
        {
            "if: github.event_name != 'push'": "if: gihtub.event_name != 'push'",
            '"MIRRORGATE_VERSIONS_LOGS=$RUNNER_TEMP/test-versions"': (
                "MIRRORGATE_VERSIONS_LOGS=$RUNNER_TEMP/test-versions"
            ),
        },
    )
    assert refused.returncode == 1
    assert 'undefined variable "gihtub"' in refused.stdout
    assert "SC2086" in refused.stdout


def _runs(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_make_test_on_pushes_and_the_version_matrix_nightly_and_on_tags() -> None:
    workflow = _workflow()
    triggers = workflow[True]  # YAML 1.1: on → True
    assert triggers["push"]["branches"] == ["**"]
    assert triggers["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+"]
    assert [s["cron"] for s in triggers["schedule"]] == ["17 3 * * *"]
    assert "workflow_dispatch" in triggers
    jobs = workflow["jobs"]
    assert set(jobs) == {"test", "versions"}
    assert "make test\n" in _runs(jobs["test"])
    assert "test-versions" not in _runs(jobs["test"])
    assert "make test-versions" in _runs(jobs["versions"])
    # A branch push runs `test` only; a tag, the schedule or a dispatch `versions` only.
    assert jobs["test"]["if"] == (
        "github.event_name == 'push' && !startsWith(github.ref, 'refs/tags/')"
    )
    assert jobs["versions"]["if"] == (
        "github.event_name != 'push' || startsWith(github.ref, 'refs/tags/')"
    )
    # Nothing here writes: the token reads the repository, no job asks for more.
    assert workflow["permissions"] == {"contents": "read"}
    assert all("permissions" not in job for job in jobs.values())
    assert jobs["test"]["timeout-minutes"] <= 90
