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
  first; bodies over the body budget close the connections holding bodies
  for clients that do not read, or that pipeline, before any client that
  reads (:meth:`ConnectionTable.relieve`). A new connection over the limit
  closes one of the abuser's kind
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
from typing import Protocol

from mirrorgate.webhook.edge.limits import Limits

__all__ = ["Clock", "Connection", "ConnectionTable", "RunningLoop", "State"]

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


class Clock(Protocol):
    """The time and the timers the table runs on: an event loop, or a fake one in tests."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], object], /) -> object: ...

    def call_soon(self, callback: Callable[[], object], /) -> object: ...


class RunningLoop:
    """The :class:`Clock` of whichever event loop is running (the table is made before the
    server's loop exists, and always used on it)."""

    def time(self) -> float:
        return asyncio.get_running_loop().time()

    def call_later(self, delay: float, callback: Callable[[], object], /) -> object:
        return asyncio.get_running_loop().call_later(delay, callback)

    def call_soon(self, callback: Callable[[], object], /) -> object:
        return asyncio.get_running_loop().call_soon(callback)


class Connection(Protocol):
    """What the table knows of a connection: where it is, and how to close it."""

    state: State
    since: float
    """When the current state began (accept, first byte, end of head, end of answer)."""
    answered: int
    """Requests answered on this connection (a keep-alive client's show more than one)."""
    buffered: int
    """Request-body bytes received and not yet answered."""
    unsent: int
    """Answer bytes unsent when its client stopped reading (while the table holds it as
    stalled)."""
    peer: str
    """The client's address without its port: callers are told apart by it."""

    def queued(self) -> bool:
        """Whether pipelined requests wait behind the one being answered (parsed or not)."""
        ...

    def pending_output(self) -> int:
        """Answer bytes written and not yet sent."""
        ...

    def closing(self) -> bool: ...

    def close_for(self, reason: str) -> None:
        """Drop the connection at once, and :meth:`ConnectionTable.release` it."""
        ...


class ConnectionTable:
    """Every open connection, least recently active first, and the limits they live under."""

    def __init__(
        self,
        limits: Limits,
        *,
        on_close: Callable[[str], None] = lambda reason: None,
        clock: Clock | None = None,
    ) -> None:
        self.limits = limits
        self.clock: Clock = clock or RunningLoop()
        self.open: collections.OrderedDict[Connection, None] = collections.OrderedDict()
        self.buffered = 0
        self.stalled: dict[Connection, float] = {}
        """Connections whose client does not read its answer, by when it stopped (oldest
        first)."""
        self.unsent = 0
        """Their unsent answer bytes."""
        self.on_close = on_close
        """Called with the reason whenever the table drops a connection (for metrics)."""
        self._sweep_every = min(
            1.0, limits.header_timeout / 4, limits.body_timeout / 4, limits.write_timeout / 4
        )
        self._sweeping = False
        self.deferred: collections.deque[tuple[Connection, Callable[[], None]]] = (
            collections.deque()
        )
        """Pipelined requests waiting for their turn to start."""
        self._dispatching = False

    def admit(self, connection: Connection) -> bool:
        """Enter a new connection, closing one of the abuser's kind to make room."""
        if len(self.open) >= self.limits.max_connections:
            victim = self.victim(connection)
            if victim is None:
                self.on_close("refused")
                return False
            victim.close_for("evicted")
        connection.since = self.clock.time()
        self.open[connection] = None
        if not self._sweeping:
            self._sweeping = True
            self.clock.call_later(self._sweep_every, self._sweep)
        return True

    def enter(self, connection: Connection, state: State) -> None:
        """``connection`` reached a milestone: the most recently active now."""
        connection.state, connection.since = state, self.clock.time()
        try:  # noqa: SIM105 - contextlib.suppress costs more, three times per request
            self.open.move_to_end(connection)
        except KeyError:
            pass  # already dropped by the table

    def hold(self, connection: Connection, size: int) -> None:
        """``size`` more request-body bytes held for ``connection``; over the body budget,
        connections are closed to make room (:meth:`relieve`)."""
        connection.buffered += size
        self.buffered += size
        if self.buffered > self.limits.max_buffered_bytes:
            self.relieve(connection)

    def unbuffer(self, connection: Connection, size: int | None = None) -> None:
        """``size`` of ``connection``'s request-body bytes no longer held (None: all of them):
        a request answered frees its own body, not those of the requests pipelined after it."""
        if size is None or size > connection.buffered:
            size = connection.buffered
        self.buffered -= size
        connection.buffered -= size

    def stall(self, connection: Connection) -> None:
        """``connection``'s client stopped reading: its answer's time and bytes start to count.

        Its unsent bytes are taken now: uvicorn writes nothing more to a
        paused transport, so they can only shrink until it resumes.
        """
        if connection not in self.open or connection in self.stalled:
            return
        connection.unsent = connection.pending_output()
        self.unsent += connection.unsent
        self.stalled[connection] = self.clock.time()
        while self.unsent > self.limits.max_unsent_bytes and self.stalled:
            next(iter(self.stalled)).close_for("output-budget")

    def unstall(self, connection: Connection) -> None:
        if self.stalled.pop(connection, None) is not None:
            self.unsent -= connection.unsent
            connection.unsent = 0

    def release(self, connection: Connection, reason: str) -> None:
        """Forget a connection (again: a no-op); count why, unless the client closed it."""
        if connection not in self.open:
            return
        del self.open[connection]
        self.unbuffer(connection)
        self.unstall(connection)
        if reason != "closed":
            self.on_close(reason)

    def victim(self, newcomer: Connection) -> Connection | None:
        """The connection a newcomer over the limit replaces: the abuser's kind first.

        In this order, each kind least recently active first: a client that
        does not read its answers; one with pipelined requests waiting; a
        handshake, head or body in progress (a client that never speaks, or
        speaks slowly); an idle connection that served one request; an idle
        keep-alive connection that served more. A connection whose answer is
        being read, with nothing queued behind it, is never closed: plain
        LRU order would let a flood of fresh connections push out the one
        keep-alive client between two of its requests.
        """
        for connection in self.stalled:
            if connection is not newcomer:
                return connection
        # The first (least recently active) of each kind, best victim first.
        first: list[Connection | None] = [None, None, None, None]
        for connection in self.open:
            state = connection.state
            if state is State.BUSY:
                kind = 0 if connection.queued() else -1
            elif state is not State.IDLE:
                kind = 1
            else:
                kind = 2 if connection.answered < 2 else 3
            if kind >= 0 and first[kind] is None and connection is not newcomer:
                first[kind] = connection
                if kind == 0:
                    break
        return next((connection for connection in first if connection is not None), None)

    def defer(self, connection: Connection, start: Callable[[], None]) -> None:
        """Start a pipelined request in a later event-loop turn, a few per turn.

        Each connection answers its pipelined requests one after the other,
        but a thousand connections pipelining /metrics would otherwise start
        a thousand renders per turn, and an admission arriving meanwhile
        would wait behind all of them. Deferred, they take at most
        :data:`PIPELINED_PER_TURN` requests' time from each turn; a client
        that waits for its answers never waits behind them.
        """
        self.deferred.append((connection, start))
        if not self._dispatching:
            self._dispatching = True
            self.clock.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        for _ in range(min(PIPELINED_PER_TURN, len(self.deferred))):
            connection, start = self.deferred.popleft()
            if not connection.closing():
                start()
        self._dispatching = bool(self.deferred)
        if self._dispatching:
            self.clock.call_soon(self._dispatch)

    def relieve(self, reader: Connection) -> None:
        """Over the body budget: close the connections holding bodies, the abuser's kind first.

        In this order: a client that does not read its answers (its bodies
        wait on it, for up to the write timeout), oldest first; a client with
        pipelined requests read ahead of an answer, oldest first; then a
        connection of the caller (peer address) holding the most body bytes,
        if it holds more than ``reader``'s caller, its body read in progress
        first, else its largest; then a body read in progress, the
        longest-running first and ``reader``'s last. A client that reads its
        answers and sends one request at a time is closed only when such
        clients alone hold the budget, and then the heaviest caller's first:
        before this order, answers unread held the budget and the bodies of
        the clients that read were the ones closed, and then clients that
        each held one body waiting for the review worker (each 7 MiB, where
        the API server sends at most 3 MiB) had the API server's closed.
        """
        while self.buffered > self.limits.max_buffered_bytes:
            holder = self._holder(reader)
            holder.close_for("body-budget")
            if holder is reader:
                return

    def _holder(self, reader: Connection) -> Connection:
        """The connection :meth:`relieve` closes next (``reader`` when no other holds a body)."""
        for connection in self.stalled:
            if connection.buffered:
                return connection
        body_read = None
        by_caller: dict[str, int] = {}
        for connection in self.open:
            if not connection.buffered:
                continue
            if connection.state is State.BUSY and connection.queued():
                return connection
            if body_read is None and connection is not reader and connection.state is State.BODY:
                body_read = connection
            by_caller[connection.peer] = by_caller.get(connection.peer, 0) + connection.buffered
        heaviest = max(by_caller, key=by_caller.__getitem__, default=reader.peer)
        if by_caller.get(heaviest, 0) > by_caller.get(reader.peer, 0):
            return self._heaviest_holder(heaviest)
        return body_read or reader

    def _heaviest_holder(self, peer: str) -> Connection:
        """``peer``'s connection to close: its oldest body read in progress, else the one
        holding the most."""
        held = [c for c in self.open if c.peer == peer and c.buffered]
        reading = [c for c in held if c.state is State.BODY]
        return reading[0] if reading else max(held, key=lambda c: c.buffered)

    def _sweep(self) -> None:
        """Close connections whose head or body is late, or whose answer waits unread too
        long (every second or so, while any is open)."""
        now = self.clock.time()
        limits = self.limits
        shortest = min(limits.header_timeout, limits.body_timeout)
        late: list[tuple[Connection, str]] = []
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
        self._sweeping = bool(self.open)
        if self._sweeping:
            self.clock.call_later(self._sweep_every, self._sweep)
