"""webhook.background: the one way to run work in the background, and the rule that keeps it so."""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from pathlib import Path

import pytest

from mirrorgate.webhook.background import Loop, Manager, Ticker

WEBHOOK = Path(__file__).resolve().parents[2] / "webhook"

# Every way Python starts concurrent work, by the name called (or subclassed). A
# subprocess is not on the list: it is a command run to its end, not work of ours.
STARTERS = {
    "Thread": "threading.Thread",
    "Timer": "threading.Timer",
    "start_new_thread": "_thread.start_new_thread",
    "create_task": "create_task",
    "ensure_future": "ensure_future",
    "to_thread": "asyncio.to_thread",
    "run_in_executor": "run_in_executor",
    "ThreadPoolExecutor": "ThreadPoolExecutor",
    "ProcessPoolExecutor": "ProcessPoolExecutor",
    "Process": "multiprocessing.Process",
    "Pool": "multiprocessing.Pool",
    "fork": "os.fork",
}

# Where concurrent work may start besides webhook/background.py, and why it is not
# background work: each lives no longer than the request, probe or component it serves.
ALLOWED = {
    ("mirrorhealth/probes.py", "threading.Timer"): "cuts one probe's connection at its deadline",
    ("mirrorhealth/monitor.py", "ThreadPoolExecutor"): (
        "the probes of one round, at once: the monitor's pool lives and stops with the "
        "monitor (a Loop), and the commands' one-off probe pool with its `with` block"
    ),
    ("edge/accept.py", "create_task"): "one TLS handshake, within the header timeout",
    ("edge/offload.py", "ProcessPoolExecutor"): (
        "the review worker process: started and stopped by the Manager as a component"
    ),
    ("edge/offload.py", "run_in_executor"): "one large review screened, within its request",
    ("edge/app.py", "asyncio.to_thread"): "one policy review judged, within its request",
    ("kubeletcreds/tokens.py", "ensure_future"): (
        "one TokenReview per token in flight, shared by its askers; bounded by the review's "
        "timeout and the reviews' fair queue"
    ),
    ("kubeletcreds/tokens.py", "asyncio.to_thread"): (
        "one TokenReview's API call, within its timeout, four at a time (the fair queue)"
    ),
    ("edge/gone.py", "ensure_future"): (
        "a request's work and the wait for its client to leave, within the request; the "
        "work is cancelled when the client leaves first"
    ),
    ("credentials/pullsecrets.py", "asyncio.to_thread"): (
        "one admission's pull secrets, within the credential deadline"
    ),
}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _starts(tree: ast.AST) -> set[str]:
    """The ways of starting concurrent work ``tree`` calls or subclasses."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            names = [_name(node.func)]
        elif isinstance(node, ast.ClassDef):
            names = [_name(base) for base in node.bases]
        else:
            continue
        found.update(STARTERS[name] for name in names if name in STARTERS)
    return found


def test_only_background_starts_threads_and_tasks() -> None:
    starters = {}
    for path in sorted(WEBHOOK.rglob("*.py")):
        starts = _starts(ast.parse(path.read_text(encoding="utf-8")))
        if starts:
            starters[path.relative_to(WEBHOOK).as_posix()] = starts
    assert starters.pop("background.py") == {"threading.Thread", "create_task"}
    unexplained = {(module, start) for module, starts in starters.items() for start in starts}
    assert unexplained == set(ALLOWED), "start background work with webhook.background"
    # The bound: at most two modules construct a thread of their own (the
    # pools and tasks above end with their round, request or handshake).
    threads = {"background.py", *(m for m, start in unexplained if start.startswith("threading"))}
    assert len(threads) <= 2


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("threading.Thread(target=f).start()", "threading.Thread"),
        ("threading.Timer(1, f).start()", "threading.Timer"),
        ("_thread.start_new_thread(f, ())", "_thread.start_new_thread"),
        ("asyncio.get_running_loop().create_task(g())", "create_task"),
        ("asyncio.ensure_future(h)", "ensure_future"),
        ("await asyncio.to_thread(f)", "asyncio.to_thread"),
        ("await loop.run_in_executor(None, f)", "run_in_executor"),
        ("concurrent.futures.ThreadPoolExecutor(2)", "ThreadPoolExecutor"),
        ("futures.ProcessPoolExecutor()", "ProcessPoolExecutor"),
        ("multiprocessing.get_context('spawn').Process(target=f)", "multiprocessing.Process"),
        ("multiprocessing.Pool(2)", "multiprocessing.Pool"),
        ("os.fork()", "os.fork"),
        ("class Worker(threading.Thread): pass", "threading.Thread"),
        ("class Child(Process): pass", "multiprocessing.Process"),
    ],
)
def test_the_check_sees_each_way_to_start_work(source: str, found: str) -> None:
    """The negative control: the scan finds each way of starting one."""
    assert _starts(ast.parse(source)) == {found}


def test_the_check_lets_a_subprocess_be() -> None:
    tree = ast.parse("subprocess.run(['true'])\nasyncio.create_subprocess_exec('true')\n")
    assert _starts(tree) == set()


class _FakeClock:
    """The wait hook of a Loop driven from the test: a wait returns at once, saying
    whether its event was set, and is recorded as (which event, seconds)."""

    def __init__(self) -> None:
        self.waits: list[tuple[str, float]] = []
        self.events: dict[int, str] = {}

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.waits.append((self.events.get(id(event), "?"), seconds))
        return event.is_set()


def _driven(clock: _FakeClock) -> Loop:
    loop = Loop("test-driven", wait=clock.wait)
    clock.events = {id(loop._wake): "wake", id(loop._stopping): "stopping"}
    return loop


def test_a_trigger_cuts_a_sleep_short() -> None:
    clock = _FakeClock()
    loop = _driven(clock)
    assert loop.sleep(60.0) is False  # the whole wait: nothing woke it
    loop.trigger()
    assert loop.sleep(60.0) is True
    assert loop.sleep(60.0) is False, "a trigger wakes one sleep, not the next"
    assert clock.waits == [("wake", 60.0)] * 3


def test_a_pause_waits_whatever_the_triggers_but_not_for_stop() -> None:
    clock = _FakeClock()
    loop = _driven(clock)
    loop.trigger()
    assert loop.pause(60.0) is False  # waited for stopping only: the trigger did not end it
    assert clock.waits == [("stopping", 60.0)]
    assert loop.take_trigger()  # the trigger waited for the pause to end
    assert not loop.take_trigger()
    loop.stop()
    assert loop.stopping
    assert loop.pause(60.0) is True


class _Pacer(Loop):
    """Pauses a minute between passes."""

    def __init__(self) -> None:
        super().__init__("test-pacer")
        self.pausing = threading.Event()
        self.ended = threading.Event()

    def _run(self) -> None:
        while not self.stopping:
            self.pausing.set()
            self.pause(60.0)
        self.ended.set()


def test_stop_cuts_a_pause_short() -> None:
    loop = _Pacer()
    loop.start()
    assert loop.pausing.wait(5.0)
    loop.stop()
    assert loop.ended.wait(5.0)


class _Counter(Loop):
    """Counts passes; each pass ends when ``release`` is set (at once if it is)."""

    def __init__(self, *, stop_timeout: float | None = None) -> None:
        super().__init__("test-counter", stop_timeout=stop_timeout)
        self.passes = 0
        self.in_pass = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.ended = threading.Event()

    def _run(self) -> None:
        while not self.stopping:
            self.passes += 1
            self.in_pass.set()
            self.release.wait()
            self.in_pass.clear()
            self.sleep(60.0)
        self.ended.set()


def test_a_trigger_runs_a_pass_now_and_stop_ends_the_loop() -> None:
    loop = _Counter()
    loop.release.clear()
    loop.start()
    assert loop.in_pass.wait(5.0)
    loop.trigger()
    loop.release.set()
    # The trigger came during the first pass: the second follows at once, not in 60 s.
    while loop.passes < 2:
        assert not loop.ended.wait(0.005)
    loop.stop()
    assert loop.ended.wait(5.0)
    assert loop.stopping


def test_stop_waits_for_the_pass_in_hand_at_most_the_deadline() -> None:
    finishing = _Counter(stop_timeout=5.0)
    finishing.release.clear()
    finishing.start()
    assert finishing.in_pass.wait(5.0)
    threading.Timer(0.05, finishing.release.set).start()
    finishing.stop()
    assert finishing.ended.is_set()  # stop returned after the pass had ended

    stuck = _Counter(stop_timeout=0.2)
    stuck.release.clear()
    stuck.start()
    assert stuck.in_pass.wait(5.0)
    started = time.monotonic()
    stuck.stop()  # returns at its deadline though the pass goes on
    assert 0.15 < time.monotonic() - started < 2.0
    assert stuck.in_pass.is_set()
    assert not stuck.ended.is_set()
    stuck.release.set()
    assert stuck.ended.wait(5.0)


def test_a_ticker_ticks_on_the_event_loop_until_stopped() -> None:
    ticks: list[int] = []

    async def run() -> None:
        three = asyncio.Event()

        def tick() -> None:
            ticks.append(threading.get_ident())
            if len(ticks) == 3:
                three.set()

        ticker = Ticker(tick, interval=0.001, name="t")
        ticker.start()
        await three.wait()
        ticker.stop()
        stopped = len(ticks)
        while ticker.running:
            await asyncio.sleep(0)
        # The task has ended: nothing is left that could tick.
        assert len(ticks) == stopped

    asyncio.run(run())
    assert set(ticks) == {threading.get_ident()}


class _Component:
    """Records its starts and stops in a shared journal; ``on_stop`` runs as it stops."""

    def __init__(
        self, name: str, journal: list[str], *, fail: str = "", on_stop: object = None
    ) -> None:
        self.name, self.journal, self.fail, self.on_stop = name, journal, fail, on_stop
        self.release = threading.Event()
        self.release.set()
        self.stopped = threading.Event()

    def start(self) -> None:
        if self.fail == "start":
            raise RuntimeError(f"{self.name} cannot start")
        self.journal.append(f"start {self.name}")

    def stop(self) -> None:
        if callable(self.on_stop):
            self.on_stop()
        self.release.wait()
        self.journal.append(f"stop {self.name}")
        self.stopped.set()
        if self.fail == "stop":
            raise RuntimeError(f"{self.name} cannot stop")


def test_the_manager_starts_in_order_and_stops_in_reverse() -> None:
    journal: list[str] = []
    manager = Manager(deadline=5.0)
    for name in ("state", "store", "reconciler"):
        manager.add(name, _Component(name, journal))
    assert manager.names == ["state", "store", "reconciler"]
    manager.start()
    shutdown = manager.stop()
    assert journal == [
        "start state",
        "start store",
        "start reconciler",
        "stop reconciler",
        "stop store",
        "stop state",
    ]
    assert shutdown.late == ()
    assert shutdown.failed == ()
    assert manager.stop().late == (), "a second stop has nothing left to stop"
    assert len(journal) == 6


def test_a_component_is_added_once() -> None:
    manager = Manager(deadline=1.0)
    manager.add("policy", _Component("policy", []))
    with pytest.raises(ValueError, match="'policy' is already added"):
        manager.add("policy", _Component("policy", []))


def test_a_failed_start_stops_what_had_started() -> None:
    journal: list[str] = []
    manager = Manager(deadline=5.0)
    manager.add("first", _Component("first", journal))
    manager.add("broken", _Component("broken", journal, fail="start"))
    manager.add("never", _Component("never", journal))
    with pytest.raises(RuntimeError, match="broken cannot start"):
        manager.start()
    assert journal == ["start first", "stop first"]


def test_stopping_goes_on_past_a_failure_and_past_the_deadline() -> None:
    """A stop that raises is reported and the next one runs. Once the deadline has
    passed (on the test's clock: ``failing`` takes all the time there is), a stop that
    does not return is left running, reported late, and the one below it still stops."""
    journal: list[str] = []
    now = [0.0]

    def time_runs_out() -> None:
        now[0] = 100.0

    manager = Manager(deadline=10.0, clock=lambda: now[0])
    bottom = _Component("bottom", journal)
    stuck = _Component("stuck", journal)
    manager.add("bottom", bottom)
    manager.add("stuck", stuck)
    manager.add("failing", _Component("failing", journal, fail="stop", on_stop=time_runs_out))
    manager.start()
    stuck.release.clear()
    shutdown = manager.stop()
    assert shutdown.late[0] == "stuck"
    assert set(shutdown.late) <= {"stuck", "bottom"}  # bottom's stop is not waited for
    assert [(name, str(error)) for name, error in shutdown.failed] == [
        ("failing", "failing cannot stop")
    ]
    assert bottom.stopped.wait(5.0)
    assert not stuck.stopped.is_set()
    stuck.release.set()
    assert stuck.stopped.wait(5.0)
