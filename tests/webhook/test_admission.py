"""/mutate end to end in process: the patch, the operations it applies to, modes and credentials."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from mirrorgate import policy
from mirrorgate.webhook import admission
from mirrorgate.webhook import review as review_
from mirrorgate.webhook.edge import app
from tests.webhook import policies, strategies
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.harness import Harness, make_harness
from tests.webhook.reviews import (
    HUB_IMAGE,
    HUB_MIRRORED,
    HUB_SECRET,
    NAMESPACE,
    PROM_IMAGE,
    PROM_MIRRORED,
    UNMATCHED_IMAGE,
    apply,
    original_images,
    patch_ops,
    pod,
    review,
)

ANNOTATION_POINTER = "/metadata/annotations/mirrorgate.io~1original-images"


def rich_pod() -> dict[str, Any]:
    """A Pod full of fields mirrorgate knows nothing about, which must all survive."""
    obj = pod(HUB_IMAGE, UNMATCHED_IMAGE, PROM_IMAGE)
    obj["metadata"].update(
        {
            "labels": {"app": "web"},
            "annotations": {"team": "a/b", "tilde~key": "x"},
            "futureMetadata": {"nested": [1, 2, 3]},
        }
    )
    obj["spec"]["containers"][0].update(
        {"env": [{"name": "A", "value": "1"}], "futureContainerField": {"k": True}}
    )
    obj["spec"].update(
        {
            "initContainers": [{"name": "init", "image": PROM_IMAGE}],
            "futureSpecField": ["keep", {"me": None}],
            "imagePullSecrets": [{"name": "existing"}],
        }
    )
    obj["status"] = {"phase": "Pending"}
    obj["futureTopLevel"] = 1.5
    return obj


def test_patch_changes_exactly_the_planned_fields(harness: Harness) -> None:
    """The patch touches only images, the annotation and pull secrets; everything else survives."""
    obj = rich_pod()
    response = harness.mutate(review(obj))
    assert response["allowed"] is True
    ops = patch_ops(response)
    assert {op["op"] for op in ops} <= {"add", "replace"}
    assert sorted(op["path"] for op in ops) == sorted(
        [
            "/spec/containers/0/image",
            "/spec/containers/2/image",
            "/spec/initContainers/0/image",
            ANNOTATION_POINTER,
            "/spec/imagePullSecrets/-",
        ]
    )

    expected = copy.deepcopy(obj)
    expected["spec"]["containers"][0]["image"] = HUB_MIRRORED
    expected["spec"]["containers"][2]["image"] = PROM_MIRRORED
    expected["spec"]["initContainers"][0]["image"] = PROM_MIRRORED
    expected["spec"]["imagePullSecrets"].append({"name": HUB_SECRET})
    patched = apply(obj, ops)
    annotation = patched["metadata"]["annotations"].pop("mirrorgate.io/original-images")
    assert patched == expected
    assert json.loads(annotation) == {
        "containers/c0": HUB_IMAGE,
        "containers/c2": PROM_IMAGE,
        "initContainers/init": PROM_IMAGE,
    }


@pytest.mark.parametrize(
    ("metadata", "pull_secrets", "expected_paths"),
    [
        pytest.param(None, None, ["/metadata", "/spec/imagePullSecrets"], id="no-metadata"),
        pytest.param(
            {"name": "web"},
            None,
            ["/metadata/annotations", "/spec/imagePullSecrets"],
            id="no-annotations",
        ),
        pytest.param(
            {"name": "web", "annotations": {}},
            [],
            [ANNOTATION_POINTER, "/spec/imagePullSecrets/-"],
            id="empty-parents",
        ),
        pytest.param(
            {"name": "web", "annotations": {"a": "b"}},
            [{"name": "other"}],
            [ANNOTATION_POINTER, "/spec/imagePullSecrets/-"],
            id="existing-parents",
        ),
    ],
)
def test_patch_creates_missing_parents(
    harness: Harness,
    metadata: dict[str, Any] | None,
    pull_secrets: list[Any] | None,
    expected_paths: list[str],
) -> None:
    """Absent metadata, annotations or imagePullSecrets are created; present ones are added to."""
    obj = pod(HUB_IMAGE)
    if metadata is None:
        del obj["metadata"]
    else:
        obj["metadata"] = metadata
    if pull_secrets is not None:
        obj["spec"]["imagePullSecrets"] = pull_secrets
    ops = patch_ops(harness.mutate(review(obj)))
    assert [op["path"] for op in ops] == ["/spec/containers/0/image", *expected_paths]
    patched = apply(obj, ops)
    assert patched["spec"]["containers"][0]["image"] == HUB_MIRRORED
    assert original_images(patched) == {"containers/c0": HUB_IMAGE}
    assert patched["spec"]["imagePullSecrets"][-1] == {"name": HUB_SECRET}
    assert patched["spec"]["imagePullSecrets"][:-1] == (pull_secrets or [])
    for key, value in (metadata or {}).items():
        if key != "annotations":
            assert patched["metadata"][key] == value
    assert {**(metadata or {}).get("annotations", {})}.items() <= patched["metadata"][
        "annotations"
    ].items()


def test_answer_echoes_api_version_and_uid(harness: Harness) -> None:
    """The answer is an AdmissionReview v1 for the same uid, with a base64 JSONPatch."""
    body = review(pod(PROM_IMAGE), uid="e2b7c1d0-1234-4abc-9def-000000000042")
    answer = harness.post("/mutate", body)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "e2b7c1d0-1234-4abc-9def-000000000042"
    assert answer["response"]["patchType"] == "JSONPatch"
    assert "request" not in answer


def test_rewriting_a_rewritten_pod_changes_nothing(harness: Harness) -> None:
    """Admission reinvocation on our own output plans nothing: no patch, no warning."""
    obj = pod(HUB_IMAGE, PROM_IMAGE)
    once = apply(obj, patch_ops(harness.mutate(review(obj))))
    response = harness.mutate(review(once))
    assert patch_ops(response) == []
    assert "warnings" not in response


def test_pod_without_mirrored_images_is_allowed_without_patch(harness: Harness) -> None:
    """Images no rule covers, and excluded images, are admitted as they are."""
    response = harness.mutate(review(pod(UNMATCHED_IMAGE, "registry.k8s.io/pause:3.9")))
    assert response["allowed"] is True
    assert patch_ops(response) == []
    assert harness.secrets.missing_calls == []


EPHEMERAL_RESOURCE = "ephemeralcontainers"


@pytest.mark.parametrize(
    ("kind", "operation", "sub_resource"),
    [
        pytest.param(
            {"group": "", "version": "v1", "kind": "Pod"}, "UPDATE", None, id="pod-update"
        ),
        pytest.param(
            {"group": "", "version": "v1", "kind": "Pod"}, "DELETE", None, id="pod-delete"
        ),
        pytest.param(
            {"group": "", "version": "v1", "kind": "Pod"}, "CONNECT", None, id="pod-connect"
        ),
        pytest.param(
            {"group": "", "version": "v1", "kind": "Pod"},
            "CREATE",
            "binding",
            id="pod-create-binding",
        ),
        pytest.param(
            {"group": "", "version": "v1", "kind": "Pod"},
            "UPDATE",
            "status",
            id="pod-update-status",
        ),
        pytest.param(
            {"group": "", "version": "v1", "kind": "Pod"},
            "CREATE",
            EPHEMERAL_RESOURCE,
            id="pod-create-ephemeral",
        ),
        pytest.param(
            {"group": "apps", "version": "v1", "kind": "Deployment"},
            "CREATE",
            None,
            id="deployment",
        ),
        pytest.param(
            {"group": "example.com", "version": "v1", "kind": "Pod"},
            "CREATE",
            None,
            id="pod-in-other-group",
        ),
        pytest.param(
            {"group": "", "version": "v1", "kind": "PodTemplate"}, "CREATE", None, id="pod-template"
        ),
    ],
)
def test_other_kinds_operations_and_subresources_are_allowed_unchanged(
    harness: Harness, kind: dict[str, str], operation: str, sub_resource: str | None
) -> None:
    """Only Pod CREATE and UPDATE (its own or ephemeral containers') are mutated, and an
    update only where it changes an image; the rest passes untouched."""
    response = harness.mutate(
        review(
            pod(HUB_IMAGE),
            kind=kind,
            operation=operation,
            sub_resource=sub_resource,
            old=pod(HUB_IMAGE),
        )
    )
    assert response == {"uid": review(None)["request"]["uid"], "allowed": True}
    assert harness.secrets.missing_calls == []


def test_ephemeral_container_update_rewrites_only_the_new_container(harness: Harness) -> None:
    """kubectl debug: the added ephemeral container is rewritten, existing ones are frozen."""
    old = pod(HUB_IMAGE)
    old["spec"]["ephemeralContainers"] = [{"name": "debug-0", "image": PROM_IMAGE}]
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"].append({"name": "debug-1", "image": PROM_IMAGE})
    response = harness.mutate(
        review(new, operation="UPDATE", sub_resource=EPHEMERAL_RESOURCE, old=old)
    )
    ops = patch_ops(response)
    # The API server drops metadata changes on this subresource: no annotation op; the
    # original image is reported as a warning and in the audit annotations instead.
    assert [op["path"] for op in ops] == ["/spec/ephemeralContainers/1/image"]
    patched = apply(new, ops)
    assert patched["spec"]["ephemeralContainers"][1]["image"] == PROM_MIRRORED
    assert patched["spec"]["ephemeralContainers"][0]["image"] == PROM_IMAGE
    assert patched["spec"]["containers"] == new["spec"]["containers"]
    assert patched["metadata"] == new["metadata"]
    [warning] = response["warnings"]
    assert "ephemeralContainers/debug-1" in warning
    assert PROM_MIRRORED in warning
    assert PROM_IMAGE in warning
    assert json.loads(response["auditAnnotations"]["rewrites"]) == {
        "ephemeralContainers/debug-1": {
            "from": PROM_IMAGE,
            "to": PROM_MIRRORED,
            "rule": "mirrors[1]",
        }
    }


def test_ephemeral_container_needing_a_new_pull_secret_is_left_with_a_warning(
    harness: Harness,
) -> None:
    """The API server ignores imagePullSecrets on this subresource, so no rewrite can use one."""
    old = pod(UNMATCHED_IMAGE)
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": HUB_IMAGE}]
    response = harness.mutate(
        review(new, operation="UPDATE", sub_resource=EPHEMERAL_RESOURCE, old=old)
    )
    assert response["allowed"] is True
    assert patch_ops(response) == []
    [warning] = response["warnings"]
    assert "ephemeralContainers/debug" in warning
    assert HUB_SECRET in warning


@pytest.mark.parametrize(
    ("object_namespace", "request_namespace", "patched"),
    [
        pytest.param(None, NAMESPACE, True, id="request-namespace-used"),
        pytest.param(None, "excluded-ns", False, id="request-namespace-excluded"),
        pytest.param("excluded-ns", NAMESPACE, False, id="object-namespace-wins"),
        pytest.param("kube-system", None, False, id="kube-system-always-excluded"),
    ],
)
def test_namespace_comes_from_the_object_or_the_request(
    harness: Harness, object_namespace: str | None, request_namespace: str | None, patched: bool
) -> None:
    """A Pod without metadata.namespace is planned for request.namespace."""
    response = harness.mutate(
        review(pod(HUB_IMAGE, namespace=object_namespace), namespace=request_namespace)
    )
    assert response["allowed"] is True
    assert bool(patch_ops(response)) is patched
    if patched:
        assert harness.secrets.ensure_calls == [(request_namespace, ("harbor-pull",))]


def test_generate_name_pod_without_name_is_patched(harness: Harness) -> None:
    """A Pod created by a controller has generateName and no name yet."""
    obj = pod(PROM_IMAGE, name=None, generate_name="web-7d4b9-")
    patched = apply(obj, patch_ops(harness.mutate(review(obj))))
    assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED
    assert "name" not in patched["metadata"]


@pytest.mark.parametrize(
    "labels_annotations",
    [
        pytest.param({"labels": {"mirrorgate.io/skip": "true"}}, id="skip-label"),
        pytest.param(
            {"annotations": {"kubernetes.io/config.mirror": "abc"}}, id="static-pod-mirror"
        ),
    ],
)
def test_opted_out_pods_are_allowed_unchanged(
    harness: Harness, labels_annotations: dict[str, Any]
) -> None:
    """The skip label and static-pod mirrors leave the Pod alone."""
    obj = pod(HUB_IMAGE)
    obj["metadata"].update(labels_annotations)
    response = harness.mutate(review(obj))
    assert response["allowed"] is True
    assert patch_ops(response) == []


# --- audit mode --------------------------------------------------------------------------------


def assert_audit_response(response: dict[str, Any]) -> None:
    assert response["allowed"] is True
    assert "patch" not in response
    assert "patchType" not in response
    warnings = response["warnings"]
    assert len(warnings) == 2
    for warning, container, new_image in zip(
        warnings, ("c0", "c1"), (HUB_MIRRORED, PROM_MIRRORED), strict=True
    ):
        assert "\n" not in warning
        assert len(warning) <= 256  # what the API server passes on untruncated
        assert container in warning
        assert new_image in warning
    plan = json.loads(response["auditAnnotations"]["rewrites"])
    assert plan == {  # health: no probe has found a problem
        "containers/c0": {
            "from": HUB_IMAGE,
            "to": HUB_MIRRORED,
            "rule": "mirrors[0]",
            "health": "up",
        },
        "containers/c1": {
            "from": PROM_IMAGE,
            "to": PROM_MIRRORED,
            "rule": "mirrors[1]",
            "health": "up",
        },
    }


def test_audit_only_reports_without_patching(tmp_path: Path) -> None:
    """With --audit-only, /mutate returns warnings and audit annotations, never a patch."""
    made = make_harness(tmp_path, audit_only=True)
    with made.client:
        response = made.mutate(review(pod(HUB_IMAGE, PROM_IMAGE)))
    assert_audit_response(response)
    assert made.secrets.missing_calls == []
    assert made.secrets.ensure_calls == []


def test_audit_endpoint_never_patches_even_under_enforce(harness: Harness) -> None:
    """/audit is a dry-run audit whatever the policy mode."""
    answer = harness.post("/audit", review(pod(HUB_IMAGE, PROM_IMAGE)))
    assert_audit_response(answer["response"])
    assert harness.secrets.ensure_calls == []


# --- dry run and credentials -------------------------------------------------------------------


def test_dry_run_returns_the_patch_without_side_effects(harness: Harness) -> None:
    """request.dryRun: the same patch comes back and no pull secret is created."""
    obj = pod(HUB_IMAGE, PROM_IMAGE)
    response = harness.mutate(review(obj, dry_run=True))
    patched = apply(obj, patch_ops(response))
    assert [c["image"] for c in patched["spec"]["containers"]] == [HUB_MIRRORED, PROM_MIRRORED]
    assert patched["spec"]["imagePullSecrets"] == [{"name": HUB_SECRET}]
    assert harness.secrets.ensure_calls == []
    assert harness.secrets.missing_calls == []


def test_stale_pull_secret_is_ensured_before_patching(harness: Harness) -> None:
    """A credential whose Secret is not known current is ensured in the Pod's namespace."""
    obj = pod(HUB_IMAGE, PROM_IMAGE)
    response = harness.mutate(review(obj))
    assert harness.secrets.missing_calls == [(NAMESPACE, ("harbor-pull",))]
    assert harness.secrets.ensure_calls == [(NAMESPACE, ("harbor-pull",))]
    assert apply(obj, patch_ops(response))["spec"]["imagePullSecrets"] == [{"name": HUB_SECRET}]
    assert "warnings" not in response


def test_steady_state_never_calls_ensure(tmp_path: Path) -> None:
    """When every Secret is known current, admission makes no API call at all."""
    made = make_harness(tmp_path, secrets=RecordingPullSecrets(stale=False))
    obj = pod(HUB_IMAGE)
    with made.client:
        for _ in range(3):
            response = made.mutate(review(obj))
    assert apply(obj, patch_ops(response))["spec"]["containers"][0]["image"] == HUB_MIRRORED
    assert made.secrets.missing_calls == [(NAMESPACE, ("harbor-pull",))] * 3
    assert made.secrets.ensure_calls == []


def test_pods_needing_no_credential_never_touch_pull_secrets(harness: Harness) -> None:
    """An open mirror needs no Secret: neither missing nor ensure is consulted."""
    harness.mutate(review(pod(PROM_IMAGE)))
    assert harness.secrets.missing_calls == []
    assert harness.secrets.ensure_calls == []


def test_credential_failure_with_skip_leaves_those_images_as_written(tmp_path: Path) -> None:
    """onCredentialError: skip keeps the image unmirrored, warns, and still rewrites the rest."""
    secrets = RecordingPullSecrets(failures={"harbor-pull": "secrets is forbidden"})
    made = make_harness(tmp_path, secrets=secrets)
    obj = pod(HUB_IMAGE, PROM_IMAGE)
    with made.client:
        response = made.mutate(review(obj))
        metrics = made.client.get("/metrics").text
    assert response["allowed"] is True
    patched = apply(obj, patch_ops(response))
    assert [c["image"] for c in patched["spec"]["containers"]] == [HUB_IMAGE, PROM_MIRRORED]
    assert "imagePullSecrets" not in patched["spec"]
    assert original_images(patched) == {"containers/c1": PROM_IMAGE}
    [warning] = response["warnings"]
    assert "containers/c0" in warning
    assert HUB_SECRET in warning
    assert "secrets is forbidden" in warning
    assert 'mirrorgate_images_left_unmirrored_total{reason="credential-unavailable"} 1.0' in metrics


def test_credential_failure_with_deny_refuses_the_pod(tmp_path: Path) -> None:
    """onCredentialError: deny answers allowed=false with a message naming the Secret."""
    secrets = RecordingPullSecrets(failures={"harbor-pull": "secrets is forbidden"})
    made = make_harness(tmp_path, policies.policy_yaml(on_credential_error="deny"), secrets)
    with made.client:
        response = made.mutate(review(pod(HUB_IMAGE, PROM_IMAGE)))
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == 403
    assert HUB_SECRET in response["status"]["message"]
    assert "secrets is forbidden" in response["status"]["message"]
    assert NAMESPACE in response["status"]["message"]


def test_internal_error_refuses_to_enforce(tmp_path: Path) -> None:
    """A bug behind admission is never a 500, nor a covered image admitted as written in an
    enforce namespace: the Pod is refused, naming the review, and the error counted."""
    made = make_harness(tmp_path, secrets=RecordingPullSecrets(explode=True))
    body = review(pod(HUB_IMAGE))
    with made.client:
        raw = made.client.post("/mutate", json=body)
        metrics = made.client.get("/metrics").text
    assert raw.status_code == 200
    assert "Traceback" not in raw.text
    assert "exploded" not in raw.text
    response = raw.json()["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == 503
    message = response["status"]["message"]
    assert body["request"]["uid"] in message
    assert "refused rather than admitted" in message
    assert 'mirrorgate_errors_total{endpoint="mutate",reason="internal"} 1.0' in metrics


def test_internal_error_admits_an_audit_review_unchanged() -> None:
    """An audit review changes nothing either way: one mirrorgate failed to decide is
    admitted as written, saying so."""
    rev = review_.decode(orjson.dumps(review(pod(HUB_IMAGE))))
    decision = app._internal_error(rev, policy.AUDIT)
    response = decision.body["response"]
    assert (response["allowed"], decision.outcome) == (True, "allowed")
    assert "patch" not in response
    assert response["warnings"] == [
        "mirrorgate: internal error; the Pod was admitted unchanged (audit)"
    ]


_PLANNING_POLICY = policy.load(yaml.safe_load(policies.POLICY))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=strategies.valid_reviews().map(orjson.dumps) | strategies.mutated_reviews())
def test_a_review_reduced_for_planning_is_admitted_alike(body: bytes) -> None:
    """What a worker hands back (admission.for_planning) decides as the whole review does."""
    try:
        rev = review_.decode(body)
    except review_.BadReview:
        return  # never handed to planning
    assert _admitted(admission.for_planning(rev)) == _admitted(rev)


def _admitted(rev: review_.Review) -> admission.Decision | str:
    """The decision on ``rev``, or why it is a bad review."""
    try:
        return asyncio.run(
            admission.admit(
                rev, mirror_policy=_PLANNING_POLICY, mode="enforce", secrets=RecordingPullSecrets()
            )
        )
    except review_.BadReview as error:
        return str(error)
