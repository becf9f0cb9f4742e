"""Admission grants by namespace label from mirrorgate's own Namespace cache, never the review."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from mirrorgate import policy
from mirrorgate.webhook import admission, cli, review
from mirrorgate.webhook.admissioncache import AdmissionCache
from mirrorgate.webhook.cluster import kube, policyobjects
from mirrorgate.webhook.cluster.optin import NamespaceOptIn
from mirrorgate.webhook.commands import audit_report, cluster_audit, explain
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.mirrorhealth import monitor
from tests.webhook.fakes import ListingKube, RecordingPullSecrets
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


# --- mirrorgate audit ------------------------------------------------------------------------

LABELS = {"made-by-a": {TEAM: "a"}, "other": {TEAM: "b"}, "bare": {}}


def _audit(
    cluster: ListingKube, namespaces: list[str] | None = None, err: io.StringIO | None = None
) -> audit_report.Report:
    return cluster_audit.audit_cluster(
        cluster,  # type: ignore[arg-type]
        POLICY,
        namespaces=namespaces,
        policy_path="policy.yaml",
        err=err if err is not None else io.StringIO(),
    )


def _verdict(report: audit_report.Report, namespace: str) -> audit_report.Verdict:
    (tally,) = report.namespaces[namespace].images.values()
    return tally.verdict


def test_audit_grants_by_the_namespace_labels_it_reads() -> None:
    """audit reports, namespace by namespace, what admission does with those labels in its
    Namespace cache: the selected namespace's image is rewritten, the others' are not granted."""
    cluster = ListingKube(namespaces=dict(LABELS), pods={ns: [pod(IMAGE)] for ns in LABELS})
    report = _audit(cluster)
    secrets, cache = RecordingPullSecrets(labels=dict(LABELS)), AdmissionCache()
    for namespace in LABELS:
        verdict = _verdict(report, namespace)
        admitted = apply(pod(IMAGE), patch_ops(_admit(secrets, namespace, cache)))
        assert (verdict.new_image or IMAGE) == admitted["spec"]["containers"][0]["image"], namespace
    granted = _verdict(report, "made-by-a")
    assert (granted.outcome, granted.new_image, granted.credential) == (
        "rewrite",
        "m.example/quay/org/app:1",
        "robot",
    )
    refused = _verdict(report, "other")
    assert refused.outcome == "not-granted"
    assert refused.reason == (
        "credential 'robot' of mirrors[0] is not granted to namespace 'other'; left as written"
    )
    # -n reads the same labels, one Namespace at a time: the same report.
    named = _audit(ListingKube(namespaces=dict(LABELS), pods=cluster.pods), list(LABELS))
    assert named.to_json()["namespaces"] == report.to_json()["namespaces"]


def test_audit_reads_the_namespaces_once_not_per_pod() -> None:
    """-A lists the Namespaces once; -n gets each named one once, however many Pods."""
    pods = {ns: [pod(IMAGE, name=f"p{i}") for i in range(600)] for ns in LABELS}
    everywhere = ListingKube(namespaces=dict(LABELS), pods=pods)
    report = _audit(everywhere)
    assert sum(ns.pods for ns in report.namespaces.values()) == 1800
    namespace_reads = [p for p in everywhere.reads if not p.endswith("/pods")]
    assert namespace_reads == [kube.namespaces_path()]
    named = ListingKube(namespaces=dict(LABELS), pods=pods)
    _audit(named, ["made-by-a", "other"])
    namespace_reads = [p for p in named.reads if not p.endswith("/pods")]
    assert namespace_reads == [kube.namespaces_path("made-by-a"), kube.namespaces_path("other")]


def test_audit_of_a_namespace_it_may_not_read_grants_as_admission_before_its_cache_syncs() -> None:
    """Labels not known: only names grant, and the reason says why, as admission warns."""
    cluster = ListingKube(namespaces={"made-by-a": None}, pods={"made-by-a": [pod(IMAGE)]})
    err = io.StringIO()
    report = _audit(cluster, ["made-by-a"], err)
    assert err.getvalue().startswith("warning: not allowed to get namespace 'made-by-a'")
    assert report.namespaces["made-by-a"].mode == "unknown"
    verdict = _verdict(report, "made-by-a")
    assert verdict.outcome == "not-granted"
    assert "namespaceSelector reads, are not known yet" in str(verdict.reason)


def test_audit_health_keeps_the_grant_by_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrites are judged again with the probed health: with the same labels."""
    monkeypatch.setattr(monitor, "probe_mirrors", lambda mirror_policy, hosts: policy.HEALTHY)
    cluster = ListingKube(namespaces=dict(LABELS), pods={"made-by-a": [pod(IMAGE)]})
    report = _audit(cluster)
    cluster_audit.add_mirror_health(report)
    verdict = _verdict(report, "made-by-a")
    assert (verdict.outcome, verdict.credential, verdict.health) == ("rewrite", "robot", "up")


# --- audit with the policy objects, as the server composes them ------------------------------

API = "mirrorgate.io/v1alpha1"
OBJECT_LABELS = {"team-a": {TEAM: "a"}, "team-b": {TEAM: "b"}, "other": {}}
BASE = {
    "apiVersion": API,
    "kind": "ClusterMirrorPolicy",
    "metadata": {"name": "base", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {
        "credentials": {
            "shared": {"namespaces": list(OBJECT_LABELS)},
            "robot-a": {"namespaceSelector": {"matchLabels": {TEAM: "a"}}},
        },
        "mirrors": [{"source": "quay.io", "mirror": "m.example/quay", "credential": "shared"}],
    },
}


def _team(namespace: str) -> dict[str, Any]:
    """A MirrorPolicy sending quay.io to the team's own mirror with robot-a, which only a
    namespace labelled team=a is granted."""
    return {
        "apiVersion": API,
        "kind": "MirrorPolicy",
        "metadata": {
            "name": "quay",
            "namespace": namespace,
            "creationTimestamp": "2026-01-02T00:00:00Z",
        },
        "spec": {
            "mirrors": [
                {
                    "source": "quay.io",
                    "mirror": f"team.example/{namespace}",
                    "credential": "robot-a",
                }
            ]
        },
    }


def _objects_cluster(**changes: Any) -> ListingKube:
    given: dict[str, Any] = {
        "namespaces": dict(OBJECT_LABELS),
        "pods": {ns: [pod(IMAGE)] for ns in OBJECT_LABELS},
        "objects": [BASE, _team("team-a"), _team("team-b")],
    }
    return ListingKube(**(given | changes))


def _audit_objects(
    cluster: ListingKube, namespaces: list[str] | None = None
) -> audit_report.Report:
    return cluster_audit.audit_cluster(
        cluster,  # type: ignore[arg-type]
        None,
        namespaces=namespaces,
        policy_path=cluster_audit.CLUSTER_OBJECTS,
        err=io.StringIO(),
    )


def test_audit_judges_each_namespace_with_its_accepted_mirror_policies() -> None:
    """Without a policy file audit reads the objects and judges each namespace with the
    policy the server composes for it: team-a's MirrorPolicy sends its Pods to the team's
    mirror; team-b's names a credential not granted there, so it is in force nowhere and
    the ClusterMirrorPolicy's rule applies, as in a namespace without a MirrorPolicy."""
    cluster = _objects_cluster()
    report = _audit_objects(cluster)
    mine = _verdict(report, "team-a")
    assert (mine.outcome, mine.new_image, mine.credential) == (
        "rewrite",
        "team.example/team-a/org/app:1",
        "robot-a",
    )
    assert "MirrorPolicy team-a/quay" in str(mine.rule)
    for namespace in ("team-b", "other"):
        theirs = _verdict(report, namespace)
        assert (theirs.outcome, theirs.new_image, theirs.credential) == (
            "rewrite",
            "m.example/quay/org/app:1",
            "shared",
        ), namespace
        assert "ClusterMirrorPolicy base" in str(theirs.rule), namespace
    # Each kind listed once, cluster-wide, after the Namespaces.
    assert [p for p in cluster.reads if not p.endswith("/pods")] == [
        kube.namespaces_path(),
        policyobjects.objects_path(policy.CLUSTER_KIND),
        policyobjects.objects_path(policy.NAMESPACED_KIND),
    ]
    # The server's own composition of the same objects and labels serves the same policies.
    served = policyobjects.compose_stored(
        {policyobjects.key_of(o): o for o in cluster.objects or ()}, OBJECT_LABELS
    )
    refused = policy.ObjectKey(policy.NAMESPACED_KIND, "quay", "team-b")
    assert served.verdicts[refused].reason == "NotGranted"
    for namespace, ns in report.namespaces.items():
        assert ns.mirror_policy is not None
        assert ns.mirror_policy.rules == served.loaded.policy_for(namespace).rules, namespace


def test_audit_health_probes_each_namespace_s_mirrors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrites are judged again with the health of their own namespace's mirrors: the
    team's mirror and the cluster's, each probed once."""
    probed: list[str] = []

    def probe(mirror_policy: policy.Policy, hosts: list[str]) -> policy.Health:
        probed.extend(hosts)
        return policy.Health(down={"team.example": "connection refused"})

    monkeypatch.setattr(monitor, "probe_mirrors", probe)
    report = _audit_objects(_objects_cluster())
    cluster_audit.add_mirror_health(report)
    assert sorted(probed) == ["m.example", "team.example"]
    assert "connection refused" in str(_verdict(report, "team-a").health)
    assert _verdict(report, "other").health == "up"


def test_audit_grants_a_mirror_policy_by_the_labels_it_reads() -> None:
    """The same MirrorPolicy in team-b is in force once team-b is labelled team=a: the grant
    is judged with the labels audit read, and a label removed revokes it."""
    labels = {**OBJECT_LABELS, "team-b": {TEAM: "a"}}
    report = _audit_objects(_objects_cluster(namespaces=labels))
    assert _verdict(report, "team-b").new_image == "team.example/team-b/org/app:1"


def test_audit_of_named_namespaces_reads_only_their_mirror_policies() -> None:
    """-n reads every ClusterMirrorPolicy and the named namespaces' MirrorPolicies only."""
    cluster = _objects_cluster()
    report = _audit_objects(cluster, ["team-a", "other"])
    assert set(report.namespaces) == {"team-a", "other"}
    assert _verdict(report, "team-a").new_image == "team.example/team-a/org/app:1"
    assert _verdict(report, "other").new_image == "m.example/quay/org/app:1"
    assert [p for p in cluster.reads if "/apis/" in p] == [
        policyobjects.objects_path(policy.CLUSTER_KIND),
        policyobjects.objects_path(policy.NAMESPACED_KIND, "team-a"),
        policyobjects.objects_path(policy.NAMESPACED_KIND, "other"),
    ]


def test_audit_without_the_policy_crds_has_no_policy() -> None:
    """CRDs not installed (404 on the list): no objects, so nothing is rewritten, as the
    server serves no rules without them and without a file."""
    report = _audit_objects(_objects_cluster(objects=None))
    assert {_verdict(report, ns).outcome for ns in OBJECT_LABELS} == {"unmatched"}


def test_audit_forbidden_to_list_mirror_policies_says_so() -> None:
    class Forbidding(ListingKube):
        def list(self, path: str, **query: Any) -> tuple[list[dict[str, Any]], str]:
            if path.endswith("/mirrorpolicies"):
                raise kube.Forbidden(403, "Forbidden", "cannot list mirrorpolicies")
            return super().list(path, **query)

    cluster = Forbidding(namespaces=dict(OBJECT_LABELS), pods={}, objects=[BASE])
    with pytest.raises(ConfigError, match="not allowed to list mirrorpolicies at the cluster"):
        _audit_objects(cluster)


def test_audit_command_reads_the_objects_unless_given_a_policy_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`mirrorgate audit` without --policy judges with the objects; with --policy FILE the
    file alone is the policy, as before (the objects are not read)."""
    cluster = _objects_cluster()
    monkeypatch.setattr(kube.Kube, "connect", staticmethod(lambda **_: cluster))
    out = io.StringIO()
    status = cli.main(["audit", "--no-health", "-o", "json"], out=out, err=io.StringIO())
    assert status == 0
    found = json.loads(out.getvalue())
    assert found["policy"] == "cluster objects"
    images = {ns["name"]: ns["images"][0]["new_image"] for ns in found["namespaces"]}
    assert images == {
        "team-a": "team.example/team-a/org/app:1",
        "team-b": "m.example/quay/org/app:1",
        "other": "m.example/quay/org/app:1",
    }
    path = tmp_path / "policy.yaml"
    path.write_text("mirrors: [{source: quay.io, mirror: file.example/quay}]\ncredentials: {}\n")
    cluster.reads.clear()
    out = io.StringIO()
    argv = ["audit", "--policy", str(path), "--no-health", "-o", "json"]
    assert cli.main(argv, out=out, err=io.StringIO()) == 0
    found = json.loads(out.getvalue())
    assert {ns["images"][0]["new_image"] for ns in found["namespaces"]} == {
        "file.example/quay/org/app:1"
    }
    assert not [p for p in cluster.reads if "/apis/" in p]


def test_audit_of_a_policy_file_of_objects_composes_it_with_the_labels_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--policy FILE of objects is judged per namespace, as explain judges it, with the
    labels audit read (robot-a is granted to team-a by its label); the cluster's stored
    objects are not read."""
    cluster = _objects_cluster(objects=[])
    monkeypatch.setattr(kube.Kube, "connect", staticmethod(lambda **_: cluster))
    path = tmp_path / "objects.yaml"
    path.write_text(json.dumps(BASE) + "\n---\n" + json.dumps(_team("team-a")) + "\n")
    out = io.StringIO()
    argv = ["audit", "--policy", str(path), "--no-health", "-o", "json"]
    assert cli.main(argv, out=out, err=io.StringIO()) == 0
    found = json.loads(out.getvalue())
    images = {ns["name"]: ns["images"][0]["new_image"] for ns in found["namespaces"]}
    assert images == {
        "team-a": "team.example/team-a/org/app:1",
        "team-b": "m.example/quay/org/app:1",
        "other": "m.example/quay/org/app:1",
    }
    assert not [p for p in cluster.reads if "/apis/" in p]
