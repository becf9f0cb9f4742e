"""Where the real binaries live, and a clear error naming the command that provides each."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SH = REPO_ROOT / "tests" / "controlplane" / "build.sh"

# Built from the Go module proxy by build.sh, which pins their versions.
BUILT = ("kube-apiserver", "etcd", "kustomize", "promtool", "helm", "actionlint", "kubectl")


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


@functools.cache
def kubernetes_version() -> tuple[int, int, int]:
    """The Kubernetes release the suite runs (build.sh's, or ``K8S_VERSION=vX.Y.Z``), as
    (1, minor, patch): the tests whose behaviour differs by minor ask it."""
    out = subprocess.run(
        ["bash", str(BUILD_SH), "--k8s-version"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    found = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", out.stdout.strip())
    if found is None:
        raise RuntimeError(f"build.sh names no Kubernetes version: {out.stderr.strip()}")
    major, minor, patch = (int(part) for part in found.groups())
    return major, minor, patch


def kubernetes_minor() -> int:
    """The minor of :func:`kubernetes_version` (30 for v1.30.14)."""
    return kubernetes_version()[1]


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
