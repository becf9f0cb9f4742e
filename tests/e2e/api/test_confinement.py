"""mirrorgate's own writes, confined by the API server and not only by its code.

The ValidatingAdmissionPolicy of manifests/base (installed with the base RBAC
for the whole suite, so every other e2e test runs with it in force), checked
against the real API server by impersonating mirrorgate's ServiceAccount:
what a stolen token could try is refused, what the code does is allowed.
"""

from __future__ import annotations

import base64
import contextlib
import re
import secrets
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS, MANAGED_BY, read_secret
from tests.e2e.harness.kube import create_namespace
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import Installed, MakeNamespace

pytestmark = pytest.mark.e2e

DOCKERCONFIGJSON = "kubernetes.io/dockerconfigjson"
PAYLOAD = {".dockerconfigjson": base64.b64encode(b'{"auths":{}}').decode()}
SECRETS_REFUSAL = "mirrorgate may write only its own Secrets"
WEBHOOK_REFUSAL = "mirrorgate may change nothing in its webhook configuration but caBundle"


@contextlib.contextmanager
def as_service_account(plane: ControlPlane) -> Iterator[k8s.ApiClient]:
    """An admin client that impersonates mirrorgate's ServiceAccount on every request."""
    with plane.api_client() as api:
        api.set_default_header("Impersonate-User", mg.SERVICE_ACCOUNT_USER)
        yield api


def secret(
    name: str, *, labels: dict[str, str] | None = None, kind: str = DOCKERCONFIGJSON
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": kind,
        "metadata": {"name": name, "labels": labels or {}},
        "data": PAYLOAD,
    }


def refusal(call: Any, *args: Any) -> str:
    """The API server's message for a refused call (fails the test if it was allowed)."""
    with pytest.raises(k8s.ApiException) as caught:
        call(*args)
    assert caught.value.status == 403, caught.value.body
    return str(caught.value.body)


def wait_in_force(plane: ControlPlane, namespace: str) -> None:
    """A new policy takes a moment to compile; wait for its first refusal."""

    def refused() -> str | None:
        with as_service_account(plane) as api:
            try:
                k8s.CoreV1Api(api).create_namespaced_secret(
                    namespace,
                    secret(f"unlabelled-{secrets.token_hex(3)}"),  # type: ignore[arg-type]
                )
            except k8s.ApiException as error:
                return None if SECRETS_REFUSAL in str(error.body) else str(error.body)
        return "allowed"

    wait_until(refused, timeout=30, what="the ValidatingAdmissionPolicy in force", interval=0.2)


def test_service_account_cannot_touch_a_secret_in_kube_system(installed: Installed) -> None:
    """A stolen token cannot overwrite or delete a kube-system Secret, nor plant one there,
    however mirrorgate-like the Secret looks."""
    plane = installed.control_plane
    wait_in_force(plane, "kube-system")
    name = f"e2e-victim-{secrets.token_hex(3)}"
    with plane.api_client() as admin:
        k8s.CoreV1Api(admin).create_namespaced_secret("kube-system", secret(name))  # type: ignore[arg-type]
        original = read_secret(admin, "kube-system", name)
    assert original is not None
    shaped = secret(f"mirrorgate-{secrets.token_hex(3)}", labels={MANAGED_BY: "mirrorgate"})
    overwrite = {
        **secret(name, labels={MANAGED_BY: "mirrorgate"}),
        "metadata": {**original["metadata"]},
    }
    with as_service_account(plane) as api:
        core = k8s.CoreV1Api(api)
        messages = [
            refusal(core.replace_namespaced_secret, name, "kube-system", overwrite),
            refusal(core.delete_namespaced_secret, name, "kube-system"),
            refusal(core.create_namespaced_secret, "kube-system", shaped),
        ]
    assert all(SECRETS_REFUSAL in m for m in messages), messages
    with plane.api_client() as admin:
        assert read_secret(admin, "kube-system", name) == original


def test_service_account_writes_only_labelled_mirrorgate_pull_secrets(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """In an opted-in namespace: an unlabelled Secret, another name or type, and turning a
    Secret mirrorgate did not make into one of its own are refused; a generated pull secret
    (the control) is created, updated and deleted."""
    plane = installed.control_plane
    namespace = make_namespace(ENFORCE_LABELS)
    wait_in_force(plane, namespace)
    own = {MANAGED_BY: "mirrorgate"}
    foreign = f"mirrorgate-{secrets.token_hex(3)}"
    with plane.api_client() as admin:
        k8s.CoreV1Api(admin).create_namespaced_secret(namespace, secret(foreign))  # type: ignore[arg-type]
        stored = read_secret(admin, namespace, foreign)
    assert stored is not None
    with as_service_account(plane) as api:
        core = k8s.CoreV1Api(api)
        refused = {
            "unlabelled": refusal(
                core.create_namespaced_secret,
                namespace,
                secret(f"mirrorgate-{secrets.token_hex(3)}"),
            ),
            "other name": refusal(
                core.create_namespaced_secret,
                namespace,
                secret(f"app-{secrets.token_hex(3)}", labels=own),
            ),
            "other type": refusal(
                core.create_namespaced_secret,
                namespace,
                secret(f"mirrorgate-{secrets.token_hex(3)}", labels=own, kind="Opaque"),
            ),
            "adopt a foreign one": refusal(
                core.replace_namespaced_secret,
                foreign,
                namespace,
                {**secret(foreign, labels=own), "metadata": {**stored["metadata"], "labels": own}},
            ),
            "delete a foreign one": refusal(core.delete_namespaced_secret, foreign, namespace),
        }
        name = f"mirrorgate-{secrets.token_hex(3)}"
        created = core.create_namespaced_secret(namespace, secret(name, labels=own))  # type: ignore[arg-type]
        assert created.metadata is not None
        core.replace_namespaced_secret(
            name,
            namespace,
            {  # type: ignore[arg-type]
                **secret(name, labels=own),
                "metadata": {
                    "name": name,
                    "labels": own,
                    "resourceVersion": created.metadata.resource_version,
                },
            },
        )
        core.delete_namespaced_secret(name, namespace)
    assert {k: SECRETS_REFUSAL in v for k, v in refused.items()} == dict.fromkeys(refused, True)


def _patch(api: k8s.ApiClient, operations: list[dict[str, Any]]) -> None:
    k8s.AdmissionregistrationV1Api(api).patch_mutating_webhook_configuration(
        "mirrorgate", operations
    )


def test_service_account_changes_nothing_but_ca_bundle(installed: Installed) -> None:
    """Adding a rule (say, Secrets, to receive every Secret write) and repointing the URL are
    refused; changing caBundle, what mirrorgate does, is allowed."""
    plane = installed.control_plane
    wait_in_force(plane, "kube-system")
    with plane.api_client() as admin:
        before = k8s.AdmissionregistrationV1Api(admin).read_mutating_webhook_configuration(
            "mirrorgate"
        )
    assert before.webhooks
    bundle = before.webhooks[0].client_config.ca_bundle
    assert isinstance(bundle, str)
    rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["secrets"],
        "scope": "*",
    }
    with as_service_account(plane) as api:
        messages = [
            refusal(_patch, api, [{"op": "add", "path": "/webhooks/0/rules/-", "value": rule}]),
            refusal(
                _patch,
                api,
                [
                    {
                        "op": "replace",
                        "path": "/webhooks/0/clientConfig/url",
                        "value": "https://attacker.example/mutate",
                    }
                ],
            ),
            refusal(
                _patch,
                api,
                [{"op": "replace", "path": "/webhooks/1/failurePolicy", "value": "Fail"}],
            ),
            refusal(_patch, api, [{"op": "add", "path": "/metadata/labels/extra", "value": "x"}]),
        ]
        # The control: a different caBundle (the same CA twice) goes through.
        doubled = base64.b64encode(base64.b64decode(bundle) * 2).decode()
        try:
            _patch(
                api,
                [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": doubled}],
            )
            with plane.api_client() as admin:
                changed = k8s.AdmissionregistrationV1Api(admin).read_mutating_webhook_configuration(
                    "mirrorgate"
                )
        finally:
            _patch(
                api,
                [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}],
            )
    assert all(WEBHOOK_REFUSAL in m for m in messages), messages
    assert changed.webhooks
    assert changed.webhooks[0].client_config.ca_bundle == doubled
    with plane.api_client() as admin:
        after = k8s.AdmissionregistrationV1Api(admin).read_mutating_webhook_configuration(
            "mirrorgate"
        )
    assert after.webhooks == before.webhooks


def test_under_cert_manager_the_service_account_patches_no_webhook_configuration(
    own_control_plane: ControlPlane, kustomize: Path
) -> None:
    """The cert-manager overlay, installed for real: not even caBundle may be changed."""
    objects = mg.render(kustomize, "overlays/cert-manager")
    kinds = {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        *mg.CONFINEMENT_KINDS,
    }
    with own_control_plane.api_client() as admin:
        for obj in objects:
            if obj["kind"] in kinds:
                k8s_utils.create_from_dict(admin, obj)  # type: ignore[no-untyped-call]
        namespace = create_namespace(admin, f"e2e-cm-{secrets.token_hex(3)}")
    wait_in_force(own_control_plane, namespace)
    with as_service_account(own_control_plane) as api:
        message = refusal(
            _patch,
            api,
            [
                {
                    "op": "add",
                    "path": "/webhooks/0/clientConfig/caBundle",
                    "value": base64.b64encode(b"x").decode(),
                }
            ],
        )
    assert "mutatingwebhookconfigurations" in message


def test_the_skip_label_policy_of_docs_security_keeps_tenants_from_the_skip_label(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """docs/security.md's example, applied for real: a tenant's Pod with the skip label is
    refused, the same Pod without it and an administrator's with it are created."""
    text = (REPO_ROOT / "docs" / "security.md").read_text()
    (block,) = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
        if "mirrorgate-skip-is-for-admins" in b
    ]
    objects = [o for o in yaml.safe_load_all(textwrap.dedent(block)) if o]
    plane = installed.control_plane
    namespace = make_namespace()
    tenant = f"e2e-tenant-{secrets.token_hex(3)}"
    skipped = {
        "metadata": {"name": "skipped", "labels": {"mirrorgate.io/skip": "true"}},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]},
    }
    plain = {**skipped, "metadata": {"name": "plain"}}
    with plane.api_client() as admin:
        rbac = k8s.RbacAuthorizationV1Api(admin)
        # A Role of its own: no controller-manager fills the aggregated `edit` role here.
        rbac.create_namespaced_role(
            namespace,
            {  # type: ignore[arg-type]
                "metadata": {"name": tenant},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
            },
        )
        kube.bind(rbac, tenant, ("Role", tenant), kube.user_subject(tenant), namespace=namespace)
        for obj in objects:
            k8s_utils.create_from_dict(admin, obj)  # type: ignore[no-untyped-call]
        try:
            with plane.api_client(user=tenant, groups=()) as api:
                core = k8s.CoreV1Api(api)

                def refused() -> str | None:
                    try:
                        core.create_namespaced_pod(
                            namespace,
                            skipped,  # type: ignore[arg-type]
                            dry_run="All",
                        )
                    except k8s.ApiException as error:
                        return None if "mirrorgate.io/skip" in str(error.body) else str(error.body)
                    return "allowed"

                wait_until(refused, timeout=30, what="the skip-label policy in force", interval=0.2)
                message = refusal(core.create_namespaced_pod, namespace, skipped)
                core.create_namespaced_pod(namespace, plain)  # type: ignore[arg-type]
            k8s.CoreV1Api(admin).create_namespaced_pod(namespace, skipped)  # type: ignore[arg-type]
        finally:
            admission = k8s.AdmissionregistrationV1Api(admin)
            admission.delete_validating_admission_policy_binding("mirrorgate-skip-is-for-admins")
            admission.delete_validating_admission_policy("mirrorgate-skip-is-for-admins")
    assert "only cluster administrators may set mirrorgate.io/skip" in message
