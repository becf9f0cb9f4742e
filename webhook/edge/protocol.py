"""uvicorn's httptools protocol with the limits of a :class:`ConnectionTable`.

:class:`LimitedHttpProtocol` is uvicorn's httptools protocol plus the
header limits (HTTP 431), the milestones the table orders connections by,
the count of request-body bytes held, a bound on the pipelined requests it
parses ahead of an answer, and the answers its client does not read.

It extends uvicorn's internals, no public API: each one it uses is marked
"private hook" where it is used, and listed in :mod:`webhook.edge.hooks`,
which the server checks before it serves.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.config import Config

# uvicorn's internal modules: each name imported is a private hook.
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from mirrorgate.webhook.edge import gone
from mirrorgate.webhook.edge.connections import ConnectionTable, State

__all__ = ["MAX_CHUNKS", "LimitedHttpProtocol"]

EARLY_BYTES_MAX = 1 << 20
"""Bytes held for a connection between its handshake and its hand-over to uvicorn."""
MAX_CHUNKS = 4096
"""Chunks of one chunked body: each costs the loop a call of :meth:`LimitedHttpProtocol.on_body`,
about a microsecond, so a megabyte in 1-byte chunks held it for seconds, and one read of them
for tens of milliseconds. Ample for a client that chunks as it writes (a 7 MiB body in 4 KB
writes is 1,800 chunks); the API server sends a Content-Length."""
DRAIN_IDLE_S = 3.0
"""How long an idle keep-alive connection stays open after SIGTERM. The API server may
already be sending a review on it; closed under it, that review reads EOF, and under
``failurePolicy: Ignore`` its Pod is admitted as written. Open a moment longer, such a
review is answered, with ``Connection: close``."""
WRITE_HIGH_WATER = 64 * 1024
"""Unsent answer bytes past which the TLS transport says a client is not reading: small,
because every connection up to the limit may hold this much before the table hears of it."""


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
    (its TLS buffers with it) waited for the next full garbage collection
    instead of being freed when it closed.
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
        super().__init__(config, server_state, app_state, _loop)  # private hook
        self.table = table
        # The table's view of this connection (documented on connections.Connection).
        self.state = State.NEW
        self.since = 0.0
        self.answered = 0
        self.unsent = 0
        self.buffered = 0
        self.raw: asyncio.Transport | None = None
        """The TCP transport, until TLS replaces it as ``transport``."""
        self.reading = State.NEW
        """Where the parser is: NEW, HEAD, BODY, or IDLE between requests (``state`` is BUSY
        instead while an answer is due)."""
        self.head_bytes = 0
        """Bytes of the current request head in earlier reads."""
        self.began = False
        """Whether the current request head began in the read being parsed."""
        self.remaining = 0
        """Bytes of the current request's body still to come, if its length is known."""
        self.chunk = 0
        """Bytes of the read being parsed."""
        self.bodies: collections.deque[int] = collections.deque()
        """Body bytes held for each request parsed and not yet answered, oldest first."""
        self.fed = 0
        """Body bytes of the piece being parsed, told to the table once it is parsed."""
        self.tail = b""
        """The last bytes of a chunked body parsed (up to 3), where its end may have begun."""
        self.chunks = 0
        """Chunks of the current request's chunked body so far."""
        self.ahead = table.limits.max_pipelined + 1
        """Requests parsed and unanswered at most: one being answered, the rest queued."""
        self.refusal: tuple[int, str] | None = None
        self.early: list[bytes] = []
        """Bytes TLS delivered between the end of the handshake and :meth:`connection_made`."""
        self.after_drain: Callable[[], None] | None = None
        """The next pipelined request's start, held while the client does not read the answer
        before it: a client that does not read gets no more work done for it."""
        self.peer = ""
        """The client's address, once TCP has one (:mod:`.accept`)."""
        self.gone = asyncio.Event()
        """Set when the connection is lost: each request's scope holds it (:mod:`.gone`)."""
        self.draining = False
        """Whether the server is stopping: every answer from now on closes the connection."""

    # -- the table's view ---------------------------------------------------

    def queued(self) -> bool:
        return bool(self.pipeline or self.flow.held)  # pipeline: private hook

    def closing(self) -> bool:
        return self.transport.is_closing()

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
        self.flow = _Flow(self.transport)  # replaces uvicorn's: flow, transport: private hook
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
        cycle = self.cycle  # and its response_complete, and pipeline: private hook
        return self.ahead - len(self.pipeline) - (cycle is not None and not cycle.response_complete)

    def _feed(self, data: bytes) -> None:
        """Parse ``data`` as far as the pipelining bound allows; hold the rest, unread.

        httptools parses all it is given, every pipelined request in it
        included, and uvicorn queues each one. A request head holds at least
        two line feeds (its request line and the empty line), so bytes with
        fewer than twice the room cannot complete more heads than there is
        room for: heads are parsed at most that many line feeds at a time,
        and a read that holds fewer is parsed whole. The rest of a body of
        known length holds no head: it is parsed whole, its line feeds not
        searched. A chunked body ends with its first CRLF CRLF that is not
        data (httptools takes no bare line feed in its framing): it is parsed
        up to each CRLF CRLF in turn, its other line feeds not searched.
        """
        start, end = 0, len(data)
        while start < end:
            if self.reading is State.BODY:
                stop = (
                    min(end, start + self.remaining)
                    if self.remaining > 0
                    else self._chunked_end(data, start, end)
                )
            else:
                room = self._room()
                if room <= 0:
                    self.flow.held = data[start:] if start else data
                    self.flow.pause_reading()
                    return
                stop = start - 1
                for _ in range(2 * room - 1):
                    stop = data.find(b"\n", stop + 1)
                    if stop < 0:
                        stop = end - 1
                        break
                # At most ``room`` heads end up to and including this line feed.
                stop += 1
            piece = data if stop - start == end else data[start:stop]
            if not self._parse(piece):
                return
            if self.transport.is_closing():
                return
            if self.reading is State.BODY and self.remaining <= 0:
                self.tail = (self.tail + piece[-3:])[-3:]
            start = stop

    def _chunked_end(self, data: bytes, start: int, end: int) -> int:
        """Where the first CRLF CRLF from ``start`` on ends, the chunked body's bytes parsed
        before ``start`` included; ``end`` if there is none."""
        if self.tail:
            found = (self.tail + data[start : start + 3]).find(b"\r\n\r\n")
            if found >= 0:
                return start + found + 4 - len(self.tail)
        found = data.find(b"\r\n\r\n", start, end)
        return end if found < 0 else found + 4

    def _parse(self, data: bytes) -> bool:
        """Feed the parser; False if that closed the connection."""
        self.chunk = len(data)
        self.began = False
        try:
            self.parser.feed_data(data)  # private hook
        except httptools.HttpParserUpgrade:
            pass  # no upgrades here (WebSockets are off): answered as a plain request
        except httptools.HttpParserError:
            # Our refusals are raised from parser callbacks and arrive wrapped.
            status, message = self.refusal or (400, "Invalid HTTP request received.")
            self._reply_and_close(status, message)
            return False
        if self.fed:
            fed, self.fed = self.fed, 0
            cycle = self.cycle  # and its body and message_event: private hook
            if len(cycle.body) > HIGH_WATER_LIMIT:  # as uvicorn's on_body does, once
                self.flow.pause_reading()
            cycle.message_event.set()
            self.table.hold(self, fed)  # over the budget, this may close the connection
            if self.transport.is_closing():
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
                    STATUS_LINE[status],  # private hook
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
        self.scope["extensions"] = {gone.GONE: {"event": self.gone}}  # scope: private hook
        # A request began: the connection is no longer idle. (Not any byte:
        # the parser skips a stray CRLF between requests, and the idle
        # timer must keep running through it.)
        self._unset_keepalive_if_required()  # private hook
        self.head_bytes, self.began, self.reading = 0, True, State.HEAD
        self.bodies.append(0)
        if self.state is not State.BUSY:
            self.table.enter(self, State.HEAD)

    def on_headers_complete(self) -> None:
        limits = self.table.limits
        if len(self.headers) > limits.max_headers:  # headers, url: private hook
            self._refuse(431, f"more than {limits.max_headers} header fields")
        # Counted exactly only when the bytes read so far could hold a head
        # over the limit (a head and its body usually arrive in one read).
        if (
            self.head_bytes + self.chunk > limits.max_header_bytes
            and len(self.url) + sum(len(name) + len(value) for name, value in self.headers)
            > limits.max_header_bytes
        ):
            self._refuse(431, f"request head exceeds the {limits.max_header_bytes}-byte limit")
        self.reading, self.tail, self.chunks = State.BODY, b"", 0
        self.remaining = _content_length(self.headers)
        if self.state is not State.BUSY:
            self.table.enter(self, State.BODY)
        super().on_headers_complete()
        if self.draining:
            self.cycle.keep_alive = False  # cycle, keep_alive: private hook

    def on_body(self, body: bytes) -> None:
        """uvicorn's, less its work per call: the parser calls it once per chunk of a chunked
        body, so the flow control, the app's wake-up and the table hear of a piece's bytes
        once, after it is parsed (:meth:`_parse`). No upgrade is taken here (WebSockets are
        off), so uvicorn's check for one is not made either."""
        cycle = self.cycle  # and its response_complete and body: private hook
        if cycle.response_complete:
            return  # answered already (a refusal): the rest is dropped, as uvicorn does
        cycle.body += body
        size = len(body)
        if self.remaining:  # a length known (0 for a chunked body)
            self.remaining -= size
        else:  # a chunk, or the part of one in this piece
            self.chunks += 1
            if self.chunks > MAX_CHUNKS:
                self._refuse(
                    400,
                    f"request body sent in more than {MAX_CHUNKS:,} chunks; send it in "
                    "larger chunks, or with a Content-Length",
                )
        self.bodies[-1] += size
        self.fed += size

    def on_message_complete(self) -> None:
        self.reading, self.remaining = State.IDLE, 0
        self.state = State.BUSY  # no read deadline and no eviction while the client reads
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.answered += 1
        self.table.unbuffer(self, self.bodies.popleft() if self.bodies else None)
        if not self.pipeline:
            super().on_response_complete()
            self.table.enter(self, self.reading)  # IDLE, or a pipelined request's head or body
        else:
            # The next queued request is not started here, as uvicorn would:
            # it waits its turn behind clients that wait for their answers.
            # The pipeline, its order and the keep-alive timer: private hook.
            queued, pipeline = self.pipeline.pop(), self.pipeline
            self.pipeline = collections.deque()  # nothing queued, as uvicorn sees it
            super().on_response_complete()  # so it starts nothing, and arms the idle timer
            self.pipeline = pipeline
            self._unset_keepalive_if_required()
            if not self.transport.is_closing():
                start = functools.partial(self._start_asgi_task, *queued)  # private hook
                if self in self.table.stalled:
                    self.after_drain = start
                else:
                    self.table.defer(self, start)
        if self.flow.held and not self.transport.is_closing():
            held, self.flow.held = self.flow.held, b""
            self._feed(held)
            if not self.flow.held and not self.transport.is_closing():
                self.flow.resume_reading()

    # -- a graceful stop -------------------------------------------------------

    def shutdown(self) -> None:
        """SIGTERM (private hook): uvicorn closes an idle connection at once, under a review
        the API server may be sending on it. Such a connection stays open
        :data:`DRAIN_IDLE_S` longer instead; a request on it is answered and then closes
        it, as one in flight does."""
        self.draining = True
        cycle = self.cycle  # and its response_complete and keep_alive: private hook
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            return
        self.loop.call_later(DRAIN_IDLE_S, self._close_if_idle)  # loop: private hook

    def _close_if_idle(self) -> None:
        cycle = self.cycle
        if self.transport.is_closing() or self.pipeline:
            return
        if cycle is None or cycle.response_complete:
            self.transport.close()

    # -- answers the client does not read -------------------------------------

    def pause_writing(self) -> None:
        """The TLS transport holds more than its high-water mark: the client is not reading."""
        super().pause_writing()
        self.table.stall(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.table.unstall(self)
        start, self.after_drain = self.after_drain, None
        if start is not None and not self.transport.is_closing():
            self.table.defer(self, start)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone.set()
        if self.transport is None:
            # TLS reports a handshake that never completed (timed out, refused,
            # or the client left) before start_tls returns to the acceptor.
            self.table.release(self, "handshake-failed")
            return
        super().connection_lost(exc)
        self.table.release(self, "closed")


def _content_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The body length a head declares; 0 when it is chunked, or declares none or nonsense
    (httptools refuses a head whose length is not a number or is given twice)."""
    length = 0
    for name, value in headers:
        if name == b"transfer-encoding":
            return 0
        if name == b"content-length" and value.isdigit():
            length = int(value)
    return length
