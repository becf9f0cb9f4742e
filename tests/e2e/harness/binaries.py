"""Where the real binaries live, and a clear error naming the command that provides each."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SH = REPO_ROOT / "tests" / "controlplane" / "build.sh"

# Built from the Go module proxy by build.sh, which pins their versions.
BUILT = ("kube-apiserver", "etcd", "kustomize", "promtool", "helm", "actionlint")


class MissingBinaryError(Exception):
    """A binary the e2e suite needs is not installed; the message says how to get it."""

    def __init__(self, name: str, expected: str, command: str) -> None:
        super().__init__(f"{name} not found (expected {expected}); build it with: {command}")
        self.name = name
        self.command = command


def built_binary(name: str) -> Path:
    """The cached binary build.sh makes for `name`, or MissingBinaryError."""
    # Asking build.sh keeps the pinned versions (and MIRRORGATE_CACHE) in one place.
    out = subprocess.run(
        ["bash", str(BUILD_SH), "--path", name],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    path = Path(out.stdout.strip())
    if not os.access(path, os.X_OK):
        raise MissingBinaryError(
            name, str(path), f"make e2e-deps  (or: bash tests/controlplane/build.sh {name})"
        )
    return path


def docker_registry() -> Path:
    """The Debian `docker-registry` (distribution 2.8) binary, or MissingBinaryError."""
    found = shutil.which("docker-registry")
    if found is None:
        raise MissingBinaryError(
            "docker-registry",
            "on PATH",
            "make e2e-deps  (or: apt-get install --no-install-recommends docker-registry)",
        )
    return Path(found)
