"""GitHub workflows of .github/workflows, checked with the pinned actionlint."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def lint(actionlint: Path, workflow: Path) -> subprocess.CompletedProcess[str]:
    """actionlint on ``workflow`` (its scripts through shellcheck, when on PATH)."""
    # From the workflow's repository: actionlint reads its .github/ from the working directory.
    return subprocess.run(
        [str(actionlint), "-no-color", str(workflow)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=workflow.parents[2],
    )


def lint_clean_then_broken(
    actionlint: Path, workflow: Path, workdir: Path, replacements: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Asserts actionlint finds nothing in ``workflow``; returns its findings on a copy
    (in ``workdir``) with each key of ``replacements`` replaced, each key asserted there.
    Without shellcheck actionlint would skip the scripts silently: that fails."""
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck not on PATH: make e2e-deps installs it", pytrace=False)
    done = lint(actionlint, workflow)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    broken = workdir / ".github" / "workflows" / workflow.name
    broken.parent.mkdir(parents=True)
    text = workflow.read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    broken.write_text(text)
    return lint(actionlint, broken)
