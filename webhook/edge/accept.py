"""The accept step: each TCP connection entered in the table at once, then upgraded to TLS.

:class:`TlsAcceptor`, one per accepted TCP connection, enters the
connection in the :class:`ConnectionTable` at once, before the TLS
handshake (a client that never starts TLS holds memory too), and upgrades
it with ``loop.start_tls`` within the header timeout.
"""

from __future__ import annotations

import asyncio
import resource
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, cast

from uvicorn.config import Config
from uvicorn.server import ServerState

from mirrorgate.webhook.edge import hooks
from mirrorgate.webhook.edge.connections import ConnectionTable
from mirrorgate.webhook.edge.protocol import LimitedHttpProtocol
from mirrorgate.webhook.errors import ConfigError

__all__ = ["TlsAcceptor", "protocol_factory", "raise_file_limit"]

SHUTDOWN_TIMEOUT = 2.0
"""Seconds a closing TLS connection waits for the peer's close_notify (asyncio's default: 30)."""


class TlsAcceptor(asyncio.Protocol):
    """One accepted TCP connection: entered in the table, then upgraded to TLS.

    Created by :func:`protocol_factory` in place of uvicorn's protocol, so the
    server itself listens without TLS and each connection is counted (and can
    be closed) from its first moment, not only once its handshake is done.
    """

    def __init__(self, http: LimitedHttpProtocol, context: ssl.SSLContext) -> None:
        self.http, self.context = http, context
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is an asyncio.Transport in all but its base classes.
        raw = cast("asyncio.Transport", transport)
        http = self.http
        http.raw = raw
        address = raw.get_extra_info("peername")
        http.peer = str(address[0]) if address else ""
        if not http.table.admit(http):
            raw.abort()
            return
        upgrade = http.loop.start_tls(  # the protocol's loop: a private hook
            raw,
            http,
            self.context,
            server_side=True,
            ssl_handshake_timeout=http.table.limits.header_timeout,
            ssl_shutdown_timeout=SHUTDOWN_TIMEOUT,
        )
        # start_tls's first step runs here and now, not in a task's first step:
        # uvloop starts reading the moment this method returns, and the
        # client's first bytes must reach the TLS protocol that this step
        # installs on the transport (it holds them until its handshake
        # starts), not this protocol, which would drop them.
        pending = upgrade.send(None)
        self.task = http.loop.create_task(self._handshake(upgrade, pending))

    async def _handshake(
        self, upgrade: Coroutine[Any, Any, asyncio.Transport | None], pending: object
    ) -> None:
        """Drive the rest of ``start_tls``, then hand the TLS transport to uvicorn."""
        http = self.http
        try:
            while True:
                if isinstance(pending, asyncio.Future):
                    try:
                        await asyncio.wait((pending,))
                    except asyncio.CancelledError:
                        pending = upgrade.throw(asyncio.CancelledError())
                        continue
                else:
                    await asyncio.sleep(0)
                pending = upgrade.send(None)
        except StopIteration as done:
            tls = done.value
        except BaseException as error:  # the handshake failed, timed out or was cancelled
            if http.raw is not None:
                http.raw.abort()
            http.table.release(http, "handshake-failed")
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        if tls is None or tls.is_closing():  # closed by the table during the handshake
            http.table.release(http, "closed")
            return
        http.connection_made(tls)

    def connection_lost(self, exc: Exception | None) -> None:
        # Only if the transport closes before start_tls takes it over.
        self.http.table.release(self.http, "closed")


def protocol_factory(
    table: ConnectionTable,
    context: ssl.SSLContext,
    protocol: type[LimitedHttpProtocol] = LimitedHttpProtocol,
) -> Callable[..., asyncio.Protocol]:
    """What uvicorn calls per accepted connection (its ``http_protocol_class``): ``protocol``
    (a :class:`LimitedHttpProtocol`) behind a :class:`TlsAcceptor`.

    Raises ConfigError, naming what is missing, if the installed uvicorn
    lacks a private hook the edge uses (:func:`webhook.edge.hooks.check`):
    serve makes this factory before it serves, so it refuses to start.
    """
    hooks.check()

    def accept(
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> asyncio.Protocol:
        http = protocol(config, server_state, app_state, _loop, table=table)
        return TlsAcceptor(http, context)

    return accept


FILE_RESERVE = 256
"""File descriptors kept beyond the connections: policy, certificates, the API client, logs."""


def raise_file_limit(max_connections: int) -> None:
    """Raise the soft open-file limit to fit ``max_connections``, as Go programs do at start.

    Container runtimes often start processes with a soft limit of 1,024; a
    server that cannot accept a socket cannot close the idle one it would
    replace either.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + FILE_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ConfigError(
            f"--max-connections {max_connections} needs {needed} open files; "
            f"the hard limit is {hard}"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
