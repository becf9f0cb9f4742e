"""The credential-provider plugin the tests run: a real Go exec plugin, built here.

`plugins/<name>/main.go` is compiled once per source and Go version (CGO off,
so statically linked, as the kubelet's plugins are shipped) and cached next to
the control-plane binaries, as build.sh caches those. `install` puts it into a
plugin directory under the name a CredentialProviderConfig gives it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.e2e.binaries import BUILD_SH

SOURCES = Path(__file__).resolve().parent / "plugins"
PLUGIN = "test-credential-provider"
_GO_ENV = {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}


def _cache_dir() -> Path:
    out = subprocess.run(["bash", str(BUILD_SH), "--print"], check=True, capture_output=True,
                         text=True, timeout=30)
    return Path(out.stdout.strip())


def plugin_binary(name: str = PLUGIN) -> Path:
    """The cached static binary of `plugins/<name>`, built on first use."""
    source = (SOURCES / name / "main.go").read_bytes()
    env = {**os.environ, **_GO_ENV}
    version = subprocess.run(["go", "version"], check=True, capture_output=True, env=env,
                             timeout=60).stdout
    cached = _cache_dir() / f"{name}-{hashlib.sha256(source + version).hexdigest()[:16]}"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as work:
            Path(work, "go.mod").write_text(f"module mirrorgate.test/{name}\n\ngo 1.22\n")
            Path(work, "main.go").write_bytes(source)
            subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o",
                            f"{cached}.tmp", "."], check=True, cwd=work, env=env,
                           capture_output=True, timeout=600)
        Path(f"{cached}.tmp").rename(cached)  # atomic: a concurrent run sees all or nothing
    return cached


def install(bin_dir: Path, as_name: str = PLUGIN) -> Path:
    """Copy the plugin into `bin_dir` as `as_name` (executable); returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / as_name
    shutil.copyfile(plugin_binary(), target)
    target.chmod(0o755)
    return target
