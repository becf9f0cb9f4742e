"""Admission grants by namespace label from mirrorgate's own Namespace cache, never the review."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mirrorgate import policy
from mirrorgate.webhook import admission, review
from mirrorgate.webhook.admissioncache import AdmissionCache
from mirrorgate.webhook.cluster.optin import NamespaceOptIn
from mirrorgate.webhook.commands import explain
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.reviews import apply, patch_ops, pod
from tests.webhook.reviews import review as review_body

TEAM = "corp.example/team"
POLICY = policy.load(
    {
        "mirrors": [{"source": "quay.io", "mirror": "m.example/quay", "credential": "robot"}],
        "credentials": {"robot": {"namespaceSelector": {"matchLabels": {TEAM: "a"}}}},
    }
)
IMAGE = "quay.io/org/app:1"


def _admit(secrets: RecordingPullSecrets, namespace: str, cache: AdmissionCache) -> dict[str, Any]:
    body = review_body(pod(IMAGE), namespace=namespace)
    decision = asyncio.run(
        admission.admit(
            review.decode(json.dumps(body).encode()),
            mirror_policy=POLICY,
            mode=policy.ENFORCE,
            secrets=secrets,
            cache=cache,
        )
    )
    return dict(decision.body["response"])


def test_a_namespace_labelled_by_an_admin_is_granted() -> None:
    """The label in the cache grants; the same Pod elsewhere stays as written, saying why."""
    secrets = RecordingPullSecrets(labels={"made-by-a": {TEAM: "a"}, "other": {TEAM: "b"}})
    cache = AdmissionCache()
    granted = _admit(secrets, "made-by-a", cache)
    patched = apply(pod(IMAGE), patch_ops(granted))
    assert patched["spec"]["containers"][0]["image"] == "m.example/quay/org/app:1"
    assert patched["spec"]["imagePullSecrets"] == [{"name": "mirrorgate-robot"}]
    refused = _admit(secrets, "other", cache)
    assert patch_ops(refused) == []
    assert any("is not granted to namespace 'other'" in w for w in refused["warnings"])


def test_a_label_change_is_seen_by_the_next_admission() -> None:
    """Plans are kept by what the labels grant, so a relabelled namespace is planned anew."""
    secrets = RecordingPullSecrets(labels={"ns": {TEAM: "b"}})
    cache = AdmissionCache()
    assert patch_ops(_admit(secrets, "ns", cache)) == []
    secrets.labels["ns"] = {TEAM: "a"}
    assert patch_ops(_admit(secrets, "ns", cache)) != []
    assert cache.shapes == 2


def test_labels_not_known_grant_nothing_with_a_warning() -> None:
    """Before the Namespace cache has synced, only names grant; the warning says so."""
    response = _admit(RecordingPullSecrets(), "team-a", AdmissionCache())
    assert patch_ops(response) == []
    assert any("are not known yet" in w for w in response["warnings"]), response["warnings"]


def test_explain_grants_by_the_namespace_labels_given() -> None:
    """explain --namespace-label: the same decision as admission with those labels."""
    granted = explain.explain_image(
        IMAGE, mirror_policy=POLICY, namespace="ns", namespace_labels={TEAM: "a"}
    )
    assert (granted["outcome"], granted["result"]) == ("rewrite", "m.example/quay/org/app:1")
    refused = explain.explain_image(IMAGE, mirror_policy=POLICY, namespace="ns")
    assert (refused["outcome"], refused["result"]) == ("not-granted", IMAGE)


class _Client:
    """The informer is not started: its cache is filled as a watch would fill it."""


def test_the_namespace_cache_gives_labels_only_once_synced() -> None:
    """None before the first list, and for a namespace it does not hold; strings only."""
    optin = NamespaceOptIn(_Client())  # type: ignore[arg-type]
    optin.informer.items[("", "ns")] = {"metadata": {"name": "ns", "labels": {TEAM: "a"}}}
    assert optin.labels("ns") is None
    optin.informer.synced.set()
    assert optin.labels("ns") == {TEAM: "a"}
    assert optin.labels("absent") is None
