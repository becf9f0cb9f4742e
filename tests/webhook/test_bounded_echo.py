"""What a client sends is never echoed whole: responses and log lines quote bounded prefixes.

Each case failed before issue 10: the value came back, or went to the log,
at full length (an 8 MB Content-Type, a megabyte uid or namespace), or the
review was answered as an internal error.
"""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import orjson
import pytest

from tests.webhook.harness import Harness
from tests.webhook.reviews import PROM_IMAGE, PROM_MIRRORED, apply, patch_ops, pod, review

HUGE = 2_000_000
LIMIT = 4_000
"""Bytes a response or a log line may take here: far below the values sent."""


def answer(harness: Harness, document: Any, headers: dict[str, str] | None = None) -> Any:
    response = harness.client.post(
        "/mutate",
        content=orjson.dumps(document),
        headers=headers or {"content-type": "application/json"},
    )
    assert len(response.content) < LIMIT, response.content[:200]
    return response


def log_text(log_lines: StringIO) -> str:
    text = log_lines.getvalue()
    for line in text.splitlines():
        assert len(line) < LIMIT, line[:200]
    return text


def test_a_huge_content_type_is_quoted_as_a_prefix(harness: Harness, log_lines: StringIO) -> None:
    response = answer(
        harness, review(pod(PROM_IMAGE)), headers={"content-type": "text/" + "x" * HUGE}
    )
    assert response.status_code == 400
    message = response.json()["response"]["status"]["message"]
    assert message.startswith("Content-Type is 'text/xxx")
    assert f"({HUGE + 5} characters); expected application/json" in message
    log_text(log_lines)


def test_a_huge_uid_is_refused_and_not_echoed(harness: Harness, log_lines: StringIO) -> None:
    response = answer(harness, review(pod(PROM_IMAGE), uid="u" * HUGE))
    assert response.status_code == 400
    result = response.json()["response"]
    assert result["uid"] == ""
    assert result["status"]["message"] == (
        f"request.uid is {HUGE} characters; a uid has at most 128"
    )
    log_text(log_lines)


@pytest.mark.parametrize("namespace", ["n" * HUGE, "Team_A", "a" * 64])
def test_a_namespace_that_cannot_exist_is_refused(
    harness: Harness, log_lines: StringIO, namespace: str
) -> None:
    response = answer(harness, review(pod(PROM_IMAGE), namespace=namespace))
    assert response.status_code == 400
    assert "is not a namespace name" in response.json()["response"]["status"]["message"]
    log_text(log_lines)


def test_a_huge_pod_name_is_logged_as_a_prefix(harness: Harness, log_lines: StringIO) -> None:
    response = answer(harness, review(pod(PROM_IMAGE, name="p" * HUGE)))
    assert response.status_code == 200
    (entry,) = [
        json.loads(line) for line in log_text(log_lines).splitlines() if '"admission"' in line
    ]
    assert entry["pod"] == "p" * 253 + "…"


def test_a_huge_image_is_quoted_as_a_prefix(harness: Harness, log_lines: StringIO) -> None:
    image = "quay.io/prometheus/" + "a" * HUGE
    response = answer(harness, review(pod(image)))
    (warning,) = response.json()["response"]["warnings"]
    assert warning.endswith(
        f"({len(image)} characters) left as written: {len(image)} "
        "characters is longer than any valid reference (at most 780)"
    )


def test_a_container_name_beyond_any_valid_one_is_quoted_as_a_prefix(harness: Harness) -> None:
    obj = pod("Not A Reference")
    obj["spec"]["containers"][0]["name"] = "c" * HUGE
    (warning,) = answer(harness, review(obj)).json()["response"]["warnings"]
    assert warning.startswith("containers/'ccc")
    assert f"({HUGE} characters): image 'Not A Reference' left as written" in warning


def test_a_pull_secret_name_nested_a_thousand_deep_is_no_internal_error(
    harness: Harness, log_lines: StringIO
) -> None:
    obj = pod(PROM_IMAGE)
    obj["spec"]["imagePullSecrets"] = [{"name": "NESTED"}]
    raw = orjson.dumps(review(obj)).replace(b'"NESTED"', b"[" * 1000 + b'"x"' + b"]" * 1000)
    response = harness.client.post(
        "/mutate", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    result = response.json()["response"]
    assert "warnings" not in result
    assert apply(obj, patch_ops(result))["spec"]["containers"][0]["image"] == PROM_MIRRORED
    assert "internal" not in log_lines.getvalue()


def test_two_containers_of_one_name_keep_both_originals(harness: Harness) -> None:
    obj = pod(PROM_IMAGE, "quay.io/prometheus/alertmanager:v0.27.0")
    for container in obj["spec"]["containers"]:
        container["name"] = "app"
    patched = apply(obj, patch_ops(harness.mutate(review(obj))))
    originals = json.loads(patched["metadata"]["annotations"]["mirrorgate.io/original-images"])
    assert originals == {
        "containers[0]/app": PROM_IMAGE,
        "containers[1]/app": "quay.io/prometheus/alertmanager:v0.27.0",
    }
