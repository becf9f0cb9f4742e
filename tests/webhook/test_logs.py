"""One structured JSON line per admission, and never the object itself."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

from tests.webhook.harness import Harness
from tests.webhook.reviews import HUB_IMAGE, NAMESPACE, PROM_IMAGE, pod, review

CANARY = "canary-7f3a9c-do-not-log"


def lines(stream: StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def secret_pod(**kwargs: Any) -> dict[str, Any]:
    """A Pod whose spec carries a canary in an env var value."""
    obj = pod(HUB_IMAGE, PROM_IMAGE, **kwargs)
    obj["spec"]["containers"][0]["env"] = [{"name": "DB_PASSWORD", "value": CANARY}]
    obj["spec"]["containers"][1]["args"] = ["--token", CANARY]
    return obj


def test_one_json_line_per_admission(harness: Harness, log_lines: StringIO) -> None:
    """The line names uid, namespace, Pod, mode, rewrites and duration."""
    harness.mutate(review(secret_pod(), uid="uid-log-1"))
    [entry] = [e for e in lines(log_lines) if e["msg"] == "admission"]
    assert entry["level"] == "info"
    assert entry["uid"] == "uid-log-1"
    assert entry["namespace"] == NAMESPACE
    assert entry["pod"] == "web"
    assert entry["endpoint"] == "mutate"
    assert entry["mode"] == "enforce"
    assert entry["outcome"] == "patched"
    assert entry["rewrites"] == 2
    assert entry["dry_run"] is False
    assert entry["policy"] == harness.runtime.policy.version
    assert isinstance(entry["duration_ms"], float)
    assert entry["duration_ms"] >= 0


def test_log_line_names_generate_name_pods(harness: Harness, log_lines: StringIO) -> None:
    """A Pod without a name yet is logged by its generateName."""
    harness.post("/audit", review(secret_pod(name=None, generate_name="web-5c9f-")))
    [entry] = lines(log_lines)
    assert entry["pod"] == "web-5c9f-"
    assert entry["mode"] == "audit"
    assert entry["rewrites"] == 2


def test_logs_never_contain_the_pod(harness: Harness, log_lines: StringIO) -> None:
    """Neither the spec nor any value inside it reaches the logs, on any path."""
    harness.mutate(review(secret_pod()))
    harness.mutate(review(secret_pod(), dry_run=True))
    harness.post("/audit", review(secret_pod()))
    harness.secrets.explode = True  # the internal-error path logs an exception
    harness.mutate(review(secret_pod()))
    body = review(secret_pod())
    del body["request"]["namespace"]  # a 400 for a Pod that carries the canary
    harness.client.post("/mutate", json=body)
    text = log_lines.getvalue()
    assert len(text.splitlines()) == 6  # four admissions, one exception, one bad request
    assert CANARY not in text
    assert "DB_PASSWORD" not in text
    assert '"spec"' not in text
    assert "containers" not in text


def test_bad_request_log_line_does_not_quote_the_request(
    harness: Harness, log_lines: StringIO
) -> None:
    """A review with the Pod where `kind` belongs is refused without logging the Pod."""
    body = review(secret_pod())
    body["kind"] = body["request"]["object"]  # a confused client: the object as the kind
    response = harness.client.post("/mutate", json=body)
    assert response.status_code == 400
    [entry] = lines(log_lines)
    assert entry["msg"] == "bad admission request"
    assert entry["uid"] == body["request"]["uid"]
    assert CANARY not in log_lines.getvalue()
