"""webhook.background: the one way to run work in the background, and the rule that keeps it so."""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from pathlib import Path

from mirrorgate.webhook.background import Loop, Ticker

WEBHOOK = Path(__file__).resolve().parents[2] / "webhook"

# Where a thread or a task may start besides webhook/background.py, and why it
# is not background work: each lives no longer than the request or probe it serves.
ALLOWED = {
    ("mirrorhealth/probes.py", "threading.Timer"): "cuts one probe's connection at its deadline",
    ("edge/accept.py", "create_task"): "one TLS handshake, within the header timeout",
}


def _starts(tree: ast.AST) -> set[str]:
    """The thread constructors and task spawners ``tree`` calls."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (
            func.attr
            if isinstance(func, ast.Attribute)
            else func.id
            if isinstance(func, ast.Name)
            else ""
        )
        if name in ("Thread", "Timer"):
            found.add(f"threading.{name}")
        elif name in ("create_task", "ensure_future", "start_new_thread"):
            found.add(name)
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
    # The bound: at most two modules construct a thread (the handshake
    # task is no thread and ends with its handshake).
    threads = {"background.py", *(m for m, start in unexplained if start.startswith("threading"))}
    assert len(threads) <= 2


def test_the_check_sees_a_thread() -> None:
    """The negative control: the scan finds each way of starting one."""
    tree = ast.parse(
        "import threading, asyncio\nthreading.Thread(target=f).start()\n"
        "asyncio.get_running_loop().create_task(g())\nasyncio.ensure_future(h)\n"
    )
    assert _starts(tree) == {"threading.Thread", "create_task", "ensure_future"}


class _Counter(Loop):
    """Counts passes; sleeps ``interval`` between them, or pauses when ``pacing``."""

    def __init__(
        self,
        interval: float,
        *,
        pacing: bool = False,
        pass_seconds: float = 0.0,
        stop_timeout: float | None = None,
    ) -> None:
        super().__init__("test-counter", stop_timeout=stop_timeout)
        self.interval, self.pacing, self.pass_seconds = interval, pacing, pass_seconds
        self.passes = 0
        self.ended = threading.Event()

    def _run(self) -> None:
        while not self.stopping:
            self.passes += 1
            time.sleep(self.pass_seconds)
            if self.pacing:
                self.pause(self.interval)
            else:
                self.sleep(self.interval)
        self.ended.set()


def _wait_for(condition: object, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_trigger_runs_a_pass_now_and_stop_ends_the_loop() -> None:
    loop = _Counter(interval=60.0)
    loop.start()
    _wait_for(lambda: loop.passes == 1)
    loop.trigger()
    _wait_for(lambda: loop.passes == 2)  # long before the 60 s interval
    loop.stop()
    assert loop.ended.wait(5.0)
    assert loop.stopping


def test_a_pause_waits_whatever_the_triggers_but_not_for_stop() -> None:
    loop = _Counter(interval=60.0, pacing=True)
    loop.start()
    _wait_for(lambda: loop.passes == 1)
    loop.trigger()
    time.sleep(0.2)
    assert loop.passes == 1
    assert loop.take_trigger()  # the trigger waited for the pause to end
    assert not loop.take_trigger()
    started = time.monotonic()
    loop.stop()
    assert loop.ended.wait(5.0)
    assert time.monotonic() - started < 5.0


def test_stop_waits_for_the_pass_in_hand_at_most_the_deadline() -> None:
    finishing = _Counter(interval=60.0, pass_seconds=0.3, stop_timeout=5.0)
    finishing.start()
    _wait_for(lambda: finishing.passes == 1)
    finishing.stop()
    assert finishing.ended.is_set()  # stop returned after the pass had ended

    stuck = _Counter(interval=60.0, pass_seconds=3.0, stop_timeout=0.2)
    stuck.start()
    _wait_for(lambda: stuck.passes == 1)
    started = time.monotonic()
    stuck.stop()
    assert 0.15 < time.monotonic() - started < 2.0
    assert not stuck.ended.is_set()


def test_a_ticker_ticks_on_the_event_loop_until_stopped() -> None:
    ticks: list[int] = []

    async def run() -> None:
        ticker = Ticker(lambda: ticks.append(threading.get_ident()), interval=0.01, name="t")
        ticker.start()
        while len(ticks) < 3:
            await asyncio.sleep(0.01)
        await ticker.stop()
        stopped = len(ticks)
        await asyncio.sleep(0.05)
        assert len(ticks) == stopped

    asyncio.run(run())
    assert set(ticks) == {threading.get_ident()}
