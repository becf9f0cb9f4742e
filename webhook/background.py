"""Background work, in one place: loops in threads of their own, and tickers on the event loop.

Everything the server does besides answering requests is a loop that sleeps
between passes. The informers, the Lease, the self-managed certificates, the
health probes, the provider-login refresher, the pull-secret reconciler and
the file watchers (which read and parse what changed) do blocking I/O or
work: each is a :class:`Loop`, a daemon thread. The log flusher only writes a
buffer, on the event loop: it is a :class:`Ticker`.

Both are started and stopped by ``commands.serve``. A loop can be woken (a
pass now rather than at the end of its wait) and stopped (at the end of the
pass in hand, waiting for that at most its deadline). Only this module starts
threads or long-lived tasks (``tests/webhook/test_background.py`` holds the
others to it), so that what runs in the background is listed here and nowhere
else.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

__all__ = ["Loop", "Ticker"]


class Loop:
    """A daemon thread that runs :meth:`_run` from :meth:`start` until :meth:`stop`.

    Subclasses write ``_run``. It waits between passes with :meth:`sleep`
    (which a :meth:`trigger` cuts short) or :meth:`pause` (which only
    stopping cuts short: for backoff and pacing), and returns once
    :attr:`stopping`.
    """

    def __init__(self, name: str, *, stop_timeout: float | None = None) -> None:
        self._thread_name = name
        self._stop_timeout = stop_timeout
        """What :meth:`stop` waits at most for the pass in hand (None: not at all)."""
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
        woken = self._wake.wait(seconds)
        self._wake.clear()
        return woken

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` whatever the triggers, or until stopped; True when stopping."""
        return self._stopping.wait(seconds)

    def take_trigger(self) -> bool:
        """Whether a trigger came since the last wait (and forget it): for passes that
        attend to news before they go on."""
        if not self._wake.is_set():
            return False
        self._wake.clear()
        return True


class Ticker:
    """Calls ``tick`` every ``interval`` seconds on the running event loop, from start to stop.

    ``tick`` runs on the event loop: it must be quick and must not raise.
    """

    def __init__(self, tick: Callable[[], object], *, interval: float, name: str) -> None:
        self.tick, self.interval, self.name = tick, interval, name
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.tick()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
