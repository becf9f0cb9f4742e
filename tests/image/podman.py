"""The image under test, built and run with podman exactly as `make image` does."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PODMAN_SH = REPO_ROOT / "image" / "podman.sh"
# Root in this VM lacks CAP_SYS_RESOURCE, and podman's default rlimits for a
# container (1,048,576 files and processes) are above the host's hard limits,
# so runc cannot set them. A webhook needs far less; explicit limits work anywhere.
ULIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=2048:2048")
# The user of the Containerfile's USER line and the Deployment's securityContext.
RUN_AS = "65532:65532"


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """podman (through image/podman.sh) with its output captured; raises naming stderr."""
    done = subprocess.run(
        ["bash", str(PODMAN_SH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def build(
    script: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 1200,
    root: Path = REPO_ROOT,
) -> str:
    """Run one of the image/ scripts of the tree at ``root`` (this one, or an earlier
    release's); returns the image name it prints last."""
    done = subprocess.run(
        ["bash", str(root / "image" / script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, f"image/{script} failed:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


def run(
    image: str, *args: str, options: Sequence[str] = (), timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The image as the Deployment runs it: read-only root, non-root user, no network."""
    return podman(
        "run",
        "--rm",
        "--read-only",
        "--user",
        RUN_AS,
        "--network=none",
        *ULIMITS,
        *options,
        image,
        *args,
        timeout=timeout,
        check=False,
    )


def push(image: str, destination: str, *, ca_path: Path, username: str, password: str) -> str:
    """Push ``image`` to ``destination`` (host/repository:tag) over TLS with ``ca_path``;
    returns the manifest digest the registry stored."""
    with tempfile.TemporaryDirectory(prefix="mirrorgate-push-") as work:
        certs = Path(work, "certs")  # podman's --cert-dir: CAs as *.crt files
        certs.mkdir()
        shutil.copy(ca_path, certs / "ca.crt")
        digest_file = Path(work, "digest")
        podman(
            "push",
            "--quiet",
            "--cert-dir",
            str(certs),
            "--digestfile",
            str(digest_file),
            "--creds",
            f"{username}:{password}",
            image,
            f"docker://{destination}",
            timeout=300,
        )
        return digest_file.read_text().strip()
