"""Least privilege and trust, against the real API server.

mirrorgate's ServiceAccount reads no Secret outside its own namespace (asked
of the API server's authorizer itself); what it knows of its copies is its own
record; it makes Secrets only where its own Namespace cache shows the opt-in,
whatever a review claims; and a deleted copy comes back by re-assertion.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.fixtures_secrets import (
    AUDIT_LABELS,
    ENFORCE_LABELS,
    MODE_LABEL,
    admission_review,
    as_dict,
    decoded_patch,
    elapsed,
    entries_with,
    list_secrets,
    pod_dict,
    post_review,
    read_secret,
    wait_log,
)
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import CREDENTIAL, RECONCILE_INTERVAL, Installed, MakeNamespace

pytestmark = pytest.mark.e2e

SECRET = policy.pull_secret_name(CREDENTIAL)
HEAL_BOUND = 2 * RECONCILE_INTERVAL + 10.0
"""A deleted copy is back within one reconcile interval plus the pass (at 20 copies a
second); twice the interval and 10 s of slack for this shared machine."""


def can(api: k8s.ApiClient, verb: str, resource: str, namespace: str | None) -> bool:
    """The API server's own answer: may mirrorgate's ServiceAccount do this?"""
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=mg.SERVICE_ACCOUNT_USER,
            groups=list(mg.SERVICE_ACCOUNT_GROUPS),
            resource_attributes=k8s.V1ResourceAttributes(
                verb=verb, resource=resource, namespace=namespace
            ),
        )
    )
    answer = k8s.AuthorizationV1Api(api).create_subject_access_review(review)
    assert answer.status is not None
    return bool(answer.status.allowed)


def record_of(api: k8s.ApiClient, namespace: str, secret: str) -> dict[str, Any] | None:
    try:
        return as_dict(
            api,
            k8s.CoreV1Api(api).read_namespaced_config_map(
                f"copy.{namespace}.{secret}", mg.NAMESPACE
            ),
        )
    except k8s.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_service_account_cannot_read_secrets_in_another_namespace(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """SubjectAccessReview: no get, list, watch or patch of Secrets outside its namespace."""
    with installed.control_plane.api_client() as api:
        other = make_namespace(ENFORCE_LABELS)
        # Every verb that returns a Secret's data: patch and deletecollection answer with
        # the objects, so they are reads too.
        reads = {
            (verb, namespace): can(api, verb, "secrets", namespace)
            for verb in ("get", "list", "watch", "patch", "deletecollection")
            for namespace in (other, "kube-system", None)
        }
        writes = {verb: can(api, verb, "secrets", other) for verb in ("create", "update", "delete")}
        own = {verb: can(api, verb, "secrets", mg.NAMESPACE) for verb in ("get", "list")}
    assert [key for key, allowed in reads.items() if allowed] == []
    # Controls: the same reviews do say yes where the manifests grant it.
    assert writes == {"create": True, "update": True, "delete": True}
    assert own == {"get": True, "list": True}


def test_forged_review_for_a_namespace_not_opted_in_creates_nothing(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """A review sent straight to the port for an unlabelled, audit or unknown namespace."""
    registry = installed.registry
    with installed.control_plane.api_client() as api:
        targets = {
            "unlabelled": make_namespace(),
            "audit": make_namespace(AUDIT_LABELS),
            "unknown": f"e2e-never-created-{secrets.token_hex(3)}",
        }
        answers: dict[str, dict[str, Any]] = {}
        with installed.server.client() as http:
            for label, namespace in targets.items():
                review = admission_review(
                    namespace, pod_dict("forged", registry.upstream_image, namespace=namespace)
                )
                status, body = post_review(http, review)
                assert status == 200, body
                answers[label] = body["response"]
        made = {
            label: list_secrets(api, namespace)
            for label, namespace in targets.items()
            if label != "unknown"
        }
        records = {label: record_of(api, namespace, SECRET) for label, namespace in targets.items()}
    assert made == {"unlabelled": [], "audit": []}
    assert records == dict.fromkeys(targets)
    for label, response in answers.items():
        assert response["allowed"] is True, (label, response)
        # Never a Pod pointing at the mirror without its pull secret.
        assert not any(
            op.get("value") == registry.mirror_image for op in decoded_patch(response)
        ), (label, response)
        assert any(
            f"namespace '{targets[label]}' is not labelled {MODE_LABEL}=enforce" in w
            for w in response.get("warnings", [])
        ), (label, response)
    refusals = entries_with(installed.server, "pull secret refused: namespace not opted in")
    assert {e["namespace"] for e in refusals} >= set(targets.values())


def test_records_hold_the_uid_and_a_keyed_fingerprint_only(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """The record of a copy: its uid and an HMAC, no credential and no unkeyed hash."""
    registry = installed.registry
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        kube.create_pod(api, namespace, pod_dict("web", registry.upstream_image))
        secret = read_secret(api, namespace, SECRET)
        record = record_of(api, namespace, SECRET)
    assert secret is not None
    assert record is not None
    payload = secret["data"][".dockerconfigjson"]
    unkeyed = hashlib.sha256(base64.b64decode(payload)).hexdigest()
    data = record["data"]
    assert data["uid"] == secret["metadata"]["uid"]
    assert data["namespace"] == namespace
    assert data["credential"] == CREDENTIAL
    assert len(data["fingerprint"]) == 64
    assert data["fingerprint"] != unkeyed
    text = str(record)
    assert registry.password not in text
    assert payload not in text


def test_deleted_copy_is_healed_within_the_bound(
    installed: Installed,
    make_namespace: MakeNamespace,
    record_property: Callable[[str, object], None],
) -> None:
    """Someone deletes a generated copy: the leader's re-assertion brings it back."""
    registry = installed.registry
    with installed.control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        namespace = make_namespace(ENFORCE_LABELS)
        core.create_namespaced_pod(namespace, pod_dict("web", registry.upstream_image))  # type: ignore[arg-type]
        before = read_secret(api, namespace, SECRET)
        assert before is not None
        since = time.monotonic()
        core.delete_namespaced_secret(SECRET, namespace)

        def back() -> str | None:
            return None if read_secret(api, namespace, SECRET) is not None else "still gone"

        wait_until(back, timeout=HEAL_BOUND, what="the deleted copy restored", interval=0.1)
        seconds = elapsed(since)
        after = read_secret(api, namespace, SECRET)
        wait_until(
            lambda: (
                None
                if (record_of(api, namespace, SECRET) or {}).get("data", {}).get("uid")
                == (after or {}).get("metadata", {}).get("uid")
                else "record not updated"
            ),
            timeout=10,
            what="record updated",
            interval=0.1,
        )
    record_property("heal_seconds", seconds)
    print(f"\nFIGURE heal_seconds={seconds} (bound {HEAL_BOUND} s)")
    assert after is not None
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert after["data"] == before["data"]
    wait_log(installed.server, "pull secret restored", secret=f"{namespace}/{SECRET}")


def _cluster_role(kustomize: Path, overlay: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in mg.render(kustomize, overlay)
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "mirrorgate"
    ]
    return found


def test_manifests_grant_no_secret_read_and_cert_manager_no_webhook_access(kustomize: Path) -> None:
    """Every overlay: no read verb on Secrets cluster-wide; with cert-manager, no access to
    the webhook configuration at all (cainjector keeps caBundle)."""
    reads = {"get", "list", "watch", "patch", "deletecollection", "*"}
    for overlay in ("base", "overlays/audit", "overlays/enforce", "overlays/cert-manager"):
        for rule in _cluster_role(kustomize, overlay)["rules"]:
            if "secrets" in rule["resources"] or "*" in rule["resources"]:
                assert not reads & set(rule["verbs"]), (overlay, rule)
    configurations = ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    resources = [r["resources"] for r in _cluster_role(kustomize, "overlays/cert-manager")["rules"]]
    assert not any(set(configurations) & set(r) for r in resources), resources
    assert configurations in [r["resources"] for r in _cluster_role(kustomize, "base")["rules"]]


def test_every_rbac_rule_says_why() -> None:
    """In manifests/base/rbac.yaml, a comment precedes every rule."""
    lines = (REPO_ROOT / "manifests" / "base" / "rbac.yaml").read_text().splitlines()
    uncommented = [
        n + 1
        for n, line in enumerate(lines)
        if line.strip().startswith("- apiGroups:") and not lines[n - 1].strip().startswith("#")
    ]
    assert uncommented == []


def _may(
    api: k8s.ApiClient,
    user: str,
    groups: list[str],
    verb: str,
    resource: str,
    namespace: str | None,
    subresource: str | None = None,
    group: str = "mirrorgate.io",
) -> bool:
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=user,
            groups=groups,
            resource_attributes=k8s.V1ResourceAttributes(
                group=group,
                verb=verb,
                resource=resource,
                subresource=subresource,
                namespace=namespace,
            ),
        )
    )
    answer = k8s.AuthorizationV1Api(api).create_subject_access_review(review)
    assert answer.status is not None
    return bool(answer.status.allowed)


def test_the_policy_objects_rbac_mirrorgate_reads_its_kinds_teams_write_their_own(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """Asked of the API server's authorizer: mirrorgate's ServiceAccount lists and watches
    both kinds cluster-wide and patches their status, and writes neither kind nor reads
    any ConfigMap outside its namespace. Through the aggregated ClusterRoles a team bound
    to `edit` (or `admin`) in its namespace writes MirrorPolicy there and nowhere else,
    `view` only reads it, and none of them writes a ClusterMirrorPolicy."""
    team = make_namespace()
    sa, sa_groups = mg.SERVICE_ACCOUNT_USER, list(mg.SERVICE_ACCOUNT_GROUPS)
    with installed.control_plane.api_client() as api:
        for kind in ("clustermirrorpolicies", "mirrorpolicies"):
            for verb in ("list", "watch"):
                assert _may(api, sa, sa_groups, verb, kind, None), (verb, kind)
            assert _may(api, sa, sa_groups, "patch", kind, None, subresource="status"), kind
            for verb in ("create", "update", "patch", "delete"):
                assert not _may(api, sa, sa_groups, verb, kind, None), (verb, kind)
        for verb in ("get", "list", "watch"):
            assert not _may(api, sa, sa_groups, verb, "configmaps", team, group=""), verb
        rbac = k8s.RbacAuthorizationV1Api(api)
        users = {role: f"e2e-{role}-{secrets.token_hex(3)}" for role in ("admin", "edit", "view")}

        def may(role: str, verb: str, resource: str, namespace: str | None) -> bool:
            return _may(api, users[role], [], verb, resource, namespace)

        # Aggregation into admin, edit and view is the controller-manager's, which this
        # control plane does not run: the labels are checked, and each team is bound to
        # the ClusterRole that aggregation would add to its role.
        aggregated = {
            label: [
                r.metadata.name if r.metadata else ""
                for r in rbac.list_cluster_role(
                    label_selector=f"rbac.authorization.k8s.io/aggregate-to-{label}=true"
                ).items
            ]
            for label in ("admin", "edit", "view")
        }
        assert "mirrorgate-policy-edit" in aggregated["admin"]
        assert "mirrorgate-policy-edit" in aggregated["edit"]
        assert "mirrorgate-policy-view" in aggregated["view"]
        assert "mirrorgate-policy-edit" not in aggregated["view"]
        for role, source in (
            ("admin", "mirrorgate-policy-edit"),
            ("edit", "mirrorgate-policy-edit"),
            ("view", "mirrorgate-policy-view"),
        ):
            kube.bind(
                rbac,
                f"{users[role]}-aggregated",
                ("ClusterRole", source),
                kube.user_subject(users[role]),
                namespace=team,
            )
        for role in ("admin", "edit"):
            for verb in ("create", "update", "delete", "get"):
                assert may(role, verb, "mirrorpolicies", team), (role, verb)
            assert not may(role, "create", "mirrorpolicies", "default"), role
            assert not may(role, "create", "clustermirrorpolicies", None), role
        assert may("view", "get", "mirrorpolicies", team)
        assert may("view", "list", "mirrorpolicies", team)
        assert not may("view", "create", "mirrorpolicies", team)
        assert not may("view", "create", "clustermirrorpolicies", None)
