"""The credential-provider plugin the tests run: a real Go exec plugin, built here.

`plugins/<name>/main.go` is compiled once per source and Go version (CGO off,
so statically linked, as the kubelet's plugins are shipped) and cached next to
the control-plane binaries, as the node's images are (`testimages.go_binary`).
`install` puts it into a plugin directory under the name a
CredentialProviderConfig gives it.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.testimages import go_binary

SOURCES = Path(__file__).resolve().parent / "plugins"
PLUGIN = "test-credential-provider"


def install(bin_dir: Path, as_name: str = PLUGIN) -> Path:
    """Write the plugin into `bin_dir` as `as_name` (executable); returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / as_name
    target.write_bytes(go_binary(PLUGIN, sources=SOURCES))
    target.chmod(0o755)
    return target
