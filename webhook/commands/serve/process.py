"""The `mirrorgate serve` process: listen first, uvicorn with the edge's limits on the admission
listener (and the metrics listener, with --metrics-port, and the kubelet credential listener,
with --kubelet-port), exit on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import signal
import socket
from collections.abc import Sequence
from typing import Any, Literal, NoReturn, TextIO

import uvicorn

from mirrorgate.webhook import errors, logs
from mirrorgate.webhook.commands import EXIT_OK
from mirrorgate.webhook.commands.serve.settings import Settings
from mirrorgate.webhook.commands.serve.wiring import Server, build
from mirrorgate.webhook.edge import accept, app, connections, peercert
from mirrorgate.webhook.logs import logger
from mirrorgate.webhook.version import VERSION

__all__ = [
    "MONITORING_CONNECTIONS",
    "kubelet_config",
    "listen",
    "monitoring_config",
    "run",
    "serve",
    "uvicorn_config",
]


MONITORING_CONNECTIONS = 64
"""Open connections of the metrics listener: Prometheus and the kubelet's probes need a few.
A table of their own, so that neither listener's clients can close the other's."""


def _config(server: Server, application: Any, *, lifespan: Literal["on", "off"]) -> uvicorn.Config:
    """uvicorn on uvloop for ``application``, TLS and limits left to the acceptor."""
    settings = server.settings
    config = uvicorn.Config(
        application,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan=lifespan,
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
    # The server itself is plain TCP: each connection is counted from its
    # accept and upgraded to TLS (>= 1.2, hot-swapped certificates) by the
    # acceptor, within the header timeout.
    config.ssl = None
    return config


def uvicorn_config(server: Server) -> uvicorn.Config:
    """uvicorn on uvloop, with TLS and every limit applied by :mod:`webhook.connections`."""
    settings = server.settings
    problems = settings.limits.problems()
    if problems:
        raise errors.ConfigError("; ".join(problems))
    config = _config(server, server.application, lifespan="on")
    metrics = server.runtime.metrics
    table = connections.ConnectionTable(
        settings.limits, on_close=lambda reason: metrics.connections_dropped.labels(reason).inc()
    )
    metrics.open_connections.set_function(lambda: len(table.open))
    server.connections = table
    config.http_protocol_class = accept.protocol_factory(  # type: ignore[assignment]
        table, server.certificates.base
    )
    return config


def monitoring_config(server: Server) -> uvicorn.Config | None:
    """The metrics listener's uvicorn config (--metrics-port), its connections a table
    of their own; None without the flag."""
    if server.monitoring is None:
        return None
    config = _config(server, server.monitoring, lifespan="off")
    metrics = server.runtime.metrics
    limits = dataclasses.replace(server.settings.limits, max_connections=MONITORING_CONNECTIONS)
    table = connections.ConnectionTable(
        limits, on_close=lambda reason: metrics.connections_dropped.labels(reason).inc()
    )
    config.http_protocol_class = accept.protocol_factory(  # type: ignore[assignment]
        table, server.certificates.metrics_base
    )
    return config


def kubelet_config(server: Server) -> uvicorn.Config | None:
    """The kubelet credential listener's uvicorn config (--kubelet-port): its connections a
    table of their own, each request's scope holding the kubelet certificate the handshake
    verified (:mod:`webhook.edge.peercert`); None without the flag."""
    base = server.certificates.kubelet_base
    if server.kubelet is None or base is None:
        return None
    config = _config(server, server.kubelet, lifespan="off")
    metrics = server.runtime.metrics
    table = connections.ConnectionTable(
        server.settings.limits,
        on_close=lambda reason: metrics.connections_dropped.labels(reason).inc(),
    )
    config.http_protocol_class = accept.protocol_factory(  # type: ignore[assignment]
        table, base, peercert.PeerCertProtocol
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
    """uvicorn that says "serving" once it accepts connections, not before, and serves the
    metrics listener beside the admission one."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        runtime: app.Runtime,
        addresses: dict[str, str],
        extra: Sequence[tuple[socket.socket, uvicorn.Config]] = (),
    ) -> None:
        super().__init__(config)
        self.runtime, self.addresses, self.extra = runtime, addresses, list(extra)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        for listener, config in self.extra if self.started else ():
            # Stopped with the admission listener: uvicorn closes every server in the list.
            self.servers.append(
                await asyncio.get_running_loop().create_server(
                    functools.partial(self._protocol, config), sock=listener, backlog=config.backlog
                )
            )
        if self.started:
            loaded = self.runtime.policy
            logger.info(
                "mirrorgate serving",
                extra={
                    "fields": {
                        **self.addresses,
                        "version": VERSION,
                        "policy": loaded.version,
                        "mode": self.runtime.mode,
                    }
                },
            )
            logs.flush()

    def _protocol(
        self, config: uvicorn.Config, _loop: asyncio.AbstractEventLoop | None = None
    ) -> Any:
        return config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=self.server_state, app_state={}, _loop=_loop
        )


def _https(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _exit_quietly(signum: int, frame: object) -> NoReturn:
    # While serving, uvicorn takes SIGTERM, drains the requests in flight and
    # then raises the signal again for the handler it found: this one, so
    # that a graceful stop exits 0 instead of dying of the signal. Before
    # serving starts it ends the process at once, also with 0.
    raise SystemExit(0)


def uvicorn_server(
    server: Server,
    listener: socket.socket,
    metrics_listener: socket.socket | None = None,
    kubelet_listener: socket.socket | None = None,
) -> uvicorn.Server:
    """The uvicorn server for ``server``: run it with ``run(sockets=[listener])``; it serves
    the metrics and kubelet credential listeners too when the settings ask for them."""
    config = uvicorn_config(server)
    addresses = {"address": _https(listener)}
    extra = []
    for name, sock, made in (
        ("metrics_address", metrics_listener, monitoring_config(server)),
        ("kubelet_address", kubelet_listener, kubelet_config(server)),
    ):
        if sock is not None and made is not None:
            addresses[name] = _https(sock)
            extra.append((sock, made))
    return _Uvicorn(config, runtime=server.runtime, addresses=addresses, extra=extra)


def serve(settings: Settings) -> None:
    """Listen first (a busy port is a ConfigError), then build and serve until SIGTERM."""
    logs.configure(settings.log_level)
    listener = listen(settings.host, settings.port)
    metrics_listener = (
        None if settings.metrics_port is None else listen(settings.host, settings.metrics_port)
    )
    kubelet_listener = (
        None if settings.kubelet_port is None else listen(settings.host, settings.kubelet_port)
    )
    signal.signal(signal.SIGTERM, _exit_quietly)
    server = build(settings)
    instance = uvicorn_server(server, listener, metrics_listener, kubelet_listener)
    monitored = 0 if metrics_listener is None else MONITORING_CONNECTIONS
    kubelets = 0 if kubelet_listener is None else settings.limits.max_connections
    accept.raise_file_limit(settings.limits.max_connections + monitored + kubelets)
    # run(), not asyncio.run(serve()): run() uses the loop the config names (uvloop).
    instance.run(sockets=[listener])


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`mirrorgate serve`: its flags as :class:`Settings`, served until SIGTERM."""
    serve(Settings.from_args(args))
    return EXIT_OK
