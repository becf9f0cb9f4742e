"""/validate-policy: the policy ConfigMap judged at admission as `policy check` judges it."""

from __future__ import annotations

import asyncio
import json
from io import StringIO
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair
from mirrorgate.webhook import policyreview
from mirrorgate.webhook import review as review_
from mirrorgate.webhook.edge import app, offload
from mirrorgate.webhook.policyfile import boundedyaml
from tests.webhook import policies, serving
from tests.webhook.harness import Harness
from tests.webhook.reviews import review
from tests.webhook.scrape import samples, value

CONFIG_MAP = {"group": "", "version": "v1", "kind": "ConfigMap"}


def config_map(data: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "mirrorgate-policy", "namespace": "mirrorgate"},
        "data": data,
    }


def judged(harness: Harness, obj: Any, operation: str = "UPDATE") -> dict[str, Any]:
    answer = harness.post(
        "/validate-policy",
        review(obj, operation=operation, namespace="mirrorgate", kind=CONFIG_MAP),
    )
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == "3f1c2a9e-0000-4000-8000-000000000001"
    return response


def test_an_invalid_policy_is_denied_with_every_field_path(harness: Harness) -> None:
    response = judged(harness, config_map({"policy.yaml": policies.INVALID_POLICY}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    lines = response["status"]["message"].splitlines()
    assert lines[0] == (
        "ConfigMap mirrorgate/mirrorgate-policy data.policy.yaml: invalid policy (3 errors):"
    )
    assert [line.strip().split(":")[0] for line in lines[1:]] == list(policies.INVALID_POLICY_PATHS)
    assert "patch" not in response


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            {"policy.yaml": "mirrors: [\n"},
            "data.policy.yaml:2:1: not valid YAML",
            id="invalid-yaml",
        ),
        pytest.param({"other.yaml": "x"}, "data.policy.yaml: missing", id="no-policy-key"),
        pytest.param(None, "data.policy.yaml: missing", id="no-data"),
    ],
)
def test_an_unreadable_policy_is_denied(harness: Harness, data: Any, expected: str) -> None:
    response = judged(harness, config_map(data))
    assert response["allowed"] is False
    assert expected in response["status"]["message"]


def test_a_valid_policy_is_allowed_with_policy_checks_warnings(harness: Harness) -> None:
    response = judged(harness, config_map({"policy.yaml": policies.POLICY}), "CREATE")
    assert response["allowed"] is True
    assert response["warnings"] == [
        "ConfigMap mirrorgate/mirrorgate-policy data.policy.yaml: credentials.harbor-pull."
        'namespaces: "*" grants this credential to every opted-in namespace: anyone who can '
        "create a Pod in one can pull with it; name the namespaces that need it, or select "
        "them by an admin-only label (namespaceSelector)"
    ]
    assert "patch" not in response
    page = samples(harness.client.get("/metrics").text)
    assert value(page, "mirrorgate_policy_reviews_total", outcome="allowed") == 1


def test_a_review_without_a_config_map_is_a_bad_request(harness: Harness) -> None:
    response = harness.client.post(
        "/validate-policy", json=review("not an object", namespace="mirrorgate", kind=CONFIG_MAP)
    )
    assert response.status_code == 400
    assert "expected a ConfigMap" in response.json()["response"]["status"]["message"]
    page = samples(harness.client.get("/metrics").text)
    assert (
        value(page, "mirrorgate_errors_total", endpoint="validate-policy", reason="bad-request")
        == 1
    )


def alias_bomb(levels: int) -> str:
    """A few hundred bytes that stand for 10**levels strings once the aliases are expanded."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"credentials: {{c: {{namespaces: *a{levels - 1}}}}}", ""])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            alias_bomb(9),
            f"holds more than {boundedyaml.MAX_VALUES:,} values with its aliases expanded",
            id="alias-bomb",
        ),
        # libyaml's own bound, met before the loader's 64 levels.
        pytest.param(
            "a: " + "[" * 5000 + "]" * 5000, "exceeded maximum nesting depth", id="deep-nesting"
        ),
    ],
)
def test_a_hostile_document_is_denied_at_once(harness: Harness, text: str, expected: str) -> None:
    """Anyone who reaches the port can post a review: its policy is bounded before it is read."""
    response = judged(harness, config_map({"policy.yaml": text}))
    assert response["allowed"] is False
    assert expected in response["status"]["message"]


def test_a_policy_longer_than_the_bound_is_denied(harness: Harness) -> None:
    text = policies.POLICY + "#" * policyreview.MAX_REVIEWED_POLICY_BYTES
    response = judged(harness, config_map({"policy.yaml": text}))
    assert response["allowed"] is False
    assert response["status"]["message"].endswith(
        f"{len(text)} bytes; a policy is at most {policyreview.MAX_REVIEWED_POLICY_BYTES} bytes"
    )


LARGE = policies.POLICY + "#" * offload.LARGE_POLICY_REVIEW_BYTES + "\n"
"""A valid policy whose review is over LARGE_POLICY_REVIEW_BYTES (a comment makes it long)."""


def test_a_large_policy_review_is_judged_in_the_worker_process(
    harness: Harness, screener: offload.Screener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judging a policy holds the GIL: a long one must not run in the server's process."""
    harness.runtime.screener = screener
    judge, judged_here = policyreview.judge, []

    def judged_in_this_process(rev: review_.Review) -> review_.AdmissionReview:
        judged_here.append(len(orjson.dumps(rev.request)))
        return judge(rev)

    monkeypatch.setattr(policyreview, "judge", judged_in_this_process)
    assert judged(harness, config_map({"policy.yaml": LARGE}))["allowed"] is True
    invalid = judged(harness, config_map({"policy.yaml": policies.INVALID_POLICY + LARGE[-9000:]}))
    assert invalid["allowed"] is False
    assert invalid["status"]["message"].startswith(
        "ConfigMap mirrorgate/mirrorgate-policy data.policy.yaml: invalid policy"
    )
    assert judged_here == []  # the worker process has the real judge, this one the recording
    assert judged(harness, config_map({"policy.yaml": policies.POLICY}))["allowed"] is True
    assert len(judged_here) == 1  # a small one stays here
    assert judged_here[0] < offload.LARGE_POLICY_REVIEW_BYTES


def test_a_malformed_large_policy_review_is_a_bad_request(
    harness: Harness, screener: offload.Screener
) -> None:
    harness.runtime.screener = screener
    body = review("not an object", namespace="mirrorgate", kind=CONFIG_MAP, uid="bad")
    body["request"]["options"] = {"padding": "x" * offload.LARGE_POLICY_REVIEW_BYTES}
    answer = harness.client.post("/validate-policy", json=body)
    assert answer.status_code == 400
    assert answer.json()["response"]["uid"] == "bad"
    assert "expected a ConfigMap" in answer.json()["response"]["status"]["message"]


def test_the_worker_queue_of_policy_reviews_is_bounded(screener: offload.Screener) -> None:
    body = orjson.dumps(
        review(
            config_map({"policy.yaml": LARGE}),
            operation="UPDATE",
            namespace="mirrorgate",
            kind=CONFIG_MAP,
        )
    )

    async def one_too_many() -> list[policyreview.Judged | BaseException | None]:
        return await asyncio.gather(
            *[screener.judge_policy(body) for _ in range(offload.MAX_QUEUED_POLICY_REVIEWS + 1)],
            return_exceptions=True,
        )

    *queued, refused = asyncio.run(one_too_many())
    assert [
        isinstance(judged, tuple) and judged[0]["response"]["allowed"] for judged in queued
    ] == [True] * offload.MAX_QUEUED_POLICY_REVIEWS
    assert isinstance(refused, offload.Busy)
    # Once the queue has room again, the next is judged.
    judged = asyncio.run(screener.judge_policy(body))
    assert judged is not None
    assert judged[0]["response"]["allowed"] is True


def test_a_full_queue_refuses_the_policy_unjudged_saying_so(
    harness: Harness, screener: offload.Screener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webhook fails closed: never a 500, never a policy allowed that nobody read."""
    harness.runtime.screener = screener
    monkeypatch.setattr(offload, "MAX_QUEUED_POLICY_REVIEWS", 0)
    response = judged(harness, config_map({"policy.yaml": LARGE}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 429
    assert response["status"]["message"] == (
        "mirrorgate: 0 policy reviews are already waiting to be judged; this policy was not "
        "judged, try again"
    )
    page = samples(harness.client.get("/metrics").text)
    assert value(page, "mirrorgate_policy_reviews_total", outcome="denied") == 1


def test_without_a_worker_a_large_policy_is_judged_in_the_server(
    harness: Harness, workerless: offload.Screener
) -> None:
    harness.runtime.screener = workerless
    assert judged(harness, config_map({"policy.yaml": LARGE}))["allowed"] is True
    assert judged(harness, config_map({"policy.yaml": "mirrors: [\n" + LARGE}))["allowed"] is False


def test_refusals_are_logged_within_a_budget_keeping_each_new_kind(
    tmp_path: Path,
    serving_pair: KeyPair,
    ca: CertificateAuthority,
    log_lines: StringIO,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anyone who reaches the port can cause refusals: the log must not follow at their pace."""
    monkeypatch.setattr(app, "REFUSAL_LOG_INTERVAL", 2.0)
    sent = app.REFUSALS_LOGGED + 5
    with (
        serving.serve(tmp_path, pair=serving_pair, policy=policies.POLICY) as running,
        httpx.Client(
            base_url=running.url,
            verify=serving.client_context(ca.cert_pem),
            timeout=serving.TIMEOUT,
        ) as client,
    ):

        def post(data: Any) -> bool:
            answer = client.post(
                "/validate-policy",
                json=review(
                    config_map(data), operation="UPDATE", namespace="mirrorgate", kind=CONFIG_MAP
                ),
            )
            assert answer.status_code == 200
            return bool(answer.json()["response"]["allowed"])

        assert not any(post({"other.yaml": f"x{i}"}) for i in range(sent))
        assert not post({"policy.yaml": "mirrors: [\n"})  # a new kind, past the budget

        def entries() -> list[dict[str, Any]]:
            return [json.loads(line) for line in log_lines.getvalue().splitlines()]

        summary = serving.wait_for(
            lambda: next(
                (
                    e
                    for e in entries()
                    if e["msg"] == ("policy refused at admission: more not logged")
                ),
                None,
            ),
            what="the summary line",
            timeout=10.0,
        )
    refused = [e for e in entries() if e["msg"] == "policy refused at admission"]
    missing = [e for e in refused if "data.policy.yaml: missing" in e["error"]]
    assert len(missing) + summary["not_logged"] == sent
    assert len(missing) == app.REFUSALS_LOGGED
    assert summary["level"] == "warning"
    assert [e["error"] for e in refused if "not valid YAML" in e["error"]] == [
        "ConfigMap mirrorgate/mirrorgate-policy data.policy.yaml:2:1: not valid YAML: "
        "did not find expected node content"
    ]
