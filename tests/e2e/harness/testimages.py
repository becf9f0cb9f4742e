"""The node's images, built by the suite: static Go binaries in one-layer OCI images.

No public registry is reachable, so the Pod sandbox (pause) image and every
workload image are built here and pushed to the loopback upstream. The Go
programs live in `tests/e2e/harness/images/<name>/main.go`; each is compiled once per
source and Go version (CGO off, so statically linked) and cached next to the
control-plane binaries, like build.sh caches those.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from tests.e2e.harness.binaries import BUILD_SH
from tests.e2e.harness.dockerconfig import Credentials
from tests.e2e.harness.oci import OciImage, build_image
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.registry_client import RegistryClient

SOURCES = Path(__file__).resolve().parent / "images"
PAUSE_REPOSITORY = "library/pause"
PAUSE_TAG = "3.10"
_GO_ENV = {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}


def _cache_dir() -> Path:
    out = subprocess.run(
        ["bash", str(BUILD_SH), "--print"], check=True, capture_output=True, text=True, timeout=30
    )
    return Path(out.stdout.strip())


def go_binary(name: str, *, sources: Path = SOURCES) -> bytes:
    """The static binary of `<sources>/<name>` (default: `images/<name>`), built on first use
    and cached by source hash."""
    source = (sources / name / "main.go").read_bytes()
    env = {**os.environ, **_GO_ENV}
    version = subprocess.run(
        ["go", "version"], check=True, capture_output=True, env=env, timeout=60
    ).stdout
    key = hashlib.sha256(source + version).hexdigest()[:16]
    cached = _cache_dir() / f"e2e-{name}-{key}"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as work:
            Path(work, "go.mod").write_text(f"module mirrorgate.test/{name}\n\ngo 1.22\n")
            Path(work, "main.go").write_bytes(source)
            subprocess.run(
                ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", f"{cached}.tmp", "."],
                check=True,
                cwd=work,
                env=env,
                capture_output=True,
                timeout=600,
            )
        Path(f"{cached}.tmp").rename(cached)  # atomic: a concurrent run sees all or nothing
        for stale in cached.parent.glob(f"e2e-{name}-*"):
            if stale != cached and not stale.name.endswith(".tmp"):
                stale.unlink(missing_ok=True)  # built from an older source or Go version
    return cached.read_bytes()


def pause_image() -> OciImage:
    return build_image(files={"pause": (go_binary("pause"), 0o755)}, command=["/pause"])


def workload_image(greeting: str) -> OciImage:
    """The `hello` program printing `greeting`: one image (and digest) per greeting."""
    return build_image(
        files={"hello": (go_binary("hello"), 0o755)}, command=["/hello"], env={"GREETING": greeting}
    )


def push_upstream(registry: RegistryStack, repository: str, tag: str, image: OciImage) -> str:
    """Push `image` to the upstream; returns the reference a Pod names it by."""
    credentials = Credentials(registry.upstream_username, registry.upstream_password)
    with RegistryClient(
        registry.upstream_host, ca_file=str(registry.ca_path), credentials=credentials
    ) as client:
        pushed = client.push(repository, tag, image)
    if pushed != image.digest:
        raise RuntimeError(
            f"upstream stored {pushed} for {repository}:{tag}, expected {image.digest}"
        )
    return f"{registry.upstream_host}/{repository}:{tag}"
