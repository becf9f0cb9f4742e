"""Large reviews take turns for the review worker by caller, and leave when their client does.

Issue 29, 6: beside five clients that pipelined 7 MiB reviews and read no
answer, a legitimate client's 3 MiB reviews waited up to 12 s for the
worker: they queued first come, first served behind the attackers' reviews,
and behind reviews of connections already closed, whose answers nobody could
take. Now each caller (peer address) waits behind at most one review of each
other caller, a review whose connection is lost leaves the queue, and over
the body budget the heaviest caller's bodies go before the API server's.
"""

from __future__ import annotations

import asyncio
import dataclasses

import orjson
import pytest

from mirrorgate.webhook.edge import gone, offload
from mirrorgate.webhook.edge.connections import State
from tests.webhook.reviews import PROM_IMAGE, pod, review
from tests.webhook.test_connection_table import LIMITS, world


def large(uid: str) -> bytes:
    body = review(pod(PROM_IMAGE), uid=uid)
    body["request"]["options"] = {"padding": "x" * offload.LARGE_REVIEW_BYTES}
    return orjson.dumps(body)


async def screened(screener: offload.Screener, uid: str, caller: str, order: list[str]) -> None:
    await screener.screen(large(uid), mode="enforce", max_containers=1000, caller=caller)
    order.append(uid)


def test_a_callers_review_waits_behind_one_of_each_other_caller(
    screener: offload.Screener,
) -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        flood = [
            asyncio.create_task(screened(screener, f"flood-{i}", "10.0.0.9", order))
            for i in range(6)
        ]
        await asyncio.sleep(0)  # the flood's reviews are queued first
        api = asyncio.create_task(screened(screener, "api", "10.0.0.1", order))
        await asyncio.gather(*flood, api)
        return order

    order = asyncio.run(scenario())
    # The first flood review had the worker, the second was next in the rotation: the API
    # server's comes after them, not after all six.
    assert order.index("api") <= 2, order
    assert sorted(order) == sorted(["api", *(f"flood-{i}" for i in range(6))])


def test_a_review_whose_client_left_leaves_the_queue_unscreened(
    screener: offload.Screener,
) -> None:
    async def scenario() -> tuple[bool, list[str], int]:
        order: list[str] = []
        left = asyncio.Event()
        ahead = [
            asyncio.create_task(screened(screener, f"ahead-{i}", "10.0.0.9", order))
            for i in range(3)
        ]
        await asyncio.sleep(0)
        waiting = asyncio.create_task(
            screener.screen(
                large("gone"), mode="enforce", max_containers=1000, caller="10.0.0.7", left=left
            )
        )
        await asyncio.sleep(0)
        left.set()  # the connection is lost while the review waits for its turn
        with pytest.raises(gone.ClientGone):
            await waiting
        still_ahead = not all(task.done() for task in ahead)
        await asyncio.gather(*ahead)
        return still_ahead, order, screener.waiting

    still_ahead, order, waiting = asyncio.run(scenario())
    assert still_ahead  # it left at once, not after its turn came
    assert order == ["ahead-0", "ahead-1", "ahead-2"]
    assert waiting == 0


def test_unless_gone_passes_the_result_through_and_stops_work_already_abandoned() -> None:
    async def answer() -> str:
        return "answer"

    async def scenario() -> str:
        left = asyncio.Event()
        assert await gone.unless_gone(left, answer()) == "answer"
        assert await gone.unless_gone(None, answer()) == "answer"
        left.set()
        with pytest.raises(gone.ClientGone):
            await gone.unless_gone(left, answer())
        return "done"

    assert asyncio.run(scenario()) == "done"


def test_over_the_body_budget_the_heaviest_caller_gives_way_to_the_api_server() -> None:
    """Five callers each holding one 7 MiB body that waits for the worker, one request at a
    time like the API server: the API server's 3 MiB body, read over the budget, closes one
    of theirs, not itself."""
    w = world(dataclasses.replace(LIMITS, max_connections=8))
    attackers = [w.connect(f"attacker-{i}", State.BUSY, peer=f"10.0.0.{10 + i}") for i in range(5)]
    for attacker in attackers:
        w.table.hold(attacker, 190)
    api = w.connect("api", State.BODY, peer="10.0.0.1")
    w.table.hold(api, 100)  # 1,050 of a 1,000-byte budget
    assert api.closed is None
    assert [a.closed for a in attackers].count("body-budget") == 1
    assert w.table.buffered <= LIMITS.max_buffered_bytes


def test_over_the_body_budget_a_caller_holding_no_more_than_the_reader_is_kept() -> None:
    """Per caller, not per connection: the reader's own caller holding most, the reader's
    older body reads go first, as before."""
    w = world(dataclasses.replace(LIMITS, max_connections=8))
    other = w.connect("other", State.BUSY, peer="10.0.0.2")
    w.table.hold(other, 300)
    older = w.connect("older", State.BODY, peer="10.0.0.1")
    w.table.hold(older, 400)
    reader = w.connect("reader", State.BODY, peer="10.0.0.1")
    w.table.hold(reader, 400)  # 1,100: caller 10.0.0.1 holds the most, its older read goes
    assert (older.closed, reader.closed, other.closed) == ("body-budget", None, None)
