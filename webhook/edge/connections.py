"""Bounded connections: how many, how long they may dawdle, and which one goes first.

uvicorn's httptools protocol has no limit on connections, header size or
header count, no header-read or body-read timeout, and starts its keep-alive
timer only after a first response, so a client that connects and says
nothing is kept forever. Everything a client can make the server hold is
bounded by :mod:`webhook.edge.protocol` and :mod:`webhook.edge.accept`,
around uvicorn's own protocol, under the table here:

- :class:`ConnectionTable` holds every open connection, least recently
  active first. A sweep closes connections whose request head or body is
  late, or whose answer has waited unread past the write timeout; answers
  unread over the output budget close the connections that stopped reading
  first. A new connection over the limit closes one of the abuser's kind
  (:meth:`ConnectionTable.victim`), never one whose answer is being taken.
  Idle and pinned clients therefore never lock the API server out: its next
  connection takes the place of one of theirs.

Idle keep-alive connections are closed by uvicorn's own keep-alive timer,
set to the idle timeout and stopped only when a request begins.
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from mirrorgate.webhook.edge.limits import Limits

if TYPE_CHECKING:
    from mirrorgate.webhook.edge.protocol import LimitedHttpProtocol

__all__ = ["ConnectionTable", "State"]

PIPELINED_PER_TURN = 4
"""Pipelined requests started per event-loop turn, across all connections (see
:meth:`ConnectionTable.defer`)."""


class State(enum.IntEnum):
    NEW = 0
    """Accepted; TLS handshake or the first request's first byte still to come."""
    HEAD = 1
    """Reading a request line and headers."""
    BODY = 2
    """Reading a request body."""
    BUSY = 3
    """A request is complete and being answered (pipelined ones may follow): closed by the
    table only when its client stops reading the answer."""
    IDLE = 4
    """Answered; waiting for the next request (uvicorn's keep-alive timer runs)."""


class ConnectionTable:
    """Every open connection, least recently active first, and the limits they live under."""

    def __init__(
        self, limits: Limits, *, on_close: Callable[[str], None] = lambda reason: None
    ) -> None:
        self.limits = limits
        self.open: collections.OrderedDict[LimitedHttpProtocol, None] = collections.OrderedDict()
        self.buffered = 0
        self.stalled: dict[LimitedHttpProtocol, float] = {}
        """Connections whose client does not read its answer, by when it stopped (oldest
        first)."""
        self.unsent = 0
        """Their unsent answer bytes."""
        self.on_close = on_close
        """Called with the reason whenever the table drops a connection (for metrics)."""
        self._sweep_every = min(
            1.0, limits.header_timeout / 4, limits.body_timeout / 4, limits.write_timeout / 4
        )
        self._sweeper: asyncio.TimerHandle | None = None
        self.deferred: collections.deque[
            tuple[LimitedHttpProtocol, RequestResponseCycle, ASGI3Application]
        ] = collections.deque()
        """Pipelined requests waiting for their turn to start."""
        self._dispatcher: asyncio.Handle | None = None

    def admit(self, connection: LimitedHttpProtocol) -> bool:
        """Enter a new connection, closing one of the abuser's kind to make room."""
        if len(self.open) >= self.limits.max_connections:
            victim = self.victim(connection)
            if victim is None:
                self.on_close("refused")
                return False
            victim.close_for("evicted")
        self.open[connection] = None
        if self._sweeper is None:
            self._sweeper = connection.loop.call_later(
                self._sweep_every, self._sweep, connection.loop
            )
        return True

    def unbuffer(self, connection: LimitedHttpProtocol) -> None:
        self.buffered -= connection.buffered
        connection.buffered = 0

    def stall(self, connection: LimitedHttpProtocol) -> None:
        """``connection``'s client stopped reading: its answer's time and bytes start to count.

        Its unsent bytes are taken now: uvicorn writes nothing more to a
        paused transport, so they can only shrink until it resumes.
        """
        if connection not in self.open or connection in self.stalled:
            return
        connection.unsent = connection.pending_output()
        self.unsent += connection.unsent
        self.stalled[connection] = connection.loop.time()
        while self.unsent > self.limits.max_unsent_bytes and self.stalled:
            next(iter(self.stalled)).close_for("output-budget")

    def unstall(self, connection: LimitedHttpProtocol) -> None:
        if self.stalled.pop(connection, None) is not None:
            self.unsent -= connection.unsent
            connection.unsent = 0

    def release(self, connection: LimitedHttpProtocol, reason: str) -> None:
        """Forget a connection (again: a no-op); count why, unless the client closed it."""
        if connection not in self.open:
            return
        del self.open[connection]
        self.unbuffer(connection)
        self.unstall(connection)
        if reason != "closed":
            self.on_close(reason)

    def victim(self, newcomer: LimitedHttpProtocol) -> LimitedHttpProtocol | None:
        """The connection a newcomer over the limit replaces: the abuser's kind first.

        In this order, each kind least recently active first: a client that
        does not read its answers; one with pipelined requests waiting; a
        handshake, head or body in progress (a client that never speaks, or
        speaks slowly); an idle connection that served one request; an idle
        keep-alive connection that served more. A connection whose answer is
        being read, with nothing queued behind it, is never closed. Plain LRU
        order let a flood of fresh connections push out the one keep-alive
        client between two of its requests.
        """
        for connection in self.stalled:
            if connection is not newcomer:
                return connection
        # The first (least recently active) of each kind, best victim first.
        first: list[LimitedHttpProtocol | None] = [None, None, None, None]
        for connection in self.open:
            state = connection.state
            if state is State.BUSY:
                kind = 0 if connection.pipeline or connection.flow.held else -1
            elif state is not State.IDLE:
                kind = 1
            else:
                kind = 2 if connection.answered < 2 else 3
            if kind >= 0 and first[kind] is None and connection is not newcomer:
                first[kind] = connection
                if kind == 0:
                    break
        return next((connection for connection in first if connection is not None), None)

    def defer(
        self, connection: LimitedHttpProtocol, cycle: RequestResponseCycle, app: ASGI3Application
    ) -> None:
        """Start a pipelined request in a later event-loop turn, a few per turn.

        Each connection answers its pipelined requests one after the other,
        but a thousand connections pipelining /metrics would otherwise start
        a thousand renders per turn, and an admission arriving meanwhile
        would wait behind all of them. Deferred, they take at most
        :data:`PIPELINED_PER_TURN` requests' time from each turn; a client
        that waits for its answers never waits behind them.
        """
        self.deferred.append((connection, cycle, app))
        if self._dispatcher is None:
            self._dispatcher = connection.loop.call_soon(self._dispatch, connection.loop)

    def _dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._dispatcher = None
        for _ in range(min(PIPELINED_PER_TURN, len(self.deferred))):
            connection, cycle, app = self.deferred.popleft()
            if not connection.transport.is_closing():
                HttpToolsProtocol._start_asgi_task(connection, cycle, app)
        if self.deferred:
            self._dispatcher = loop.call_soon(self._dispatch, loop)

    def relieve(self, reader: LimitedHttpProtocol) -> None:
        """Over the body budget: close the longest-running body reads, ``reader``'s last."""
        while self.buffered > self.limits.max_buffered_bytes:
            oldest = next(
                (
                    connection
                    for connection in self.open
                    if connection is not reader and connection.state is State.BODY
                ),
                reader,
            )
            oldest.close_for("body-budget")
            if oldest is reader:
                return

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close connections whose head or body is late (every second or so)."""
        self._sweeper = None
        now = loop.time()
        limits = self.limits
        shortest = min(limits.header_timeout, limits.body_timeout)
        late: list[tuple[LimitedHttpProtocol, str]] = []
        for connection in self.open:  # oldest milestone first
            waited = now - connection.since
            if waited <= shortest:
                break  # everyone after this one has waited less
            state = connection.state
            if state in (State.NEW, State.HEAD) and waited > limits.header_timeout:
                late.append((connection, "header-timeout"))
            elif state is State.BODY and waited > limits.body_timeout:
                late.append((connection, "body-timeout"))
        for connection, stopped in self.stalled.items():  # stopped reading first, first
            if now - stopped <= limits.write_timeout:
                break
            late.append((connection, "write-timeout"))
        for connection, reason in late:
            connection.close_for(reason)
        if self.open:
            self._sweeper = loop.call_later(self._sweep_every, self._sweep, loop)
