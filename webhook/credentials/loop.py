"""A background thread that sleeps until it is woken, stopped, or its interval passes."""

from __future__ import annotations

import threading

__all__ = ["WakeableLoop"]


class WakeableLoop:
    """The thread, its wake-up and its stop; subclasses write ``_run``."""

    def __init__(self, name: str) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def trigger(self) -> None:
        """Run a pass now instead of at the end of the wait."""
        self._wake.set()
