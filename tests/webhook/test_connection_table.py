"""webhook.edge.connections: the connection table's eviction policy, budgets and sweep.

The table is pure: these drive it with a fake clock and connections that are
records, so every timeout is crossed exactly and nothing waits. The real
server under abuse is tests/webhook/test_limits.py.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
from collections.abc import Callable

import pytest

from mirrorgate.webhook.edge.connections import PIPELINED_PER_TURN, ConnectionTable, State
from mirrorgate.webhook.edge.limits import Limits

LIMITS = Limits(
    max_connections=4,
    header_timeout=10.0,
    body_timeout=20.0,
    write_timeout=8.0,
    max_buffered_bytes=1000,
    max_unsent_bytes=1000,
)


class FakeClock:
    """An event loop's time and timers, advanced by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self._timers: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()
        self.soon: list[Callable[[], object]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], object], /) -> None:
        heapq.heappush(self._timers, (self.now + delay, next(self._order), callback))

    def call_soon(self, callback: Callable[[], object], /) -> None:
        self.soon.append(callback)

    def timers(self) -> int:
        return len(self._timers)

    def advance(self, seconds: float) -> None:
        """Move time on, running each timer due on the way at its own time."""
        end = self.now + seconds
        while self._timers and self._timers[0][0] <= end:
            when, _, callback = heapq.heappop(self._timers)
            self.now = when
            callback()
        self.now = end

    def turn(self) -> None:
        """One event-loop turn: what was scheduled soon before it began."""
        ready, self.soon = self.soon, []
        for callback in ready:
            callback()


@dataclasses.dataclass(eq=False)
class Record:
    """A connection as the table sees it; closing it releases it, as the protocol does."""

    table: ConnectionTable
    name: str
    state: State = State.NEW
    since: float = 0.0
    answered: int = 0
    buffered: int = 0
    unsent: int = 0
    waiting: bool = False
    """Pipelined requests queued behind the answer."""
    peer: str = "127.0.0.1"
    output: int = 0
    closed: str | None = None

    def queued(self) -> bool:
        return self.waiting

    def pending_output(self) -> int:
        return self.output

    def closing(self) -> bool:
        return self.closed is not None

    def close_for(self, reason: str) -> None:
        self.closed = reason
        self.table.release(self, reason)

    def __repr__(self) -> str:
        return self.name


@dataclasses.dataclass
class World:
    clock: FakeClock
    table: ConnectionTable
    dropped: list[str]

    def connect(self, name: str, state: State = State.NEW, **fields: object) -> Record:
        record = Record(self.table, name)
        assert self.table.admit(record), f"{name} was refused"
        if state is not State.NEW:
            self.table.enter(record, state)
        for field, value in fields.items():
            setattr(record, field, value)
        return record


def world(limits: Limits = LIMITS) -> World:
    clock, dropped = FakeClock(), list[str]()
    return World(clock, ConnectionTable(limits, on_close=dropped.append, clock=clock), dropped)


def evictions(w: World, count: int) -> list[str]:
    """The names of the connections ``count`` newcomers replace, in order."""
    evicted = []
    for i in range(count):
        before = set(w.table.open)
        w.connect(f"newcomer{i}", State.BUSY)  # never a victim itself
        (gone,) = before - set(w.table.open)
        assert isinstance(gone, Record)
        assert gone.closed == "evicted"
        evicted.append(gone.name)
    return evicted


def test_victims_go_by_kind_the_abusers_first() -> None:
    """Not reading, then queued requests, then mid-request, then idle once, then keep-alive."""
    w = world(dataclasses.replace(LIMITS, max_connections=7))
    w.connect("keep-alive", State.IDLE, answered=5)
    w.connect("idle", State.IDLE, answered=1)
    w.connect("body", State.BODY)
    w.connect("queued", State.BUSY, waiting=True)
    unread = w.connect("unread", State.BUSY, output=10)
    w.connect("handshake")
    w.connect("answering", State.BUSY)
    w.table.stall(unread)
    assert evictions(w, 6) == ["unread", "queued", "body", "handshake", "idle", "keep-alive"]
    assert w.dropped == ["evicted"] * 6


def test_a_connection_being_answered_is_never_evicted() -> None:
    w = world()
    answering = [w.connect(f"answering{i}", State.BUSY) for i in range(LIMITS.max_connections)]
    newcomer = Record(w.table, "newcomer")
    assert not w.table.admit(newcomer)
    assert w.dropped == ["refused"]
    assert list(w.table.open) == answering
    assert all(record.closed is None for record in answering)


def test_within_a_kind_the_least_recently_active_goes_first() -> None:
    w = world()
    first = w.connect("first", State.IDLE)
    w.connect("second", State.IDLE)
    w.connect("third", State.IDLE)
    w.connect("fourth", State.BUSY)
    w.clock.advance(1)
    w.table.enter(first, State.IDLE)  # a milestone moves it to the back
    assert evictions(w, 3) == ["second", "third", "first"]


def test_a_newcomer_is_never_its_own_victim() -> None:
    w = world(dataclasses.replace(LIMITS, max_connections=1))
    stalled = w.connect("stalled", State.BUSY, output=1)
    w.table.stall(stalled)
    assert w.table.victim(stalled) is None


def test_bodies_over_the_budget_close_the_oldest_readers_the_reader_last() -> None:
    w = world()
    oldest = w.connect("oldest", State.BODY)
    idle = w.connect("idle", State.IDLE)
    younger = w.connect("younger", State.BODY)
    reader = w.connect("reader", State.BODY)
    w.table.hold(oldest, 400)
    w.table.hold(younger, 400)
    assert w.table.buffered == 800
    assert not w.dropped
    w.table.hold(reader, 300)  # 1,100: the oldest body read goes
    assert (oldest.closed, younger.closed, reader.closed, idle.closed) == (
        "body-budget",
        None,
        None,
        None,
    )
    assert w.table.buffered == 700
    w.table.hold(reader, 800)  # 1,500: the younger goes, and that is not enough
    assert (younger.closed, reader.closed) == ("body-budget", "body-budget")
    assert w.table.buffered == 0
    assert idle.closed is None
    assert w.dropped == ["body-budget"] * 3


def test_bodies_over_the_budget_close_clients_that_do_not_read_or_pipeline_first() -> None:
    """Issue 29, 1: bodies held for unread answers and pipelined requests go before any body
    read by a client that reads its answers, the reader's own included."""
    w = world(dataclasses.replace(LIMITS, max_connections=6))
    reading = w.connect("reading", State.BODY)
    pipelining = w.connect("pipelining", State.BUSY, waiting=True)
    unread_empty = w.connect("unread-empty", State.BUSY, output=10)
    unread = w.connect("unread", State.BUSY, output=10)
    answering = w.connect("answering", State.BUSY)
    reader = w.connect("reader", State.BODY)
    w.table.stall(unread_empty)  # holds no body: closing it would free nothing
    w.table.hold(reading, 200)
    w.table.hold(answering, 200)
    w.table.hold(pipelining, 300)
    w.table.hold(unread, 250)
    w.table.stall(unread)
    assert not w.dropped
    w.table.hold(reader, 200)  # 1,150: the unread answer's body goes
    assert [r.name for r in (unread, pipelining) if r.closed] == ["unread"]
    w.table.hold(reader, 300)  # 1,200: the pipelined requests' bodies go
    assert pipelining.closed == "body-budget"
    assert (reading.closed, reader.closed, answering.closed, unread_empty.closed) == (None,) * 4
    assert w.table.buffered == 900
    w.table.hold(reader, 200)  # 1,100: now, and only now, a client that reads
    assert (reading.closed, reader.closed) == ("body-budget", None)
    assert w.dropped == ["body-budget"] * 3


def test_an_answer_frees_the_bodies_it_held() -> None:
    w = world()
    reader = w.connect("reader", State.BODY)
    w.table.hold(reader, 600)
    w.table.unbuffer(reader)
    assert (w.table.buffered, reader.buffered) == (0, 0)
    w.table.hold(reader, 900)
    assert reader.closed is None


def test_unread_answers_over_the_output_budget_close_the_first_to_stop_reading() -> None:
    w = world()
    first = w.connect("first", State.BUSY, output=400)
    second = w.connect("second", State.BUSY, output=400)
    third = w.connect("third", State.BUSY, output=400)
    for record in (first, second):
        w.table.stall(record)
    assert w.table.unsent == 800
    w.table.stall(third)
    assert (first.closed, second.closed, third.closed) == ("output-budget", None, None)
    assert w.table.unsent == 800
    w.table.unstall(second)  # it read again
    assert (w.table.unsent, second.unsent) == (400, 0)
    assert list(w.table.stalled) == [third]


def test_stalling_counts_once_and_only_open_connections() -> None:
    w = world()
    record = w.connect("record", State.BUSY, output=300)
    w.table.stall(record)
    record.output = 900
    w.table.stall(record)  # already counted: its bytes can only shrink
    assert w.table.unsent == 300
    gone = Record(w.table, "gone", output=100)
    w.table.stall(gone)
    assert w.table.unsent == 300
    assert gone not in w.table.stalled


def test_the_sweep_closes_late_heads_and_bodies_and_unread_answers() -> None:
    w = world(dataclasses.replace(LIMITS, max_connections=10))
    handshake = w.connect("handshake")
    head = w.connect("head", State.HEAD)
    body = w.connect("body", State.BODY)
    idle = w.connect("idle", State.IDLE)
    answering = w.connect("answering", State.BUSY)
    unread = w.connect("unread", State.BUSY, output=10)
    w.table.stall(unread)
    w.clock.advance(LIMITS.write_timeout)  # not late yet: the limits are exclusive
    assert not w.dropped
    w.clock.advance(1.0)
    assert unread.closed == "write-timeout"
    w.clock.advance(LIMITS.header_timeout - LIMITS.write_timeout)
    assert (handshake.closed, head.closed) == ("header-timeout", "header-timeout")
    assert body.closed is None
    w.clock.advance(LIMITS.body_timeout - LIMITS.header_timeout)
    assert body.closed == "body-timeout"
    w.clock.advance(1000)
    assert (idle.closed, answering.closed) == (None, None)  # uvicorn's timer, and the client's
    assert w.dropped == ["write-timeout", "header-timeout", "header-timeout", "body-timeout"]


def test_the_sweep_runs_a_few_times_per_shortest_timeout_and_stops_when_all_are_closed() -> None:
    w = world()
    late = w.connect("late")
    assert w.clock.timers() == 1
    # The header timeout (10 s) is crossed at most a quarter of it (here: the 1 s cap) late.
    w.clock.advance(LIMITS.header_timeout + 1.0)
    assert late.closed == "header-timeout"
    assert w.clock.timers() == 0, "the sweep goes on with nothing open"
    w.connect("next")
    assert w.clock.timers() == 1


def test_a_milestone_restarts_the_clock() -> None:
    w = world()
    head = w.connect("head", State.HEAD)
    w.clock.advance(LIMITS.header_timeout - 1)
    w.table.enter(head, State.BODY)
    w.clock.advance(LIMITS.body_timeout - 1)
    assert head.closed is None
    w.clock.advance(2)
    assert head.closed == "body-timeout"


def test_pipelined_requests_start_a_few_per_turn_in_order_skipping_closed_ones() -> None:
    w = world()
    busy = w.connect("busy", State.BUSY)
    gone = w.connect("gone", State.BUSY)
    started: list[int] = []
    for i in range(2 * PIPELINED_PER_TURN + 1):
        w.table.defer(gone if i == 1 else busy, functools.partial(started.append, i))
    gone.close_for("evicted")
    w.clock.turn()
    assert started == [0, *range(2, PIPELINED_PER_TURN)]
    w.clock.turn()
    w.clock.turn()
    assert started == [0, *range(2, 2 * PIPELINED_PER_TURN + 1)]
    assert not w.clock.soon, "the dispatcher goes on with nothing deferred"


def test_release_forgets_once_and_counts_all_but_the_clients_own_close() -> None:
    w = world()
    record = w.connect("record", State.BODY)
    w.table.hold(record, 10)
    w.table.release(record, "closed")
    w.table.release(record, "evicted")
    assert not w.table.open
    assert w.table.buffered == 0
    assert w.dropped == []


@pytest.mark.parametrize("kind", ["stall", "hold"])
def test_a_released_connection_leaves_no_bytes_counted(kind: str) -> None:
    w = world()
    record = w.connect("record", State.BUSY, output=200)
    if kind == "stall":
        w.table.stall(record)
    else:
        w.table.hold(record, 200)
    w.table.release(record, "closed")
    assert (w.table.unsent, w.table.buffered, w.table.stalled) == (0, 0, {})
