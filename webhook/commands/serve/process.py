"""The `mirrorgate serve` process: listen first, uvicorn with the edge's limits, exit on SIGTERM."""

from __future__ import annotations

import argparse
import signal
import socket
from typing import NoReturn, TextIO

import uvicorn

from mirrorgate.webhook import errors, logs
from mirrorgate.webhook.commands import EXIT_OK
from mirrorgate.webhook.commands.serve.settings import Settings
from mirrorgate.webhook.commands.serve.wiring import Server, build
from mirrorgate.webhook.edge import accept, app, connections
from mirrorgate.webhook.logs import logger
from mirrorgate.webhook.version import VERSION

__all__ = ["listen", "run", "serve", "uvicorn_config"]


def uvicorn_config(server: Server) -> uvicorn.Config:
    """uvicorn on uvloop, with TLS and every limit applied by :mod:`webhook.connections`."""
    settings = server.settings
    problems = settings.limits.problems()
    if problems:
        raise errors.ConfigError("; ".join(problems))
    config = uvicorn.Config(
        server.application,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # uvloop: an idle TLS connection costs a fraction of what it costs
        # under asyncio's own loop, which zero-fills a buffer per connection
        # (the figures: docs/development.md, Architecture).
        loop="uvloop",
        http="httptools",
        ws="none",
        # Idle keep-alive connections: uvicorn's timer, armed after each answer.
        timeout_keep_alive=settings.limits.idle_timeout,  # type: ignore[arg-type]
    )
    config.load()
    metrics = server.runtime.metrics
    table = connections.ConnectionTable(
        settings.limits, on_close=lambda reason: metrics.connections_dropped.labels(reason).inc()
    )
    metrics.open_connections.set_function(lambda: len(table.open))
    server.connections = table
    # The server itself is plain TCP: each connection is counted from its
    # accept and upgraded to TLS (>= 1.2, hot-swapped certificates) by the
    # acceptor, within the header timeout.
    config.ssl = None
    config.http_protocol_class = accept.protocol_factory(  # type: ignore[assignment]
        table, server.certificates.base
    )
    return config


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; a one-line ConfigError when that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Restarts may reuse a port in TIME_WAIT; a listening owner still refuses.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise errors.ConfigError(
            f"cannot listen on {host}:{port}: {error.strerror or error}"
        ) from None
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn that says "serving" once it accepts connections, not before."""

    def __init__(self, config: uvicorn.Config, *, runtime: app.Runtime, address: str) -> None:
        super().__init__(config)
        self.runtime, self.address = runtime, address

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            loaded = self.runtime.policy
            logger.info(
                "mirrorgate serving",
                extra={
                    "fields": {
                        "address": self.address,
                        "version": VERSION,
                        "policy": loaded.version,
                        "mode": self.runtime.mode,
                    }
                },
            )
            logs.flush()


def _exit_quietly(signum: int, frame: object) -> NoReturn:
    # While serving, uvicorn takes SIGTERM, drains the requests in flight and
    # then raises the signal again for the handler it found: this one, so
    # that a graceful stop exits 0 instead of dying of the signal. Before
    # serving starts it ends the process at once, also with 0.
    raise SystemExit(0)


def serve(settings: Settings) -> None:
    """Listen first (a busy port is a ConfigError), then build and serve until SIGTERM."""
    logs.configure(settings.log_level)
    listener = listen(settings.host, settings.port)
    signal.signal(signal.SIGTERM, _exit_quietly)
    server = build(settings)
    config = uvicorn_config(server)
    accept.raise_file_limit(settings.limits.max_connections)
    host, port = listener.getsockname()[:2]
    address = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    # run(), not asyncio.run(serve()): run() uses the loop the config names (uvloop).
    _Uvicorn(config, runtime=server.runtime, address=address).run(sockets=[listener])


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`mirrorgate serve`: its flags as :class:`Settings`, served until SIGTERM."""
    serve(Settings.from_args(args))
    return EXIT_OK
