"""Large reviews screened in a worker process, so that their decoding never stalls the event loop.

Every admission shares one event loop, and decoding a review holds it (and
the GIL: a thread would not help) for as long as the review is large, or
holds many lists and objects; the measured costs are in docs/development.md
("What the bounds cost"). A body over :data:`LARGE_REVIEW_BYTES`, or with
more than :data:`MAX_STRUCTURES_ON_LOOP` opening brackets and braces, is
therefore decoded and screened (:func:`webhook.admission.screen`, which
needs no policy) in a worker process first (:func:`for_the_worker`):

* a Pod too wide to plan, a review that is not about a Pod, or a malformed
  one is answered from the worker's verdict, without decoding on the loop;
* any other such review comes back as the part of it that admission reads
  (:func:`webhook.admission.for_planning`: the containers' names and images,
  a few labels and annotations), and the loop plans that: a review is
  decoded once, wherever it is decoded.

A review of more than :data:`MAX_STRUCTURES` lists and objects is refused
there undecoded. The worker decodes with the garbage collector paused: a review of millions
of lists is acyclic and freed by reference counting, and the collector's
passes over it, one per few hundred lists built, cost several times the
decoding itself.

Large policy reviews (/validate-policy, a body over
:data:`LARGE_POLICY_REVIEW_BYTES`) are judged there too, whole
(:func:`webhook.policyreview.judge_body`): reading a policy costs in
proportion to its size, and holds the GIL in a thread as much as on the
loop. At most
:data:`MAX_QUEUED_POLICY_REVIEWS` wait for the worker or are in it; past
that :class:`Busy` is raised, and the endpoint refuses the policy unjudged.

Admission reviews take turns for the worker by caller (the peer's address,
:class:`~webhook.edge.fairqueue.FairQueue`): one caller's large reviews wait
behind each other, and a review of another caller waits behind at most one
of each. A review whose client has gone while it waited leaves the queue
(:mod:`webhook.edge.gone`). Each connection has at most one review being
answered, so the queue holds at most one per open connection and is never
full below the connection limit it is sized to.

One worker, started with the server; if it dies, the next large review
starts another, and the one in hand is decoded (or judged) in the server, as
when no worker can be started at all (no ``/dev/shm`` for its semaphores, a
process limit): then large reviews are decoded on the loop, as they were
before, with a warning in the log at start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import multiprocessing
import re
import signal
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from mirrorgate import policy
from mirrorgate.webhook import admission, policyreview, review
from mirrorgate.webhook.edge import fairqueue, gone
from mirrorgate.webhook.logs import logger

__all__ = [
    "LARGE_POLICY_REVIEW_BYTES",
    "LARGE_REVIEW_BYTES",
    "MAX_QUEUED_POLICY_REVIEWS",
    "MAX_STRUCTURES",
    "MAX_STRUCTURES_ON_LOOP",
    "Busy",
    "Screened",
    "Screener",
    "Unavailable",
    "Verdict",
    "for_the_worker",
]

_T = TypeVar("_T")

LARGE_REVIEW_BYTES = 256 << 10
"""Bodies larger than this are screened in the worker: many times an ordinary Pod's review."""

LARGE_POLICY_REVIEW_BYTES = 8 << 10
"""Policy reviews larger than this are judged in the worker: below it, judging in the server
costs less than the round trip's share of a busy worker's queue."""
MAX_QUEUED_POLICY_REVIEWS = 4
"""Policy reviews waiting for the worker or in it: few enough that the last in the queue is
answered well within the webhook's 5 s timeout (`make bench-abuse` measures it)."""

Screened = tuple[str, bool, admission.Decision]
"""The review's uid and dryRun, and the decision, for what the worker could decide alone."""
Verdict = Screened | review.Review
"""What the worker hands back: its decision, or the review reduced for planning."""


MAX_STRUCTURES_ON_LOOP = 16_384
"""Opening brackets and braces past which a body of any size is decoded in the worker: an
ordinary Pod's review holds tens to a thousand; each list or object costs the loop some
0.3 µs to build, and more in the garbage collector's passes."""


def for_the_worker(body: bytes) -> bool:
    """Whether ``body`` is decoded in the worker (see the module's docstring).

    Brackets and braces inside strings count too: they only send a review
    to the worker more often. Two passes of ``bytes.count``, far cheaper
    than decoding.
    """
    return (
        len(body) > LARGE_REVIEW_BYTES
        or body.count(b"[") + body.count(b"{") > MAX_STRUCTURES_ON_LOOP
    )


def _screen(body: bytes, mode: policy.Mode, max_containers: int) -> Verdict:
    """In the worker: the decision when the policy is not needed, else the review to plan."""
    gc.disable()  # see the module's docstring
    try:
        return _screened(body, mode, max_containers)  # the review is freed on its return
    finally:
        gc.enable()


MAX_STRUCTURES = 500_000
"""Lists and objects of one review, past which it is refused undecoded: building each costs
some 0.3-0.7 µs, and 3.7 million nested lists took the worker 2-3 s, past the webhook's
timeout for the reviews queued behind. A review of a 50,000-container Pod holds about 100,000;
the API server sends at most 3 MiB of Pod."""
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
"""A JSON string (the body is UTF-8 JSON, or decoding refuses it anyway)."""


def _structures(body: bytes) -> int:
    """The lists and objects of ``body``: its brackets and braces outside strings."""
    bare = _STRINGS.sub(b"", body)
    return bare.count(b"[") + bare.count(b"{")


def _screened(body: bytes, mode: policy.Mode, max_containers: int) -> Verdict:
    # Counted in strings too first: a cheap bound, exact only when it is passed.
    if (
        body.count(b"[") + body.count(b"{") > MAX_STRUCTURES
        and (found := _structures(body)) > MAX_STRUCTURES
    ):
        raise review.BadReview(
            f"request body holds {found:,} lists and objects, more than the "
            f"{MAX_STRUCTURES:,} an AdmissionReview may hold"
        )
    rev = review.decode(body)
    screened = admission.screen(rev, mode=mode, max_containers=max_containers)
    if isinstance(screened, admission.Target):
        return admission.for_planning(rev)
    return rev.uid, bool(rev.request.get("dryRun", False)), screened


class Unavailable(Exception):
    """No worker could take the call (none can start, or it died on it): do it here."""


class Busy(Exception):
    """:data:`MAX_QUEUED_POLICY_REVIEWS` policy reviews are already waiting for the worker."""


def _ready() -> bool:
    return True


def _worker_setup() -> None:
    # Ctrl-C reaches the whole process group: the server stops its worker itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Screener:
    """The worker process that screens large reviews (see the module's docstring)."""

    def __init__(self, *, max_waiting: int) -> None:
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._unavailable = False
        self._policy_reviews = 0
        self._turns = fairqueue.FairQueue(
            per_caller=max_waiting, total=max_waiting, what="large reviews"
        )
        """Admission reviews' turns for the worker (see the module's docstring)."""

    @property
    def waiting(self) -> int:
        """Admission reviews waiting for their turn or in the worker."""
        return self._turns.places

    def start(self) -> None:
        """Start the worker now, so that the first large review does not wait for it."""
        try:
            pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_setup,
            )
            pool.submit(_ready)
        except OSError as error:
            self._unavailable = True
            logger.warning(
                "no review worker can start; large reviews are decoded on the event loop",
                extra={"fields": {"error": str(error)}},
            )
            return
        self._pool = pool

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    async def _call(self, function: Callable[..., _T], *args: object) -> _T:
        """``function(*args)`` in the worker; raises :class:`Unavailable` when none can run it."""
        if self._pool is None and not self._unavailable:
            self.start()
        if self._pool is None:
            raise Unavailable
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)
        except BrokenProcessPool:
            logger.error("the review worker died; starting another", extra={"fields": {}})
            with contextlib.suppress(Exception):
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            raise Unavailable from None

    async def screen(
        self,
        body: bytes,
        *,
        mode: policy.Mode,
        max_containers: int,
        caller: str,
        left: asyncio.Event | None = None,
    ) -> Verdict | None:
        """The worker's verdict on ``body``, in ``caller``'s turn; None: no worker could take
        it (or no turn was left: the queue is sized never to be full), decode it here.

        Raises :class:`review.BadReview` for a malformed review, as decoding here would,
        and :class:`~webhook.edge.gone.ClientGone` when ``left`` is set first.
        """
        try:
            return await gone.unless_gone(
                left, self._screen_in_turn(body, mode, max_containers, caller)
            )
        except (Unavailable, fairqueue.Full):
            return None

    async def _screen_in_turn(
        self, body: bytes, mode: policy.Mode, max_containers: int, caller: str
    ) -> Verdict:
        async with self._turns.turn(caller):
            return await self._call(_screen, body, mode, max_containers)

    async def judge_policy(self, body: bytes) -> policyreview.Judged | None:
        """:func:`webhook.policyreview.judge_in_worker`: None for a policy object, which is
        judged beside the stored ones, which only the server holds.

        Raises :class:`Busy` when the queue is full, :class:`Unavailable` when no worker
        can judge it, and :class:`review.BadReview` for a malformed review.
        """
        if self._policy_reviews >= MAX_QUEUED_POLICY_REVIEWS:
            raise Busy
        self._policy_reviews += 1
        try:
            return await self._call(policyreview.judge_in_worker, body)
        finally:
            self._policy_reviews -= 1
