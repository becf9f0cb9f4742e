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
send. Past a caller's places a review is refused at once with :class:`Full`.
Past ``total`` places in all, the caller holding the most places gives up its
newest waiting review (refused with :class:`Full` too) to a caller holding
fewer, and only when no caller holds more than the newcomer would is the
newcomer refused: a flood shrinks to its share, never queued without a bound,
and each refusal says which bound it met. ``slots`` turns run at once (1 for
the policy reviews, which each hold a core; more for work that waits on I/O).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

__all__ = ["FairQueue", "Full"]


class Full(Exception):
    """The caller's places, or all places, are taken: refuse, saying which (``str()``)."""


class _Evicted(Exception):
    """A waiting review whose place a caller holding fewer places took."""


class FairQueue:
    """One turn at a time, given to callers in rotation (see the module's docstring)."""

    def __init__(self, *, per_caller: int, total: int, what: str, slots: int = 1) -> None:
        self.per_caller, self.total, self.what, self.slots = per_caller, total, what, slots
        self._held: dict[str, int] = {}
        """Places per caller: waiting or holding the turn."""
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}
        """Waiters by caller; the dict's order is the rotation."""
        self._running = 0
        """Turns held: at most ``slots``."""

    @property
    def places(self) -> int:
        """Places taken, in all."""
        return sum(self._held.values())

    @contextlib.asynccontextmanager
    async def turn(self, caller: str) -> AsyncIterator[None]:
        """Hold the turn for ``caller`` while the block runs; raises :class:`Full` at once, or
        while waiting if a lighter caller took this review's place."""
        self._admit(caller)
        try:
            await self._acquire(caller)
        except _Evicted as evicted:
            raise Full(str(evicted)) from None  # its place was given back as it was taken
        try:
            yield
        finally:
            self._give_back(caller)
            self._release(caller)

    def _admit(self, caller: str) -> None:
        """Take a place for ``caller``, or raise :class:`Full` saying which bound it met."""
        held = self._held.get(caller, 0)
        if held >= self.per_caller:
            raise Full(f"{held} {self.what} from {caller} are already waiting or being judged")
        if self.places >= self.total:
            heaviest = max(self._waiting, key=lambda c: self._held[c], default=None)
            if heaviest is None or self._held[heaviest] <= held + 1:
                raise Full(f"{self.total} {self.what} are already waiting or being judged")
            # The caller holding the most places gives up its newest waiting one.
            victim = self._waiting[heaviest].pop()
            if not self._waiting[heaviest]:
                del self._waiting[heaviest]
            self._give_back(heaviest)
            victim.set_exception(
                _Evicted(
                    f"{self.total} {self.what} are already waiting or being judged, "
                    f"{self._held[heaviest] + 1} of them from {heaviest}"
                )
            )
        self._held[caller] = held + 1

    def _give_back(self, caller: str) -> None:
        left = self._held[caller] - 1
        if left:
            self._held[caller] = left
        else:
            del self._held[caller]

    async def _acquire(self, caller: str) -> None:
        """Wait for the turn; a caller that leaves meanwhile gives back its place (and the
        turn, if it was handed it as it left)."""
        if self._running < self.slots:
            self._running += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(caller, collections.deque()).append(future)
        try:
            await future
        except asyncio.CancelledError:
            if not future.done() or future.cancelled():
                queue = self._waiting.get(caller)
                if queue is not None and future in queue:
                    queue.remove(future)
                    if not queue:
                        del self._waiting[caller]
                self._give_back(caller)
            elif future.exception() is None:
                self._give_back(caller)
                self._release(caller)  # handed the turn as it left: pass it on
            # else evicted as it left: its place is already given back
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
        self._running -= 1
