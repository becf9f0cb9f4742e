"""The credential-provider plugin the tests run: a real Go exec plugin, built here.

`plugins/<name>/main.go` is compiled once per source and Go version (CGO off,
so statically linked, as the kubelet's plugins are shipped) and cached next to
the control-plane binaries, as the node's images are (`testimages.go_binary`).
`install` puts it into a plugin directory under the name a
CredentialProviderConfig gives it; `plugin_host` runs `mirrorgate plugin-host`
for such a directory.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tests.commands import MIRRORGATE
from tests.e2e.harness.oci import OciImage, build_image
from tests.e2e.harness.procs import ManagedProcess, wait_until
from tests.e2e.harness.testimages import go_binary

SOURCES = Path(__file__).resolve().parent / "plugins"
PLUGIN = "test-credential-provider"


def install(bin_dir: Path, as_name: str = PLUGIN) -> Path:
    """Write the plugin into `bin_dir` as `as_name` (executable); returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / as_name
    target.write_bytes(go_binary(PLUGIN, sources=SOURCES))
    target.chmod(0o755)
    return target


IMAGE_PATH = "plugins"
"""Where the plugin image holds the plugins (the chart's credentialProviders.path)."""
INSTALL_COMMAND = ["/install-plugins", f"/{IMAGE_PATH}", "/credential-providers"]
"""The chart's credentialProviders.command for that image: it has no cp."""


def image(names: Sequence[str]) -> OciImage:
    """An image of the plugin under each of `names` in /plugins, as a user ships plugins
    for the chart's initContainer, with a static copier (`images/install-plugins`)."""
    plugin = go_binary(PLUGIN, sources=SOURCES)
    files = {f"{IMAGE_PATH}/{name}": (plugin, 0o755) for name in names}
    files["install-plugins"] = (go_binary("install-plugins"), 0o755)
    return build_image(files=files, command=INSTALL_COMMAND)


@contextlib.contextmanager
def plugin_host(
    log_dir: Path,
    config: Path,
    bin_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 5,
) -> Iterator[tuple[ManagedProcess, Path]]:
    """`mirrorgate plugin-host` for `config`'s plugins in `bin_dir`, with `env` added to
    its environment; yields it and its socket, once it listens. The socket is in a short
    directory of its own: a unix socket's path is limited to 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="mg-ph-") as short:
        socket_path = Path(short) / "plugins.sock"
        process = ManagedProcess(
            "plugin-host",
            [
                *MIRRORGATE,
                "plugin-host",
                "--socket",
                str(socket_path),
                "--credential-provider-config",
                str(config),
                "--credential-provider-bin-dir",
                str(bin_dir),
                "--credential-provider-timeout",
                str(timeout),
            ],
            log_dir / "plugin-host.log",
            env=env,
        )
        try:
            wait_until(
                lambda: None if socket_path.is_socket() else "no socket yet",
                timeout=30,
                what="plugin-host listening",
                alive=process.exited,
            )
            yield process, socket_path
        finally:
            process.stop()
