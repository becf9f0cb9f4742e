"""The policy objects in `serve`: the apply-time judgement of /validate-policy, the status the
leader writes, and serve without a policy file. The real API server's side is
tests/e2e/api/test_policy_objects.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from mirrorgate import policy
from mirrorgate.webhook import policyfile, policyreview
from mirrorgate.webhook.cluster import policyobjects, policystatus
from mirrorgate.webhook.commands.serve.policies import ServedPolicy
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.errors import ConfigError
from tests.webhook.reviews import review

CLUSTER = {"group": "mirrorgate.io", "version": "v1alpha1", "kind": "ClusterMirrorPolicy"}
TEAM = {"group": "mirrorgate.io", "version": "v1alpha1", "kind": "MirrorPolicy"}


def _object(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> Any:
    metadata: dict[str, Any] = {"name": name, "generation": 1}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": policy.API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


PLATFORM = _object(
    "ClusterMirrorPolicy",
    "platform",
    {
        "mirrors": [{"source": "docker.io", "mirror": "hub.corp.example/proxy", "fixed": True}],
        "credentials": {"team-b-robot": {"namespaces": ["team-b"]}},
    },
)


def _stored(namespace: str | None) -> policyreview.Context:
    return (policy.parse_object(PLATFORM),), {}


def _judged(obj: Any, kind: dict[str, str], namespace: str | None) -> dict[str, Any]:
    body = orjson.dumps(review(obj, kind=kind, namespace=namespace))
    answer, _ = policyreview.judge_body(body, _stored)
    return dict(answer["response"])


def test_a_mirror_policy_naming_a_credential_not_granted_is_refused_naming_it() -> None:
    spec = {
        "mirrors": [
            {"source": "ghcr.io", "mirror": "ghcr.corp.example/a", "credential": "team-b-robot"}
        ]
    }
    refused = _judged(_object("MirrorPolicy", "borrow", spec, "team-a"), TEAM, "team-a")
    assert refused["allowed"] is False
    message = refused["status"]["message"]
    assert message.startswith("MirrorPolicy team-a/borrow: refused (NotGranted):")
    assert "team-b-robot" in message
    # Where it is granted, the same rules are allowed.
    allowed = _judged(_object("MirrorPolicy", "own", spec, "team-b"), TEAM, "team-b")
    assert allowed["allowed"] is True


def test_a_fixed_rule_cannot_be_overridden_and_the_answer_says_so() -> None:
    spec = {"mirrors": [{"source": "docker.io", "mirror": "mine.example/hub"}]}
    refused = _judged(_object("MirrorPolicy", "hub", spec, "team-a"), TEAM, "team-a")
    assert refused["allowed"] is False
    assert "(FixedRule)" in refused["status"]["message"]
    assert "docker.io" in refused["status"]["message"]


def test_a_cluster_policy_claiming_a_source_another_holds_is_refused_naming_it() -> None:
    other = _object(
        "ClusterMirrorPolicy",
        "late",
        {"mirrors": [{"source": "docker.io", "mirror": "x.example/h"}]},
    )
    refused = _judged(other, CLUSTER, None)
    assert refused["allowed"] is False
    assert "ClusterMirrorPolicy platform" in refused["status"]["message"]


def test_a_bad_envelope_is_refused_with_the_field_not_a_traceback() -> None:
    bad = _object("MirrorPolicy", "Not_A_Name", {"mirrors": []}, "team-a")
    refused = _judged(bad, TEAM, "team-a")
    assert refused["allowed"] is False
    assert "metadata.name" in refused["status"]["message"]
    assert "Traceback" not in refused["status"]["message"]


def test_the_worker_hands_a_policy_object_back_unjudged() -> None:
    body = orjson.dumps(review(PLATFORM, kind=CLUSTER, namespace=None))
    assert policyreview.judge_in_worker(body) is None


def _verdict(accepted: bool, reason: Any = "Accepted", generation: int = 1) -> Any:
    return policy.Verdict(accepted, reason, "" if accepted else "spec.mirrors[0]: x", generation)


def test_status_is_written_when_it_differs_and_keeps_its_transition_time() -> None:
    stored: dict[str, Any] = {"metadata": {"generation": 1}}
    first = policystatus.status_of(_verdict(True), stored)
    assert first is not None
    assert first["observedGeneration"] == 1
    (condition,) = first["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Accepted",
        "True",
        "Accepted",
    )
    stored["status"] = first
    assert policystatus.status_of(_verdict(True), stored) is None  # nothing to write
    refused = policystatus.status_of(_verdict(False, "NotGranted"), stored)
    assert refused is not None
    assert refused["conditions"][0]["status"] == "False"
    assert refused["conditions"][0]["message"] == "spec.mirrors[0]: x"
    # A newer generation than the verdict's: the next composition judges it, not this one.
    stored["metadata"]["generation"] = 2
    assert policystatus.status_of(_verdict(False, "NotGranted"), stored) is None


def test_status_paths_name_the_subresource() -> None:
    cluster = policy.ObjectKey("ClusterMirrorPolicy", "platform")
    team = policy.ObjectKey("MirrorPolicy", "rules", "team-a")
    assert policystatus.status_path(cluster) == (
        "/apis/mirrorgate.io/v1alpha1/clustermirrorpolicies/platform/status"
    )
    assert policystatus.status_path(team) == (
        "/apis/mirrorgate.io/v1alpha1/namespaces/team-a/mirrorpolicies/rules/status"
    )


def test_an_unreadable_stored_object_is_refused_not_served() -> None:
    key = policy.ObjectKey("MirrorPolicy", "x", "team-a")
    objects, refused = policyobjects.read_objects(
        {key: {"apiVersion": "v9", "kind": "MirrorPolicy", "metadata": {"name": "x"}}}
    )
    assert objects == []
    assert refused[key].accepted is False
    assert refused[key].reason == "Invalid"


def test_serve_without_a_cluster_needs_a_policy_file() -> None:
    with pytest.raises(ConfigError, match="--policy FILE: required without a cluster"):
        ServedPolicy(None, client=None, state=None, metrics=Metrics(), interval=1.0)


def test_serve_in_a_cluster_needs_no_policy_file() -> None:
    """Before the objects are composed nothing is rewritten, and /readyz says why."""
    served = ServedPolicy(None, client=object(), state=None, metrics=Metrics(), interval=1.0)  # type: ignore[arg-type]
    assert served.file is None
    assert served.current().rules == ()
    assert served.loaded.policy_for("team-a").rules == ()


def test_with_no_object_stored_the_version_is_the_files() -> None:
    """The live version (/readyz, mirrorgate_policy_info) of a file served alone is the
    file's own, in a cluster as without one; an object stored makes it the composition's."""
    loaded = policyfile.read_policy("policy.yaml", data=b"mirrors: []\n")
    assert policyobjects._version(loaded, {}, {}) == loaded.version
    key = policy.ObjectKey("MirrorPolicy", "rules", "team-a")
    stored = {key: {"metadata": {"uid": "u1", "generation": 1}}}
    composed = policyobjects._version(loaded, stored, {})
    assert composed != loaded.version
    # A status write (no new generation) keeps it; a label of the team's namespace does not.
    assert policyobjects._version(loaded, stored, {"other": {"x": "y"}}) == composed
    assert policyobjects._version(loaded, stored, {"team-a": {"x": "y"}}) != composed


def test_a_new_composition_keeps_every_policy_that_did_not_change() -> None:
    """What serve composes after one MirrorPolicy changed: the cluster's policy and every
    other namespace's are the objects served before, so admission keeps their plans
    (webhook/admissioncache.py keys them by policy); the changed one is new."""
    objects = policyobjects.PolicyObjects(
        object(),  # type: ignore[arg-type]  # the informers are filled by hand: no API call
        file=None,
        labels=dict,
        publish=lambda composed: None,
    )
    cluster, teams = objects.informers
    cluster.items[("", "platform")] = PLATFORM
    for namespace in ("team-a", "team-b"):
        rule = {"source": "quay.io", "mirror": f"quay.corp.example/{namespace}"}
        teams.items[(namespace, "rules")] = _object(
            "MirrorPolicy", "rules", {"mirrors": [rule]}, namespace
        )
    before = objects.compose().loaded.composition
    objects.composed = policyobjects.Composed(
        policyfile.LoadedPolicy(policy=before.cluster, composition=before, version="v1", path=""),
        before.verdicts,
        {},
    )
    moved = _object(
        "MirrorPolicy",
        "rules",
        {"mirrors": [{"source": "quay.io", "mirror": "quay.corp.example/moved"}]},
        "team-b",
    )
    teams.items[("team-b", "rules")] = {**moved, "metadata": {**moved["metadata"], "generation": 2}}
    after = objects.compose().loaded.composition
    assert after.cluster is before.cluster
    assert after.namespaced["team-a"] is before.namespaced["team-a"]
    assert after.namespaced["team-b"] is not before.namespaced["team-b"]
    assert str(after.policy_for("team-b").resolve("quay.io/x/y:1").new_image) == (
        "quay.corp.example/moved/x/y:1"
    )
