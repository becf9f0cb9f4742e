"""Thousands of malformed reviews: always a 200 or a 400 AdmissionReview, never a crash."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonpatch
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webhook import strategies
from tests.webhook.harness import Harness, make_harness
from tests.webhook.reviews import PROM_IMAGE, PROM_MIRRORED, apply, patch_ops, pod, review
from tests.webhook.scrape import samples, value

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """One app for every example (Hypothesis does not reset function-scoped fixtures)."""
    made = make_harness(tmp_path_factory.mktemp("fuzz"))
    with made.client:
        yield made


def expected_uid(raw: bytes) -> str | None:
    """The uid the answer must carry, when the body lets one be read ("" when it cannot)."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ""
    request = document.get("request") if isinstance(document, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) else ""


def check(harness: Harness, raw: bytes, endpoint: str = "/mutate") -> dict[str, Any]:
    response = harness.client.post(
        endpoint, content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code in (200, 400), (response.status_code, response.text[:500])
    assert "Traceback" not in response.text
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert answer["kind"] == "AdmissionReview"
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    result = answer["response"]
    assert result["uid"] == expected_uid(raw)
    if response.status_code == 400:
        assert result["allowed"] is False
        assert result["status"]["code"] == 400
        assert result["status"]["message"]
    else:
        assert result["uid"], "a 200 answer always names its request"
        ops = patch_ops(result)
        if ops:
            # A patch the API server cannot apply fails the Pod's creation.
            # Applied in place to a fresh decoding: a copy would recurse
            # through objects nested thousands deep.
            obj = orjson.loads(raw)["request"]["object"]
            jsonpatch.apply_patch(obj, ops, in_place=True)
    assert isinstance(result, dict)
    return result


@settings(FUZZ, max_examples=1000)
@given(raw=strategies.mutated_reviews(), endpoint=st.sampled_from(["/mutate", "/audit"]))
def test_mutated_reviews(fuzzed: Harness, raw: bytes, endpoint: str) -> None:
    """Valid reviews with fields deleted, replaced or added: 200 or 400, uid echoed."""
    check(fuzzed, raw, endpoint)


@settings(FUZZ, max_examples=250)
@given(raw=strategies.truncated_reviews() | strategies.corrupted_reviews())
def test_truncated_and_corrupted_reviews(fuzzed: Harness, raw: bytes) -> None:
    """Cut-off and byte-flipped encodings: a 400 saying so (or a 200 if still a review)."""
    check(fuzzed, raw)


@settings(FUZZ, max_examples=200)
@given(raw=strategies.deeply_nested_reviews())
def test_deeply_nested_reviews(fuzzed: Harness, raw: bytes) -> None:
    """Nesting thousands deep in any field is refused or handled, never a recursion crash."""
    check(fuzzed, raw)


@settings(FUZZ, max_examples=300)
@given(raw=st.binary(max_size=256) | strategies.any_json_documents)
def test_arbitrary_bodies(fuzzed: Harness, raw: bytes) -> None:
    """Random bytes and random JSON documents are 400s (or 200s if they happen to be valid)."""
    check(fuzzed, raw)


@settings(FUZZ, max_examples=250)
@given(review=strategies.valid_reviews())
def test_valid_reviews_patch_cleanly(fuzzed: Harness, review: dict[str, Any]) -> None:
    """Every valid review gets a 200 whose patch applies to the object it was made for."""
    result = check(fuzzed, orjson.dumps(review))
    assert result["allowed"] is True


@settings(FUZZ, max_examples=150)
@given(
    length=st.sampled_from([779, 780, 781, 5_000, 300_000]),
    unique=st.uuids(),
    field=st.sampled_from(["containers", "initContainers"]),
)
def test_huge_and_unique_images(fuzzed: Harness, length: int, unique: object, field: str) -> None:
    """Unique images up to and past the longest valid reference: answered, bounded, not kept."""
    image = f"quay.io/prometheus/{unique}-"
    image += "a" * (length - len(image))
    result = check(fuzzed, orjson.dumps(review(pod(image, field=field))))
    for warning in result.get("warnings", []):
        assert len(warning) < 2_000
    cache = fuzzed.runtime.admission_cache
    assert cache.held <= cache.max_bytes
    assert len(cache) <= cache.max_entries
    assert not cache.resolved(image) or length <= 780


def test_a_real_request_still_works_after_the_storm(fuzzed: Harness) -> None:
    """After every example above (same app), an ordinary review is answered correctly."""
    obj = pod(PROM_IMAGE)
    patched = apply(obj, patch_ops(fuzzed.mutate(review(obj))))
    assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED
    metrics = fuzzed.client.get("/metrics").text
    page = samples(metrics)
    for endpoint in ("mutate", "audit"):
        assert value(page, "mirrorgate_errors_total", endpoint=endpoint, reason="internal") == 0
