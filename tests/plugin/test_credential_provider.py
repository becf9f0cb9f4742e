"""The kubelet plugin's own checks: `go vet` and its Go unit tests (plugins/credential-provider).

They run with the suite, so `make test` covers the plugin as it covers the server. Go is
the suite's prerequisite already (the e2e harness builds its test plugins and images).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "plugins" / "credential-provider"
GO_ENV = {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}


def _go(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["go", *args],
        cwd=SOURCE,
        env={**os.environ, **GO_ENV},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.parametrize("command", [("vet", "./..."), ("test", "-count=1", "./...")])
def test_go(command: tuple[str, ...]) -> None:
    result = _go(*command)
    assert result.returncode == 0, f"go {' '.join(command)}:\n{result.stdout}{result.stderr}"


def test_gofmt() -> None:
    result = subprocess.run(
        ["gofmt", "-l", "."], cwd=SOURCE, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", f"gofmt -l: {result.stdout}"
