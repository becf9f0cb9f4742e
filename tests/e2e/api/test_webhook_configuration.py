"""The webhook configuration as the API server applies it: reinvocation, failure, overlays."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from kubernetes import client as k8s

from mirrorgate import policy
from mirrorgate.webhook import patch
from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.injector import SIDECAR_IMAGE, running_injector
from tests.e2e.harness.kube import cert_manager_crds, create_pod
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import Installed, MakeNamespace, e2e_policy, pod

pytestmark = pytest.mark.e2e

OVERLAYS = ["base", "overlays/audit", "overlays/enforce", "overlays/cert-manager"]


def test_reinvocation_converges_to_a_single_pass(
    installed: Installed, make_namespace: MakeNamespace, tmp_path: Path
) -> None:
    """A later webhook adds a container; mirrorgate is called again and the result is one pass."""
    with installed.control_plane.api_client() as api, running_injector(tmp_path) as (url, ca):
        # "zz-" sorts after "mirrorgate": the API server calls the injector second.
        injector = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "zz-e2e-injector"},
            "webhooks": [
                {
                    "name": "inject.e2e.mirrorgate.io",
                    "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
                    "namespaceSelector": {"matchLabels": {"e2e.mirrorgate.io/inject": "yes"}},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "Never",
                }
            ],
        }
        admission = k8s.AdmissionregistrationV1Api(api)
        admission.create_mutating_webhook_configuration(injector)  # type: ignore[arg-type]
        try:
            namespace = make_namespace({**ENFORCE_LABELS, "e2e.mirrorgate.io/inject": "yes"})
            created, _ = create_pod(api, namespace, pod(installed))
        finally:
            admission.delete_mutating_webhook_configuration("zz-e2e-injector")

    # One pass of mirrorgate over the Pod as the injector leaves it.
    written = api.sanitize_for_serialization(pod(installed))
    written["spec"]["containers"].append({"name": "injected", "image": SIDECAR_IMAGE})
    rules = policy.load(yaml.safe_load(e2e_policy(installed.registry)))
    plan = policy.plan(written, namespace=namespace, mirror_policy=rules)
    single = jsonpatch.apply_patch(written, patch.build_patch(written, plan))

    assert [c["image"] for c in created["spec"]["containers"]] == [
        c["image"] for c in single["spec"]["containers"]
    ]
    assert (
        created["spec"]["initContainers"][0]["image"]
        == single["spec"]["initContainers"][0]["image"]
    )
    assert created["spec"]["imagePullSecrets"] == single["spec"]["imagePullSecrets"]
    annotation = policy.ORIGINAL_IMAGES_ANNOTATION
    assert json.loads(created["metadata"]["annotations"][annotation]) == json.loads(
        single["metadata"]["annotations"][annotation]
    )
    assert (
        json.loads(created["metadata"]["annotations"][annotation])["containers/injected"]
        == SIDECAR_IMAGE
    )

    # mirrorgate really was called twice for this Pod (log lines are flushed
    # within a second, so wait for them).
    def admissions() -> list[str]:
        return [
            line
            for line in installed.server.logs().splitlines()
            if f'"namespace":"{namespace}"' in line and '"msg":"admission"' in line
        ]

    wait_until(
        lambda: None if len(admissions()) >= 2 else f"{len(admissions())} lines",
        timeout=5,
        what="two admission log lines",
    )
    assert len(admissions()) == 2, admissions()


def _failure_configuration(installed: Installed, label: str) -> dict[str, Any]:
    """The base configuration, selecting only namespaces labelled for this test."""
    configuration = copy.deepcopy(installed.configuration)
    for webhook in configuration["webhooks"]:
        webhook["namespaceSelector"] = {"matchLabels": {"e2e.mirrorgate.io/failure": label}}
    return configuration


@pytest.mark.parametrize(
    ("failure_policy", "admitted"),
    [
        pytest.param("Ignore", True, id="ignore-admits-unchanged"),
        pytest.param("Fail", False, id="fail-refuses"),
    ],
)
def test_stopped_webhook_follows_failure_policy(
    installed: Installed,
    make_namespace: MakeNamespace,
    tmp_path: Path,
    failure_policy: str,
    admitted: bool,
) -> None:
    """With mirrorgate stopped, Ignore creates Pods unmodified and Fail refuses them."""
    plane = installed.control_plane
    server = mg.start_mirrorgate(
        tmp_path, plane, policy=e2e_policy(installed.registry), args=["--store", "kubernetes"]
    )
    name = f"e2e-failure-{failure_policy.lower()}"
    label = failure_policy.lower()
    with plane.api_client() as api:
        mg.register(
            api,
            _failure_configuration(installed, label),
            server,
            name=name,
            failure_policy=failure_policy,
        )
        try:
            namespace = make_namespace({"e2e.mirrorgate.io/failure": label, **ENFORCE_LABELS})
            running, _ = create_pod(api, namespace, pod(installed, name="while-up"))
            assert running["spec"]["containers"][0]["image"] == installed.registry.mirror_image
            server.stop()
            if admitted:
                created, _ = create_pod(api, namespace, pod(installed, name="while-down"))
                assert (
                    created["spec"]["containers"][0]["image"] == installed.registry.upstream_image
                )
                assert "imagePullSecrets" not in created["spec"]
            else:
                with pytest.raises(k8s.ApiException) as refused:
                    create_pod(api, namespace, pod(installed, name="while-down"))
                assert refused.value.status == 500
                assert "failed calling webhook" in str(refused.value.body)
        finally:
            mg.unregister(api, name)
            server.stop()


def test_manifests_choose_ignore_and_say_why(installed: Installed) -> None:
    """The shipped failurePolicy is Ignore for both Pod webhooks, with its reason written down;
    Fail only for the policy ConfigMap's validator, which no Pod waits for (the policy
    objects' is Ignore: the composition judges an object stored unjudged). Both are in a
    ValidatingWebhookConfiguration: validating webhooks run after every mutating one, so what
    they judge is what is stored."""
    assert {w["name"]: w["failurePolicy"] for w in installed.configuration["webhooks"]} == {
        mg.ENFORCE_WEBHOOK: "Ignore",
        mg.AUDIT_WEBHOOK: "Ignore",
    }
    assert installed.validators["kind"] == "ValidatingWebhookConfiguration"
    assert {w["name"]: w["failurePolicy"] for w in installed.validators["webhooks"]} == {
        "policy.mirrorgate.io": "Fail",
        "policies.mirrorgate.io": "Ignore",
    }
    base = REPO_ROOT / "manifests" / "base"
    source = (base / "mutatingwebhookconfiguration.yaml").read_text()
    assert "failurePolicy: Ignore" in source
    assert "air-gapped" in source  # the documented reason to switch enforce to Fail
    validators = (base / "validatingwebhookconfiguration.yaml").read_text()
    assert "Fail is safe here: only this one object waits for mirrorgate" in validators
    assert "what is judged is what is stored" in validators


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_is_accepted_by_server_side_dry_run(
    installed: Installed, kustomize: Path, overlay: str
) -> None:
    """`kustomize build` of every overlay is accepted by the API server (dry run)."""
    objects = mg.render(kustomize, overlay)
    kinds = {o["kind"] for o in objects}
    assert {
        "Deployment",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ClusterRole",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",
        "NetworkPolicy",
    } <= kinds
    with installed.control_plane.api_client() as api:
        if overlay.endswith("cert-manager"):
            cert_manager_crds(api)
        # The session's own configuration holds the name `mirrorgate` with a URL
        # instead of the Service; a fresh name keeps the two apart.
        renamed = [
            {**obj, "metadata": {**obj["metadata"], "name": "mirrorgate-dry-run"}}
            if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
            else obj
            for obj in objects
        ]
        kube.apply(api, renamed, dry_run=True)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--audit-only" in args) == overlay.endswith("audit")
