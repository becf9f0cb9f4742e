"""A queue that takes turns between callers: one caller's flood waits behind itself.

Policy reviews (/validate-policy) are judged one at a time, each holding a
core for as long as the policy is long. Whoever reaches the admission port
can send them, so a plain bound on the queue lets one caller fill it and
have every other caller's review refused unjudged, the API server's
included. Here each caller (the peer's address; with ``serve --client-ca``
every caller holds the API server's certificate) may hold at most
``per_caller`` places, waiting or being judged, and the next turn goes to the
next caller in rotation, not to the oldest review: a caller with one review
waits behind at most one review of each other caller, however many they
send. Past a caller's places, or past ``total`` places in all (many callers
at once), a review is refused at once with :class:`Full`, saying which bound
it met, never queued without a bound.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

__all__ = ["FairQueue", "Full"]


class Full(Exception):
    """The caller's places, or all places, are taken: refuse, saying which (``str()``)."""


class FairQueue:
    """One turn at a time, given to callers in rotation (see the module's docstring)."""

    def __init__(self, *, per_caller: int, total: int, what: str) -> None:
        self.per_caller, self.total, self.what = per_caller, total, what
        self._held: dict[str, int] = {}
        """Places per caller: waiting or holding the turn."""
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}
        """Waiters by caller; the dict's order is the rotation."""
        self._busy = False

    @property
    def places(self) -> int:
        """Places taken, in all."""
        return sum(self._held.values())

    @contextlib.asynccontextmanager
    async def turn(self, caller: str) -> AsyncIterator[None]:
        """Hold the turn for ``caller`` while the block runs; raises :class:`Full` at once."""
        held = self._held.get(caller, 0)
        if held >= self.per_caller:
            raise Full(f"{held} {self.what} from {caller} are already waiting or being judged")
        if self.places >= self.total:
            raise Full(f"{self.total} {self.what} are already waiting or being judged")
        self._held[caller] = held + 1
        try:
            await self._acquire(caller)
            try:
                yield
            finally:
                self._release(caller)
        finally:
            left = self._held[caller] - 1
            if left:
                self._held[caller] = left
            else:
                del self._held[caller]

    async def _acquire(self, caller: str) -> None:
        if not self._busy:
            self._busy = True
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(caller, collections.deque()).append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(caller)  # handed the turn as it left: pass it on
            else:
                queue = self._waiting.get(caller)
                if queue is not None and future in queue:
                    queue.remove(future)
                    if not queue:
                        del self._waiting[caller]
            raise

    def _release(self, holder: str) -> None:
        """Hand the turn to the first waiter of the next caller in rotation, ``holder`` (who
        had the turn) last."""
        queue = self._waiting.pop(holder, None)
        if queue is not None:
            self._waiting[holder] = queue
        while self._waiting:
            caller = next(iter(self._waiting))
            queue = self._waiting.pop(caller)
            future = queue.popleft()
            if queue:
                self._waiting[caller] = queue  # to the back of the rotation
            if not future.done():
                future.set_result(None)
                return
        self._busy = False
