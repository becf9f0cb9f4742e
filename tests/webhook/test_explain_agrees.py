"""`mirrorgate explain` says what admission does: the same outcome, result and warning.

Each case runs `explain` through the command line and a one-container Pod
through :func:`webhook.admission.admit`, and compares what they report, and
what admission's patch actually does to the image.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.webhook import admission, cli, policyfile
from mirrorgate.webhook import review as reviews
from tests.webhook import policies
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.reviews import apply, patch_ops, pod, review

# The test policy with its credential granted to team-* only, and a mirror path long
# enough that some names would pass 255 characters on it.
LONG_PATH = "/".join(["abcdefghij"] * 12)
POLICY = policies.policy_yaml(prometheus_mirror=f"mirror.corp.example/{LONG_PATH}").replace(
    'namespaces: ["*"]', 'namespaces: ["team-*"]'
)
ON_MIRROR = "harbor.corp.example/dockerhub-proxy/library/nginx:1.27"
SKIP = {"mirrorgate.io/skip": "true"}
# A repository name past 255 characters once under the long mirror path.
TOO_LONG_ON_MIRROR = f"quay.io/prometheus/{LONG_PATH}:1"

CASES = [
    # namespace, labels, image, outcome
    ("kube-system", {}, "nginx", "excluded"),  # always excluded, grant or not
    ("excluded-ns", {}, "nginx:1.27", "excluded"),
    ("kube-system", {}, "Nginx", "excluded"),  # before the image is even read
    ("team-a", SKIP, "nginx:1.27", "skipped"),
    ("other", SKIP, "nginx:1.27", "skipped"),
    ("team-a", {"mirrorgate.io/skip": "false"}, "nginx:1.27", "rewrite"),
    ("team-a", {}, "nginx:1.27", "rewrite"),
    ("other", {}, "quay.io/prometheus/prometheus:v2", "rewrite"),  # no credential needed
    ("other", {}, "nginx:1.27", "not-granted"),
    ("team-a", {}, "registry.example.org/app:1", "no-rule"),
    ("team-a", {}, ON_MIRROR, "already-mirrored"),
    ("other", {}, ON_MIRROR, "already-mirrored"),  # with a warning: no grant here
    ("team-a", {}, "registry.k8s.io/pause:3.10", "excluded"),
    ("team-a", {}, "Nginx", "invalid"),
    ("team-a", {}, TOO_LONG_ON_MIRROR, "invalid"),
]


@pytest.fixture(scope="module")
def policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("explain") / "policy.yaml"
    path.write_text(POLICY)
    return path


class Case(NamedTuple):
    """One image of a one-container Pod in a namespace, with the Pod's labels."""

    namespace: str
    labels: dict[str, str]
    image: str
    pull_policy: str | None = None
    """The container's imagePullPolicy (None: not written)."""


def explain(policy_path: Path, case: Case) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    args = [arg for key, value in case.labels.items() for arg in ("-l", f"{key}={value}")]
    if case.pull_policy is not None:
        args += ["--pull-policy", case.pull_policy]
    code = cli.main(
        ["explain", "--policy", str(policy_path), "-n", case.namespace, *args, case.image],
        out=out,
        err=err,
    )
    explained = json.loads(out.getvalue())
    assert code == (1 if explained["warning"] or not explained["valid"] else 0), err.getvalue()
    assert isinstance(explained, dict)
    return explained


def admit(policy_path: Path, case: Case) -> tuple[admission.Decision, dict[str, Any]]:
    """Admission's decision on a one-container Pod, and the Pod as the API server stores it."""
    obj = pod(case.image)
    obj["metadata"]["labels"] = case.labels
    if case.pull_policy is not None:
        obj["spec"]["containers"][0]["imagePullPolicy"] = case.pull_policy
    body = review(obj, namespace=case.namespace)
    mirror_policy = policyfile.read_policy(policy_path).policy
    decision = asyncio.run(
        admission.admit(
            reviews.decode(orjson.dumps(body)),
            mirror_policy=mirror_policy,
            mode="enforce",
            secrets=RecordingPullSecrets(),
        )
    )
    response: dict[str, Any] = dict(decision.body["response"])
    return decision, apply(obj, patch_ops(response))


def assert_agree(policy_path: Path, case: Case) -> str:
    explained = explain(policy_path, case)
    decision, admitted = admit(policy_path, case)
    assert decision.plan is not None
    assert explained["outcome"] == decision.plan.outcomes["containers/c0"]
    assert explained["result"] == admitted["spec"]["containers"][0]["image"]
    warnings = decision.body["response"].get("warnings", [])
    expected = [f"containers/c0: {explained['warning']}"] if explained["warning"] else []
    assert warnings == expected
    outcome = explained["outcome"]
    assert isinstance(outcome, str)
    return outcome


@pytest.mark.parametrize(("namespace", "labels", "image", "outcome"), CASES)
def test_explain_agrees_with_admission(
    policy_path: Path, namespace: str, labels: dict[str, str], image: str, outcome: str
) -> None:
    """The outcome, the resulting image and the warning are admission's, for every outcome."""
    assert assert_agree(policy_path, Case(namespace, labels, image)) == outcome


PULL_POLICY_CASES = [
    # namespace, image, imagePullPolicy, outcome
    ("team-a", "nginx:1.27", "Never", "pull-policy-never"),
    ("other", "nginx:1.27", "Never", "pull-policy-never"),  # no grant needed: never pulled
    ("team-a", "nginx:1.27", "IfNotPresent", "rewrite"),
    ("team-a", "registry.example.org/app:1", "Never", "no-rule"),
    ("team-a", "registry.k8s.io/pause:3.10", "Never", "excluded"),
]


@pytest.mark.parametrize(("namespace", "image", "pull_policy", "outcome"), PULL_POLICY_CASES)
def test_explain_agrees_with_admission_on_the_pull_policy(
    policy_path: Path, namespace: str, image: str, pull_policy: str, outcome: str
) -> None:
    assert assert_agree(policy_path, Case(namespace, {}, image, pull_policy)) == outcome


def test_the_table_covers_every_offline_outcome() -> None:
    """Every outcome explain can give has a case (the admission-only ones need a cluster)."""
    covered = {case[3] for case in CASES} | {case[3] for case in PULL_POLICY_CASES}
    assert covered == set(policy.IMAGE_OUTCOMES) - {
        "credential-unavailable",
        "mirror-unhealthy",
    }


@settings(max_examples=60, deadline=None)
@given(
    namespace=st.sampled_from(["team-a", "team-b", "other", "kube-system", "excluded-ns"]),
    skip=st.sampled_from([None, "true", "false", "True"]),
    image=st.sampled_from([case[2] for case in CASES])
    | st.from_regex(
        r"[a-z]{1,8}(\.[a-z]{2,4})?(/[a-z]{1,6}){0,2}(:[a-z0-9]{1,4})?", fullmatch=True
    ),
)
def test_explain_agrees_with_admission_property(
    policy_path: Path, namespace: str, skip: str | None, image: str
) -> None:
    """Any namespace, skip label and image: explain and admission agree."""
    labels = {} if skip is None else {"mirrorgate.io/skip": skip}
    assert assert_agree(policy_path, Case(namespace, labels, image)) in policy.IMAGE_OUTCOMES
