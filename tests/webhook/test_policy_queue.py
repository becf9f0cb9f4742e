"""Policy reviews take turns between callers: one caller's flood is refused, another's update
is judged (issue 29, item 2), and the small-review path has a bound of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from mirrorgate.webhook import policyreview
from mirrorgate.webhook.edge import app
from mirrorgate.webhook.edge.fairqueue import FairQueue, Full
from tests.webhook import policies
from tests.webhook.harness import make_harness
from tests.webhook.reviews import review

CONFIG_MAP = {"group": "", "version": "v1", "kind": "ConfigMap"}


async def settle() -> None:
    """Let every task that can run do so (the queue's hand-overs are loop callbacks)."""
    for _ in range(10):
        await asyncio.sleep(0)


class Holders:
    """Reviews that hold the turn until the gate opens, and who was served, in order."""

    def __init__(self, queue: FairQueue) -> None:
        self.queue, self.gate, self.served = queue, asyncio.Event(), list[str]()

    def start(self, caller: str, name: str | None = None) -> asyncio.Task[None]:
        return asyncio.create_task(self._one(caller, name or caller))

    async def _one(self, caller: str, name: str) -> None:
        async with self.queue.turn(caller):
            self.served.append(name)
            await self.gate.wait()


def test_turns_go_round_the_callers_not_in_arrival_order() -> None:
    async def main() -> list[str]:
        queue = FairQueue(per_caller=4, total=32, what="reviews")
        holders = Holders(queue)
        tasks = [holders.start("flooder", f"f{i}") for i in range(4)]
        await settle()
        tasks.append(holders.start("writer", "w"))
        await settle()
        for _ in range(5):  # one at a time
            holders.gate.set()
            holders.gate.clear()
            await settle()
        holders.gate.set()
        await asyncio.gather(*tasks)
        assert queue.places == 0
        return holders.served

    # f0 held the turn; the writer, who came last, goes right after it.
    assert asyncio.run(main()) == ["f0", "w", "f1", "f2", "f3"]


def test_a_caller_past_its_places_is_refused_at_once_and_others_are_not() -> None:
    async def main() -> None:
        queue = FairQueue(per_caller=2, total=32, what="policy reviews")
        holders = Holders(queue)
        held = [holders.start("10.0.0.5") for _ in range(2)]
        await settle()
        with pytest.raises(Full) as refused:
            async with queue.turn("10.0.0.5"):
                pass
        assert str(refused.value) == (
            "2 policy reviews from 10.0.0.5 are already waiting or being judged"
        )
        held.append(holders.start("10.0.0.6"))
        await settle()
        assert queue.places == 3
        holders.gate.set()
        await asyncio.gather(*held)

    asyncio.run(main())


def test_all_places_are_bounded_too() -> None:
    async def main() -> None:
        queue = FairQueue(per_caller=1, total=3, what="policy reviews")
        holders = Holders(queue)
        held = [holders.start(f"10.0.0.{i}") for i in range(3)]
        await settle()
        with pytest.raises(Full, match=r"^3 policy reviews are already waiting or being judged$"):
            async with queue.turn("10.0.0.9"):
                pass
        holders.gate.set()
        await asyncio.gather(*held)

    asyncio.run(main())


def test_past_all_places_the_heaviest_caller_gives_up_its_newest_waiting_one() -> None:
    async def main() -> None:
        queue = FairQueue(per_caller=4, total=4, what="policy reviews")
        holders = Holders(queue)
        tasks = [holders.start("10.0.0.66", f"f{i}") for i in range(4)]
        await settle()
        tasks.append(holders.start("10.0.0.1", "w"))
        await settle()
        assert queue.places == 4
        holders.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        (evicted,) = [r for r in results if isinstance(r, Full)]
        assert str(evicted) == (
            "4 policy reviews are already waiting or being judged, 4 of them from 10.0.0.66"
        )
        assert results[3] is evicted  # the newest of the flood's waiting reviews
        assert holders.served == ["f0", "w", "f1", "f2"]

    asyncio.run(main())


def test_a_caller_who_leaves_gives_back_its_place_and_its_turn() -> None:
    async def main() -> None:
        queue = FairQueue(per_caller=1, total=32, what="reviews")
        holders = Holders(queue)
        first = holders.start("a")
        await settle()
        leaving, last = holders.start("b"), holders.start("c")
        await settle()
        leaving.cancel()
        await settle()
        assert queue.places == 2
        holders.gate.set()
        await asyncio.gather(first, last)
        assert holders.served == ["a", "c"]
        # b's place is free again: b may queue once more.
        async with queue.turn("b"):
            pass
        assert queue.places == 0

    asyncio.run(main())


# --- /validate-policy ----------------------------------------------------------------------------


def body(uid: str) -> bytes:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "mirrorgate-policy", "namespace": "mirrorgate"},
        "data": {"policy.yaml": policies.POLICY},
    }
    return orjson.dumps(
        review(obj, operation="UPDATE", namespace="mirrorgate", kind=CONFIG_MAP, uid=uid)
    )


def policy_endpoint(tmp_path: Path) -> app.PolicyEndpoint:
    application = make_harness(tmp_path).client.app
    assert isinstance(application, app._Application)
    endpoint = application.admission_endpoints["/validate-policy"]
    assert isinstance(endpoint, app.PolicyEndpoint)
    return endpoint


async def call(endpoint: app.PolicyEndpoint, peer: str, payload: bytes) -> dict[str, Any]:
    """One POST /validate-policy from ``peer``, as uvicorn hands it to the endpoint."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/validate-policy",
        "client": (peer, 40000),
        "headers": [(b"content-type", b"application/json")],
    }
    sent: list[MutableMapping[str, Any]] = []
    messages = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await endpoint(scope, receive, send)
    answer: dict[str, Any] = orjson.loads(sent[1]["body"])["response"]
    return answer


def blocked_judge(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[str]]:
    """judge_body, held until the event is set; the uids in the order they were judged."""
    release, judged = threading.Event(), []
    real = policyreview.judge_body

    def judge(payload: bytes, stored: policyreview.Stored) -> policyreview.Judged:
        judged.append(orjson.loads(payload)["request"]["uid"])
        release.wait(10)
        return real(payload, stored)

    monkeypatch.setattr(policyreview, "judge_body", judge)
    return release, judged


def test_a_flood_from_one_caller_cannot_refuse_another_callers_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the small-review path, which waited behind one lock without any bound before."""
    endpoint = policy_endpoint(tmp_path)
    release, judged = blocked_judge(monkeypatch)

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        flood = [
            asyncio.create_task(call(endpoint, "10.0.0.66", body(f"flood-{i}")))
            for i in range(3 * app.POLICY_REVIEWS_PER_CALLER)
        ]
        await settle()
        update = asyncio.create_task(call(endpoint, "10.0.0.1", body("update")))
        await settle()
        await asyncio.to_thread(release.set)
        return await asyncio.gather(*flood), await update

    flooded, update = asyncio.run(main())
    assert update["allowed"] is True
    refused = [r for r in flooded if not r["allowed"]]
    assert len(refused) == 2 * app.POLICY_REVIEWS_PER_CALLER
    assert {r["status"]["code"] for r in refused} == {429}
    assert refused[0]["status"]["message"] == (
        f"mirrorgate: {app.POLICY_REVIEWS_PER_CALLER} policy reviews from 10.0.0.66 are already "
        "waiting or being judged; this policy was not judged, try again"
    )
    # The update, sent after the flood, was judged right after the flood's first.
    assert judged[:2] == ["flood-0", "update"]


def test_past_every_place_a_policy_is_refused_unjudged_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = policy_endpoint(tmp_path)
    release, _ = blocked_judge(monkeypatch)
    callers = [f"10.0.{i // 250}.{i % 250}" for i in range(app.MAX_POLICY_REVIEWS)]

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        waiting: list[Awaitable[dict[str, Any]]] = [
            asyncio.create_task(call(endpoint, peer, body(peer))) for peer in callers
        ]
        await settle()
        late = await call(endpoint, "10.9.9.9", body("late"))
        await asyncio.to_thread(release.set)
        return list(await asyncio.gather(*waiting)), late

    served, late = asyncio.run(main())
    assert all(r["allowed"] for r in served)
    assert late["allowed"] is False
    assert late["status"]["code"] == 429
    assert late["status"]["message"] == (
        f"mirrorgate: {app.MAX_POLICY_REVIEWS} policy reviews are already waiting or being "
        "judged; this policy was not judged, try again"
    )
