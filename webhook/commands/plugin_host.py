"""``mirrorgate plugin-host``: run the credential-provider plugins for ``serve``, over a socket.

It runs in a container of its own (the chart's ``plugin-host`` sidecar), so
that the plugins never hold mirrorgate's ServiceAccount token, only the
identity that container is given for its cloud; ``serve
--credential-provider-socket`` reaches it. What it does with a request:
:mod:`~webhook.credentials.pluginhost`. It exits 0 on SIGTERM, and removes its
socket.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from pathlib import Path
from typing import NoReturn, TextIO

from mirrorgate.webhook import logs
from mirrorgate.webhook.commands import EXIT_OK
from mirrorgate.webhook.commands.serve import settings
from mirrorgate.webhook.credentials import pluginhost, providerconfig
from mirrorgate.webhook.credentials.pluginrunner import LocalRunner
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.logs import logger

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket",
        required=True,
        metavar="PATH",
        help="the unix socket to listen on (serve's --credential-provider-socket)",
    )
    for name in (
        "credential_provider_config",
        "credential_provider_bin_dir",
        "credential_provider_timeout",
    ):
        settings.add_flag(parser, name, required=name != "credential_provider_timeout")
    settings.add_flag(parser, "log_level")


def _stop(signum: int, frame: object) -> NoReturn:
    raise SystemExit(EXIT_OK)  # a plugin running now is killed on the way out


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        config = providerconfig.load(args.credential_provider_config)
    except providerconfig.ProviderConfigError as error:
        raise ConfigError(str(error)) from None
    bin_dir = Path(args.credential_provider_bin_dir)
    if not bin_dir.is_dir():
        raise ConfigError(f"--credential-provider-bin-dir {str(bin_dir)!r}: not a directory")
    logs.configure(args.log_level)
    missing = sorted(
        name
        for name in config.providers
        if not (bin_dir / name).is_file() or not os.access(bin_dir / name, os.X_OK)
    )
    if missing:
        logger.warning(
            "plugin host: providers without an executable plugin",
            extra={"fields": {"providers": missing, "bin_dir": str(bin_dir)}},
        )
    listener = pluginhost.listen(args.socket)
    signal.signal(signal.SIGTERM, _stop)
    try:
        logger.info(
            "plugin host listening",
            extra={"fields": {"socket": args.socket, "providers": sorted(config.providers)}},
        )
        logs.flush()
        local = LocalRunner(bin_dir, timeout=args.credential_provider_timeout)
        pluginhost.serve_forever(listener, config, local)
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            Path(args.socket).unlink()
    return EXIT_OK  # pragma: no cover - serve_forever returns only by an exception
