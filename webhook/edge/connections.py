"""Bounded connections: how many, how big their request heads, how long they may dawdle.

uvicorn's httptools protocol has no limit on connections, header size or
header count, no header-read or body-read timeout, and starts its keep-alive
timer only after a first response, so a client that connects and says
nothing is kept forever. Everything a client can make the server hold is
bounded here, around uvicorn's own protocol:

- :class:`TlsAcceptor`, one per accepted TCP connection, enters the
  connection in the :class:`ConnectionTable` at once, before the TLS
  handshake (a client that never starts TLS holds memory too), and upgrades
  it with ``loop.start_tls`` within the header timeout.
- :class:`LimitedHttpProtocol` is uvicorn's httptools protocol plus the
  header limits (HTTP 431), the milestones the table orders connections by,
  the count of request-body bytes held, a bound on the pipelined requests it
  parses ahead of an answer, and the answers its client does not read.
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
import resource
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, cast

import httptools
from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from mirrorgate.webhook.edge.limits import Limits
from mirrorgate.webhook.errors import ConfigError

__all__ = [
    "ConnectionTable",
    "LimitedHttpProtocol",
    "TlsAcceptor",
    "protocol_factory",
    "raise_file_limit",
]

EARLY_BYTES_MAX = 1 << 20
"""Bytes held for a connection between its handshake and its hand-over to uvicorn."""
SHUTDOWN_TIMEOUT = 2.0
"""Seconds a closing TLS connection waits for the peer's close_notify (asyncio's default: 30)."""
PIPELINED_PER_TURN = 4
"""Pipelined requests started per event-loop turn, across all connections (see
:meth:`ConnectionTable.defer`)."""
WRITE_HIGH_WATER = 64 * 1024
"""Unsent answer bytes past which the TLS transport says a client is not reading (uvloop's
default, 512 KiB, would let 1,024 connections hold half a gigabyte before anyone noticed)."""


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


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request the limits refuse."""


class _Flow(FlowControl):
    """uvicorn's flow control, which also holds the bytes received and not yet parsed, and
    keeps reading paused while it does.

    uvicorn resumes reading whenever an answer completes or the app asks for
    the body; bytes that a connection may not parse yet (its pipelining bound
    is reached) must first be parsed, or they would pile up behind the bound.
    The bytes are kept here so that this needs no reference back to its
    connection: with one, the two made a cycle, and every closed connection
    (its TLS buffers with it) waited for the next full garbage collection.
    After 1,000 idle connections closed, a flood of large reviews then found
    none of their memory free to reuse, and the heap grew by 15 MB more.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__(transport)
        self.held = b""
        """Bytes received and not parsed: pipelined requests beyond the bound, for later."""

    def resume_reading(self) -> None:
        if not self.held:
            super().resume_reading()


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of a :class:`ConnectionTable`."""

    flow: _Flow

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        table: ConnectionTable,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.table = table
        self.state = State.NEW
        self.since = self.loop.time()
        """When the current state began (accept, first byte, end of head, end of answer)."""
        self.raw: asyncio.Transport | None = None
        """The TCP transport, until TLS replaces it as ``transport``."""
        self.reading = State.NEW
        """Where the parser is: NEW, HEAD, BODY, or IDLE between requests (``state`` is BUSY
        instead while an answer is due)."""
        self.head_bytes = 0
        """Bytes of the current request head in earlier reads."""
        self.began = False
        """Whether the current request head began in the read being parsed."""
        self.chunk = 0
        """Bytes of the read being parsed."""
        self.ahead = table.limits.max_pipelined + 1
        """Requests parsed and unanswered at most: one being answered, the rest queued."""
        self.answered = 0
        """Requests answered on this connection (a keep-alive client's show more than one)."""
        self.unsent = 0
        """Answer bytes unsent when its client stopped reading (while the table holds it as
        stalled)."""
        self.buffered = 0
        """Request-body bytes received and not yet answered."""
        self.refusal: tuple[int, str] | None = None
        self.early: list[bytes] = []
        """Bytes TLS delivered between the end of the handshake and :meth:`connection_made`."""

    # -- the table's view ---------------------------------------------------

    def _enter(self, state: State) -> None:
        self.state, self.since = state, self.loop.time()
        try:  # noqa: SIM105 - contextlib.suppress costs more, three times per request
            self.table.open.move_to_end(self)
        except KeyError:
            pass  # already dropped by the table

    def close_for(self, reason: str) -> None:
        """Drop the connection at once (no TLS close_notify): a timeout or an eviction."""
        transport = self.transport or self.raw
        if transport is not None:
            transport.abort()
        self.table.release(self, reason)

    # -- parsing, with the limits --------------------------------------------

    def pending_output(self) -> int:
        """Answer bytes written and not yet sent, in the TLS and the TCP transport."""
        raw = self.raw.get_write_buffer_size() if self.raw is not None else 0
        return self.transport.get_write_buffer_size() + raw

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self.flow = _Flow(self.transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        early, self.early = self.early, []
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            # The TLS protocol passes on a request as soon as its handshake
            # is done, a loop iteration before start_tls returns its transport.
            self.early.append(data)
            if sum(map(len, self.early)) > EARLY_BYTES_MAX:
                self.close_for("header-limit")
            return
        if self.flow.held:  # reading resumed by someone else: this waits its turn too
            self.flow.held += data
            self.flow.pause_reading()
            return
        self._feed(data)

    def _room(self) -> int:
        """Requests that may still be parsed: the bound, less those parsed and unanswered
        (one being answered, the rest queued)."""
        cycle = self.cycle
        return self.ahead - len(self.pipeline) - (cycle is not None and not cycle.response_complete)

    def _feed(self, data: bytes) -> None:
        """Parse ``data`` as far as the pipelining bound allows; hold the rest, unread.

        httptools parses all it is given, every pipelined request in it
        included, and uvicorn queues each one. A request head holds at least
        two line feeds (its request line and the empty line), so bytes with
        fewer than twice the room cannot complete more heads than there is
        room for: every read of a client that waits for its answers is
        parsed whole. (Its line feeds are all in its head, at the start: one
        ``rfind`` over the body and a count over the head decide it, where
        a count of the whole read would cost five times an admission's
        parsing on a 60 KB body.) Others are parsed a few lines at a time.
        """
        room = self._room()
        last = data.rfind(b"\n")
        if last < 0 or data.count(b"\n", 0, last) < 2 * room - 1:
            self._parse(data)
            return
        start = 0
        while room > 0:
            stop = start - 1
            for _ in range(2 * room - 1):
                stop = data.find(b"\n", stop + 1)
                if stop < 0:
                    if start < len(data):
                        self._parse(data[start:] if start else data)
                    return
            # At most ``room`` heads end up to and including this line feed.
            if not self._parse(data[start : stop + 1]) or self.transport.is_closing():
                return
            start = stop + 1
            room = self._room()
        if start < len(data):
            self.flow.held = data[start:]
            self.flow.pause_reading()

    def _parse(self, data: bytes) -> bool:
        """Feed the parser; False if that closed the connection."""
        self.chunk = len(data)
        self.began = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no upgrades here (WebSockets are off): answered as a plain request
        except httptools.HttpParserError:
            # Our refusals are raised from parser callbacks and arrive wrapped.
            status, message = self.refusal or (400, "Invalid HTTP request received.")
            self._reply_and_close(status, message)
            return False
        if self.reading is State.HEAD and not self.began:
            # A head that goes on over reads: each read after its first is all
            # head. Its first read may also hold earlier requests, so its part
            # there is not known; it is counted from the next read on (or
            # exactly, once complete).
            self.head_bytes += self.chunk
            if self.head_bytes > self.table.limits.max_header_bytes:
                self._reply_and_close(
                    431, f"request head exceeds the {self.table.limits.max_header_bytes}-byte limit"
                )
                return False
        return True

    def _reply_and_close(self, status: int, message: str) -> None:
        payload = message.encode("ascii")
        self.transport.write(
            b"".join(
                (
                    STATUS_LINE[status],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: ",
                    str(len(payload)).encode("ascii"),
                    b"\r\n",
                    b"connection: close\r\n\r\n",
                    payload,
                )
            )
        )
        self.transport.close()
        self.table.release(self, "header-limit" if status == 431 else "bad-request")

    def _refuse(self, status: int, message: str) -> None:
        self.refusal = (status, message)
        raise _Refused(message)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # A request began: the connection is no longer idle. (Not any byte:
        # the parser skips a stray CRLF between requests, and the idle
        # timer must keep running through it.)
        self._unset_keepalive_if_required()
        self.head_bytes, self.began, self.reading = 0, True, State.HEAD
        if self.state is not State.BUSY:
            self._enter(State.HEAD)

    def on_headers_complete(self) -> None:
        limits = self.table.limits
        if len(self.headers) > limits.max_headers:
            self._refuse(431, f"more than {limits.max_headers} header fields")
        # Counted exactly only when the bytes read so far could hold a head
        # over the limit (a head and its body usually arrive in one read).
        if (
            self.head_bytes + self.chunk > limits.max_header_bytes
            and len(self.url) + sum(len(name) + len(value) for name, value in self.headers)
            > limits.max_header_bytes
        ):
            self._refuse(431, f"request head exceeds the {limits.max_header_bytes}-byte limit")
        self.reading = State.BODY
        if self.state is not State.BUSY:
            self._enter(State.BODY)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self.buffered += size
        self.table.buffered += size
        super().on_body(body)
        if self.table.buffered > self.table.limits.max_buffered_bytes:
            self.table.relieve(self)

    def on_message_complete(self) -> None:
        self.reading = State.IDLE
        self.state = State.BUSY  # no read deadline and no eviction while the client reads
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.answered += 1
        self.table.unbuffer(self)
        if not self.pipeline:
            super().on_response_complete()
            self._enter(self.reading)  # IDLE, or a pipelined request's head or body
        else:
            # The next queued request is not started here, as uvicorn would:
            # it waits its turn behind clients that wait for their answers.
            queued, pipeline = self.pipeline.pop(), self.pipeline
            self.pipeline = collections.deque()  # nothing queued, as uvicorn sees it
            super().on_response_complete()  # so it starts nothing, and arms the idle timer
            self.pipeline = pipeline
            self._unset_keepalive_if_required()
            if not self.transport.is_closing():
                self.table.defer(self, *queued)
        if self.flow.held and not self.transport.is_closing():
            held, self.flow.held = self.flow.held, b""
            self._feed(held)
            if not self.flow.held and not self.transport.is_closing():
                self.flow.resume_reading()

    # -- answers the client does not read -------------------------------------

    def pause_writing(self) -> None:
        """The TLS transport holds more than its high-water mark: the client is not reading."""
        super().pause_writing()
        self.table.stall(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.table.unstall(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            # TLS reports a handshake that never completed (timed out, refused,
            # or the client left) before start_tls returns to the acceptor.
            self.table.release(self, "handshake-failed")
            return
        super().connection_lost(exc)
        self.table.release(self, "closed")


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
        if not http.table.admit(http):
            raw.abort()
            return
        upgrade = http.loop.start_tls(
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
    table: ConnectionTable, context: ssl.SSLContext
) -> Callable[..., asyncio.Protocol]:
    """What uvicorn calls per accepted connection (its ``http_protocol_class``)."""

    def accept(
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> asyncio.Protocol:
        http = LimitedHttpProtocol(config, server_state, app_state, _loop, table=table)
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
