"""Background work, in one place: loops in threads of their own, tickers on the event loop,
and the manager that starts and stops them.

Everything the server does besides answering requests is a loop that sleeps
between passes. The informers, the Lease, the self-managed certificates, the
health probes, the provider-login refresher, the pull-secret reconciler and
the file watchers (which read and parse what changed) do blocking I/O or
work: each is a :class:`Loop`, a daemon thread. The log flusher only writes a
buffer, on the event loop: it is a :class:`Ticker`.

Each is added once to a :class:`Manager` (``commands.serve.wiring``), which
starts them in the order they were added (a component after those it uses)
and stops them in reverse, within one deadline: controller-runtime's
Runnables. A loop can be woken (a pass now rather than at the end of its
wait) and stopped (at the end of the pass in hand, waiting for that at most
its deadline). Only this module starts threads or long-lived tasks
(``tests/webhook/test_background.py`` holds the others to it), so that what
runs in the background is listed here and nowhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Loop", "Manager", "Runnable", "Shutdown", "Ticker"]


class Loop:
    """A daemon thread that runs :meth:`_run` from :meth:`start` until :meth:`stop`.

    Subclasses write ``_run``. It waits between passes with :meth:`sleep`
    (which a :meth:`trigger` cuts short) or :meth:`pause` (which only
    stopping cuts short: for backoff and pacing), and returns once
    :attr:`stopping`.
    """

    def __init__(
        self,
        name: str,
        *,
        stop_timeout: float | None = None,
        wait: Callable[[threading.Event, float], bool] = threading.Event.wait,
    ) -> None:
        self._thread_name = name
        self._stop_timeout = stop_timeout
        """What :meth:`stop` waits at most for the pass in hand (None: not at all)."""
        self._wait = wait
        """How :meth:`sleep` and :meth:`pause` wait for an event: ``Event.wait``; a test's
        fake clock returns at once, saying whether the event was set."""
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop after the pass in hand, waiting for that at most the loop's deadline."""
        self._stopping.set()
        self._wake.set()
        if self._stop_timeout is not None and self._thread is not None and self._thread.is_alive():
            self._thread.join(self._stop_timeout)

    def trigger(self) -> None:
        """Run a pass now instead of at the end of the wait."""
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or until triggered or stopped; True when woken early."""
        woken = self._wait(self._wake, seconds)
        self._wake.clear()
        return woken

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` whatever the triggers, or until stopped; True when stopping."""
        return self._wait(self._stopping, seconds)

    def take_trigger(self) -> bool:
        """Whether a trigger came since the last wait (and forget it): for passes that
        attend to news before they go on."""
        if not self._wake.is_set():
            return False
        self._wake.clear()
        return True


class Ticker:
    """Calls ``tick`` every ``interval`` seconds on the running event loop, from start to stop.

    ``tick`` runs on the event loop: it must be quick and must not raise. :meth:`stop` may be
    called from any thread; once it has returned, ``tick`` is not called again.
    """

    def __init__(self, tick: Callable[[], object], *, interval: float, name: str) -> None:
        self.tick, self.interval, self.name = tick, interval, name
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = threading.Event()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self._stopped.is_set():
                return
            self.tick()

    def start(self) -> None:
        """Start ticking; called on the event loop the ticks run on."""
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name=self.name)

    def stop(self) -> None:
        self._stopped.set()
        if self._loop is not None and self._task is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._task.cancel)

    @property
    def running(self) -> bool:
        """Whether the task is still there to tick (False once stopped and unwound)."""
        return self._task is not None and not self._task.done()


class Runnable(Protocol):
    """A background component: started once, stopped once (stop bounds its own wait)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Shutdown:
    """How stopping went: the components still stopping at the deadline, those that failed."""

    late: tuple[str, ...] = ()
    failed: tuple[tuple[str, BaseException], ...] = ()


class Manager:
    """The server's background components, each added once by name.

    :meth:`start` starts them in the order they were added: a component is added after
    those it uses, so they run when it starts. :meth:`stop` stops them in reverse, each
    once the ones added after it have stopped, waiting ``deadline`` seconds at most in
    all: a component still stopping then is left to end with the process, and the rest
    are still stopped.
    """

    def __init__(self, *, deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline, self._clock = deadline, clock
        self._components: list[tuple[str, Runnable]] = []
        self._started: list[tuple[str, Runnable]] = []

    def add(self, name: str, component: Runnable) -> None:
        if any(name == known for known, _ in self._components):
            raise ValueError(f"a component named {name!r} is already added")
        self._components.append((name, component))

    @property
    def names(self) -> list[str]:
        """The components, in start order."""
        return [name for name, _ in self._components]

    def start(self) -> None:
        """Start every component in order; if one fails, stop those started and raise."""
        for name, component in self._components:
            try:
                component.start()
            except BaseException:
                self.stop()
                raise
            self._started.append((name, component))

    def stop(self) -> Shutdown:
        """Stop the started components in reverse order, within the deadline."""
        end = self._clock() + self.deadline
        late: list[str] = []
        failed: list[tuple[str, BaseException]] = []
        while self._started:
            name, component = self._started.pop()
            errors: list[BaseException] = []
            stopper = threading.Thread(
                target=_stop, args=(component, errors), name=f"stop-{name}", daemon=True
            )
            stopper.start()
            stopper.join(max(0.0, end - self._clock()))
            if stopper.is_alive():
                late.append(name)
            failed += [(name, problem) for problem in errors]
        return Shutdown(late=tuple(late), failed=tuple(failed))


def _stop(component: Runnable, errors: list[BaseException]) -> None:
    """Stop ``component`` in a thread of the manager's, keeping what it raised."""
    try:
        component.stop()
    except Exception as error:
        errors.append(error)
