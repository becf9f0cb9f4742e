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
    screened = asyncio.run(screener.screen(wide, mode="enforce", max_containers=1000))
    assert screened is not None
    assert not isinstance(screened, review_.Review)
    uid, dry_run, decision = screened
    assert (uid, dry_run, decision.outcome) == ("wide", True, "denied")
    assert decision.body["response"]["status"]["message"] == refused(2000, 1000)
    audited = asyncio.run(screener.screen(wide, mode="audit", max_containers=1000))
    assert audited is not None
    assert not isinstance(audited, review_.Review)
    assert audited[2].unmirrored == (("too-many-containers", 2000),)

    # Handed back to be planned here: decoded once, in the worker, and reduced to
    # what admission reads (the padding stays behind).
    narrow = orjson.dumps(padded(pod(PROM_IMAGE), uid="narrow"))
    handed = asyncio.run(screener.screen(narrow, mode="enforce", max_containers=1000))
    assert isinstance(handed, review_.Review)
    assert handed.uid == "narrow"
    assert len(orjson.dumps(handed.request)) < len(narrow) // 100
    assert handed == admission.for_planning(review_.decode(narrow))

    malformed = padded(pod(PROM_IMAGE), uid="bad", namespace="Not_A_Namespace")
    with pytest.raises(review_.BadReview) as caught:
        asyncio.run(screener.screen(orjson.dumps(malformed), mode="enforce", max_containers=1000))
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


def test_a_large_body_with_too_few_commas_for_a_wide_pod_skips_the_worker() -> None:
    """A 2.5 MB image is not a wide Pod: decoding it in the worker first would only cost."""
    long_image = orjson.dumps(padded(pod("quay.io/x/" + "a" * 2_500_000)))
    assert not offload.may_be_too_wide(long_image, admission.MAX_CONTAINERS)
    # The bound is exact for the leanest lists: 994 items have 993 commas, and eight lists
    # of them could hold 1,001 containers and image volumes; 993 items could hold 1,000.
    assert offload.may_be_too_wide(orjson.dumps([1] * 994), 1000)
    assert not offload.may_be_too_wide(orjson.dumps([1] * 993), 1000)
