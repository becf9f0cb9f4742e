"""/validate-policy: the policy ConfigMap judged at admission as `policy check` judges it."""

from __future__ import annotations

from typing import Any

import pytest

from mirrorgate.webhook import policyreview
from mirrorgate.webhook.policyfile import boundedyaml
from tests.webhook import policies
from tests.webhook.harness import Harness
from tests.webhook.reviews import review
from tests.webhook.scrape import samples, value

CONFIG_MAP = {"group": "", "version": "v1", "kind": "ConfigMap"}


def config_map(data: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "mirrorgate-policy", "namespace": "mirrorgate"}, "data": data}


def judged(harness: Harness, obj: Any, operation: str = "UPDATE") -> dict[str, Any]:
    answer = harness.post("/validate-policy", review(obj, operation=operation,
                                                      namespace="mirrorgate", kind=CONFIG_MAP))
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == "3f1c2a9e-0000-4000-8000-000000000001"
    return response


def test_an_invalid_policy_is_denied_with_every_field_path(harness: Harness) -> None:
    response = judged(harness, config_map({"policy.yaml": policies.INVALID_POLICY}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    lines = response["status"]["message"].splitlines()
    assert lines[0] == ("ConfigMap mirrorgate/mirrorgate-policy data.policy.yaml: invalid policy "
                        "(3 errors):")
    assert [line.strip().split(":")[0] for line in lines[1:]] == list(
        policies.INVALID_POLICY_PATHS)
    assert "patch" not in response


@pytest.mark.parametrize(("data", "expected"), [
    pytest.param({"policy.yaml": "mirrors: [\n"}, "data.policy.yaml:2:1: not valid YAML",
                 id="invalid-yaml"),
    pytest.param({"other.yaml": "x"}, "data.policy.yaml: missing", id="no-policy-key"),
    pytest.param(None, "data.policy.yaml: missing", id="no-data"),
])
def test_an_unreadable_policy_is_denied(harness: Harness, data: Any, expected: str) -> None:
    response = judged(harness, config_map(data))
    assert response["allowed"] is False
    assert expected in response["status"]["message"]


def test_a_valid_policy_is_allowed_with_policy_checks_warnings(harness: Harness) -> None:
    response = judged(harness, config_map({"policy.yaml": policies.POLICY}), "CREATE")
    assert response["allowed"] is True
    assert response["warnings"] == [
        'ConfigMap mirrorgate/mirrorgate-policy data.policy.yaml: credentials.harbor-pull.'
        'namespaces: "*" grants this credential to every opted-in namespace: anyone who can '
        "create a Pod in one can pull with it; name the namespaces or globs that need it"]
    assert "patch" not in response
    page = samples(harness.client.get("/metrics").text)
    assert value(page, "mirrorgate_policy_reviews_total", outcome="allowed") == 1


def test_a_review_without_a_config_map_is_a_bad_request(harness: Harness) -> None:
    response = harness.client.post("/validate-policy", json=review(
        "not an object", namespace="mirrorgate", kind=CONFIG_MAP))
    assert response.status_code == 400
    assert "expected a ConfigMap" in response.json()["response"]["status"]["message"]
    page = samples(harness.client.get("/metrics").text)
    assert value(page, "mirrorgate_errors_total", endpoint="validate-policy",
                 reason="bad-request") == 1



def alias_bomb(levels: int) -> str:
    """A few hundred bytes that stand for 10**levels strings once the aliases are expanded."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"credentials: {{c: {{namespaces: *a{levels - 1}}}}}", ""])


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param(alias_bomb(9),
                 f"holds more than {boundedyaml.MAX_VALUES:,} values with its aliases expanded",
                 id="alias-bomb"),
    # libyaml's own bound, met before the loader's 64 levels.
    pytest.param("a: " + "[" * 5000 + "]" * 5000, "exceeded maximum nesting depth",
                 id="deep-nesting"),
])
def test_a_hostile_document_is_denied_at_once(harness: Harness, text: str,
                                              expected: str) -> None:
    """Anyone who reaches the port can post a review: its policy is bounded before it is read."""
    response = judged(harness, config_map({"policy.yaml": text}))
    assert response["allowed"] is False
    assert expected in response["status"]["message"]


def test_a_policy_longer_than_the_bound_is_denied(harness: Harness) -> None:
    text = policies.POLICY + "#" * policyreview.MAX_REVIEWED_POLICY_BYTES
    response = judged(harness, config_map({"policy.yaml": text}))
    assert response["allowed"] is False
    assert response["status"]["message"].endswith(
        f"{len(text)} bytes; a policy is at most {policyreview.MAX_REVIEWED_POLICY_BYTES} bytes")
