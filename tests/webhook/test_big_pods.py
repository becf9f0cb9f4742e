"""A Pod too wide to plan on the shared event loop is answered at once, unplanned (issue 19).

A 3 MB Pod of 50,000 containers took 2.1–2.5 s of the single event loop to
plan, and three clients sending such Pods pushed every other admission past
the webhook's 5 s timeout. Past ``serve --max-containers`` (1,000 by
default) a Pod is refused in an enforce namespace and admitted as written,
with a warning and an audit annotation, in an audit one (issue 28: never as
written where mirrorgate enforces); a review over 256 KiB is decoded and
screened in a worker process, off the loop; `make bench-abuse` measures the
admissions beside such Pods.
"""

from __future__ import annotations

import asyncio
import copy
import gc
from typing import Any

import orjson
import pytest

from mirrorgate.webhook import admission
from mirrorgate.webhook import review as review_
from mirrorgate.webhook.edge import offload
from mirrorgate.webhook.edge.limits import Limits
from tests.webhook.harness import Harness
from tests.webhook.reviews import PROM_IMAGE, PROM_MIRRORED, apply, patch_ops, pod, review


def too_wide(count: int, limit: int) -> str:
    return (
        f"mirrorgate: the Pod names {count:,} images (containers and image volumes), more "
        f"than the {limit:,} it checks (serve --max-containers)"
    )


def refused(count: int, limit: int) -> str:
    return too_wide(count, limit) + "; refused, as every image must be on a mirror here"


def assert_refused(response: dict[str, Any], count: int, limit: int) -> None:
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"] == {
        "code": 403,
        "message": refused(count, limit),
        "reason": "Forbidden",
    }


def test_a_pod_of_50000_containers_is_refused_to_enforce_saying_why(harness: Harness) -> None:
    response = harness.mutate(review(pod(*[PROM_IMAGE] * 50_000)))
    assert_refused(response, 50_000, admission.MAX_CONTAINERS)
    assert 'mirrorgate_admissions_total{endpoint="mutate",mode="enforce",outcome="denied"} 1.0' in (
        harness.client.get("/metrics").text
    )


def test_a_pod_of_50000_containers_is_reported_to_audit_and_counted(harness: Harness) -> None:
    response = harness.post("/audit", review(pod(*[PROM_IMAGE] * 50_000)))["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    what = too_wide(50_000, admission.MAX_CONTAINERS)
    assert response["warnings"] == [what + "; its images are left as written, unchecked"]
    assert response["auditAnnotations"] == {"too-many-containers": what}
    metrics = harness.client.get("/metrics").text
    assert 'mirrorgate_images_left_unmirrored_total{reason="too-many-containers"} 50000.0' in (
        metrics
    )


def test_the_limit_counts_every_container_list_and_admits_up_to_it(harness: Harness) -> None:
    harness.runtime.max_containers = 3
    at_limit = pod(PROM_IMAGE, PROM_IMAGE)
    at_limit["spec"]["initContainers"] = [{"name": "init", "image": PROM_IMAGE}]
    patched = apply(at_limit, patch_ops(harness.mutate(review(at_limit))))
    assert patched["spec"]["initContainers"][0]["image"] == PROM_MIRRORED

    over = copy.deepcopy(at_limit)
    over["spec"]["ephemeralContainers"] = [{"name": "debug", "image": PROM_IMAGE}]
    assert_refused(harness.mutate(review(over)), 4, 3)


def test_the_limit_counts_image_volumes_but_not_other_volumes(harness: Harness) -> None:
    harness.runtime.max_containers = 3
    at_limit = pod(PROM_IMAGE, PROM_IMAGE)
    at_limit["spec"]["volumes"] = [
        {"name": "data", "emptyDir": {}},
        {"name": "models", "image": {"reference": PROM_IMAGE}},
        {"name": "config", "configMap": {"name": "c"}},
    ]
    patched = apply(at_limit, patch_ops(harness.mutate(review(at_limit))))
    assert patched["spec"]["volumes"][1]["image"]["reference"] == PROM_MIRRORED

    over = copy.deepcopy(at_limit)
    over["spec"]["volumes"].append({"name": "more", "image": {"reference": PROM_IMAGE}})
    assert_refused(harness.mutate(review(over)), 4, 3)


def test_an_update_counts_the_larger_of_the_pod_before_and_after(harness: Harness) -> None:
    """A Pod admitted under the limit can have its images changed; past it, it is refused."""
    harness.runtime.max_containers = 3
    old = pod(PROM_IMAGE, PROM_IMAGE, PROM_IMAGE)
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = "quay.io/prometheus/prometheus:v3.0.0"
    ops = patch_ops(harness.mutate(review(new, operation="UPDATE", old=old)))
    assert "/spec/containers/0/image" in [op["path"] for op in ops]
    wider = copy.deepcopy(old)
    wider["spec"]["containers"].append({"name": "c3", "image": PROM_IMAGE})
    assert_refused(harness.mutate(review(new, operation="UPDATE", old=wider)), 4, 3)


def test_an_ephemeral_update_counts_the_ephemeral_containers_old_and_new(harness: Harness) -> None:
    """kubectl debug plans the new ephemeral containers against the old ones, not the rest."""
    harness.runtime.max_containers = 3
    old = pod(*[PROM_IMAGE] * 10)
    old["spec"]["ephemeralContainers"] = [{"name": "debug-0", "image": PROM_IMAGE}]
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"].append({"name": "debug-1", "image": PROM_IMAGE})
    update = review(new, operation="UPDATE", sub_resource="ephemeralcontainers", old=old)
    assert [op["path"] for op in patch_ops(harness.mutate(update))] == [
        "/spec/ephemeralContainers/1/image"
    ]  # 1 + 2 ephemeral: within 3

    new["spec"]["ephemeralContainers"].append({"name": "debug-2", "image": PROM_IMAGE})
    response = harness.mutate(
        review(new, operation="UPDATE", sub_resource="ephemeralcontainers", old=old)
    )
    assert_refused(response, 4, 3)


def test_the_limit_must_be_positive() -> None:
    assert Limits(max_containers=0).problems() == ["--max-containers must be positive, got 0"]


def padded(obj: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A review of ``obj`` over LARGE_REVIEW_BYTES (padding in a field nothing reads)."""
    body = review(obj, **kwargs)
    body["request"]["options"] = {"padding": "x" * offload.LARGE_REVIEW_BYTES}
    return body


def test_large_reviews_are_screened_in_a_worker_process(screener: offload.Screener) -> None:
    """Decided there when no policy is needed; otherwise handed back to be planned here."""
    wide = orjson.dumps(padded(pod(*[PROM_IMAGE] * 2000), dry_run=True, uid="wide"))
    screened = asyncio.run(
        screener.screen(wide, mode="enforce", max_containers=1000, caller="api-server")
    )
    assert screened is not None
    assert not isinstance(screened, review_.Review)
    uid, dry_run, decision = screened
    assert (uid, dry_run, decision.outcome) == ("wide", True, "denied")
    assert decision.body["response"]["status"]["message"] == refused(2000, 1000)
    audited = asyncio.run(
        screener.screen(wide, mode="audit", max_containers=1000, caller="api-server")
    )
    assert audited is not None
    assert not isinstance(audited, review_.Review)
    assert audited[2].unmirrored == (("too-many-containers", 2000),)

    # Handed back to be planned here: decoded once, in the worker, and reduced to
    # what admission reads (the padding stays behind).
    narrow = orjson.dumps(padded(pod(PROM_IMAGE), uid="narrow"))
    handed = asyncio.run(
        screener.screen(narrow, mode="enforce", max_containers=1000, caller="api-server")
    )
    assert isinstance(handed, review_.Review)
    assert handed.uid == "narrow"
    assert len(orjson.dumps(handed.request)) < len(narrow) // 100
    assert handed == admission.for_planning(review_.decode(narrow))

    malformed = padded(pod(PROM_IMAGE), uid="bad", namespace="Not_A_Namespace")
    with pytest.raises(review_.BadReview) as caught:
        asyncio.run(
            screener.screen(
                orjson.dumps(malformed), mode="enforce", max_containers=1000, caller="api-server"
            )
        )
    assert (caught.value.uid, str(caught.value)) == (
        "bad",
        "namespace 'Not_A_Namespace' is not a namespace name",
    )


def test_the_endpoint_answers_large_reviews_through_the_worker(
    harness: Harness, screener: offload.Screener
) -> None:
    harness.runtime.screener = screener
    response = harness.mutate(padded(pod(*[PROM_IMAGE] * 50_000)))
    assert_refused(response, 50_000, admission.MAX_CONTAINERS)

    narrow = pod(PROM_IMAGE)
    patched = apply(narrow, patch_ops(harness.mutate(padded(narrow))))
    assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED

    answer = harness.client.post(
        "/mutate",
        content=orjson.dumps(padded(pod(PROM_IMAGE), uid="bad", namespace="Not_A_Namespace")),
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert answer.json()["response"]["uid"] == "bad"


def test_without_a_worker_large_reviews_are_decided_on_the_loop(
    harness: Harness, workerless: offload.Screener
) -> None:
    harness.runtime.screener = workerless
    response = harness.mutate(padded(pod(*[PROM_IMAGE] * 2_000)))
    assert_refused(response, 2_000, admission.MAX_CONTAINERS)
    narrow = pod(PROM_IMAGE)
    patched = apply(narrow, patch_ops(harness.mutate(padded(narrow))))
    assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED


def test_a_large_body_or_one_of_many_lists_is_decoded_in_the_worker() -> None:
    """Issue 29, 3: whatever its commas (behaviour change: a large body with too few commas
    for a wide Pod was decoded on the loop, and 7 MB of line feeds held it for some 50 ms).

    Bodies of ordinary Pods stay on the loop; so does a small one just at the bound of
    lists and objects, where the next bracket sends it to the worker.
    """
    long_image = orjson.dumps(padded(pod("quay.io/x/" + "a" * 2_500_000)))
    assert long_image.count(b",") < admission.MAX_CONTAINERS
    assert offload.for_the_worker(long_image)
    whitespace = b"\n" * (offload.LARGE_REVIEW_BYTES + 1)
    assert offload.for_the_worker(whitespace)
    assert not offload.for_the_worker(whitespace[:-1])
    at_bound = orjson.dumps([[]] * (offload.MAX_STRUCTURES_ON_LOOP - 1))
    assert len(at_bound) < offload.LARGE_REVIEW_BYTES
    assert not offload.for_the_worker(at_bound)
    assert offload.for_the_worker(orjson.dumps([{}] * offload.MAX_STRUCTURES_ON_LOOP))
    ordinary = orjson.dumps(review(pod(*[PROM_IMAGE] * 20)))
    assert not offload.for_the_worker(ordinary)


def test_the_worker_decodes_with_the_garbage_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review of millions of lists took the collector's passes, several times its own
    decoding (6 s against 1 s for 3.7 million lists), and the attacker's answer past the
    webhook's timeout. Run here as the worker runs it; the collector is on again after."""
    seen: list[bool] = []
    decode = review_.decode

    def watched(body: bytes) -> review_.Review:
        seen.append(gc.isenabled())
        return decode(body)

    monkeypatch.setattr(review_, "decode", watched)
    lists = orjson.dumps(padded(pod(PROM_IMAGE), uid="lists")).replace(
        b'"options":{', b'"options":{"x":' + orjson.dumps([[[]]] * 1000) + b","
    )
    assert gc.isenabled()
    handed = offload._screen(lists, "enforce", admission.MAX_CONTAINERS)
    assert seen == [False]
    assert gc.isenabled()
    assert isinstance(handed, review_.Review)
    assert handed.uid == "lists"
    assert "options" not in handed.request


def test_a_review_of_too_many_lists_is_refused_undecoded(screener: offload.Screener) -> None:
    """Issue 29, 3: 3.7 million nested lists took the worker 2-3 s to decode, and the reviews
    queued behind past the webhook's timeout. Brackets in strings are not lists."""
    base = orjson.dumps(padded(pod(PROM_IMAGE), uid="lists"))
    own = base.count(b"[") + base.count(b"{")  # none in its strings
    lists = base.replace(
        b'"options":{', b'"options":{"x":' + orjson.dumps([[]] * offload.MAX_STRUCTURES) + b","
    )
    with pytest.raises(review_.BadReview) as caught:
        asyncio.run(
            screener.screen(lists, mode="enforce", max_containers=1000, caller="api-server")
        )
    assert str(caught.value) == (
        f"request body holds {own + offload.MAX_STRUCTURES + 1:,} lists and objects, more "
        f"than the {offload.MAX_STRUCTURES:,} an AdmissionReview may hold"
    )
    obj = pod(PROM_IMAGE)
    obj["metadata"]["annotations"] = {"brackets": "[" * (2 * offload.MAX_STRUCTURES)}
    handed = asyncio.run(
        screener.screen(
            orjson.dumps(review(obj)), mode="enforce", max_containers=1000, caller="api-server"
        )
    )
    assert isinstance(handed, review_.Review)
