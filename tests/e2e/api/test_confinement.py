"""mirrorgate's own writes, confined by the API server and not only by its code.

The ValidatingAdmissionPolicy of manifests/base (installed with the base RBAC
for the whole suite, so every other e2e test runs with it in force), checked
against the real API server by impersonating mirrorgate's ServiceAccount:
what a stolen token could try is refused, what the code does is allowed.
"""

from __future__ import annotations

import base64
import contextlib
import functools
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
from tests.e2e.harness.fixtures_secrets import (
    ENFORCE_LABELS,
    MANAGED_BY,
    metric,
    metrics_text,
    read_secret,
    rewrite_policy,
)
from tests.e2e.harness.kube import create_namespace, create_pod, refusal
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import CREDENTIAL, Installed, MakeNamespace, e2e_policy, pod

pytestmark = pytest.mark.e2e

DOCKERCONFIGJSON = "kubernetes.io/dockerconfigjson"
PAYLOAD = {".dockerconfigjson": base64.b64encode(b'{"auths":{}}').decode()}
SECRETS_REFUSAL = "mirrorgate may write only its own Secrets"
WEBHOOK_REFUSAL = "mirrorgate may change nothing in its webhook configuration but caBundle"
CONFIGMAPS_REFUSAL = "mirrorgate may write only its own ConfigMaps"
EVENTS_REFUSAL = "mirrorgate may create only its own Warning Events"
SQUATTED = f"mirrorgate-{CREDENTIAL}"
SQUAT_METRIC = "mirrorgate_squatted_copies_total"


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
        # The reserved prefix keeps tenants from the name; one made before it was installed.
        mg.made_before_install(admin, namespace, secret(foreign))  # type: ignore[arg-type]
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


def _patch(api: k8s.ApiClient, operations: list[dict[str, Any]], kind: str = "mutating") -> None:
    getattr(k8s.AdmissionregistrationV1Api(api), f"patch_{kind}_webhook_configuration")(
        "mirrorgate", operations
    )


def _read(api: k8s.ApiClient, kind: str) -> Any:
    return getattr(k8s.AdmissionregistrationV1Api(api), f"read_{kind}_webhook_configuration")(
        "mirrorgate"
    )


@pytest.mark.parametrize("kind", ["mutating", "validating"])
def test_service_account_changes_nothing_but_ca_bundle(installed: Installed, kind: str) -> None:
    """In either webhook configuration (the Pod webhooks, the policy's validators): adding a
    rule (say, Secrets, to receive every Secret write), repointing the URL, a failurePolicy,
    an ownerReference or a finalizer are refused; changing caBundle, what mirrorgate does, is
    allowed."""
    plane = installed.control_plane
    wait_in_force(plane, "kube-system")
    patch = functools.partial(_patch, kind=kind)
    with plane.api_client() as admin:
        before = _read(admin, kind)
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
            refusal(patch, api, [{"op": "add", "path": "/webhooks/0/rules/-", "value": rule}]),
            refusal(
                patch,
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
                patch,
                api,
                [
                    {
                        "op": "replace",
                        "path": "/webhooks/1/failurePolicy",
                        "value": "Fail",  # audit's and policies': Ignore
                    }
                ],
            ),
            refusal(patch, api, [{"op": "add", "path": "/metadata/labels/extra", "value": "x"}]),
            # An owner the garbage collector would delete the configuration with.
            refusal(
                patch,
                api,
                [
                    {
                        "op": "add",
                        "path": "/metadata/ownerReferences",
                        "value": [
                            {
                                "apiVersion": "v1",
                                "kind": "Namespace",
                                "name": "kube-system",
                                "uid": "00000000-0000-0000-0000-000000000000",
                            }
                        ],
                    }
                ],
            ),
            # A finalizer that would keep a deleted configuration (and its rules) in force.
            refusal(
                patch,
                api,
                [{"op": "add", "path": "/metadata/finalizers", "value": ["example.com/hold"]}],
            ),
        ]
        # The control: a different caBundle (the same CA twice) goes through.
        doubled = base64.b64encode(base64.b64decode(bundle) * 2).decode()
        try:
            patch(
                api,
                [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": doubled}],
            )
            with plane.api_client() as admin:
                changed = _read(admin, kind)
        finally:
            patch(
                api,
                [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}],
            )
    assert all(WEBHOOK_REFUSAL in m for m in messages), messages
    assert changed.webhooks
    assert changed.webhooks[0].client_config.ca_bundle == doubled
    with plane.api_client() as admin:
        after = _read(admin, kind)
    assert after.webhooks == before.webhooks


def test_under_cert_manager_the_service_account_patches_no_webhook_configuration(
    own_control_plane: ControlPlane, kustomize: Path
) -> None:
    """The cert-manager overlay, installed for real: not even caBundle may be changed, nor
    the certificates or the CA certificate written, which are cert-manager's."""
    objects = mg.render(kustomize, "overlays/cert-manager")
    kinds = {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        *mg.CONFINEMENT_KINDS,
    }
    with own_control_plane.api_client() as admin:
        for obj in objects:
            if obj["kind"] in kinds:
                k8s_utils.create_from_dict(admin, obj)  # type: ignore[no-untyped-call]
        namespace = create_namespace(admin, f"e2e-cm-{secrets.token_hex(3)}")
    wait_in_force(own_control_plane, namespace)
    tls = {"tls.crt": PAYLOAD[".dockerconfigjson"], "tls.key": PAYLOAD[".dockerconfigjson"]}
    with as_service_account(own_control_plane) as api:
        core = k8s.CoreV1Api(api)
        certificates = [
            refusal(
                core.create_namespaced_secret,
                mg.NAMESPACE,
                {
                    **secret("mirrorgate-tls", labels={"app.kubernetes.io/name": "mirrorgate"}),
                    "type": "kubernetes.io/tls",
                    "data": tls,
                },
            ),
            refusal(
                core.create_namespaced_secret,
                mg.NAMESPACE,
                {
                    **secret("mirrorgate-ca", labels={"app.kubernetes.io/name": "mirrorgate"}),
                    "type": "Opaque",
                },
            ),
            refusal(
                core.create_namespaced_config_map,
                mg.NAMESPACE,
                _config_map("mirrorgate-ca", {"ca.crt": "pem"}, {MANAGED_BY: "mirrorgate"}),
            ),
        ]
    # cert-manager (here an administrator) may make its two Secrets of the reserved prefix in
    # mirrorgate's namespace, and no other.
    with own_control_plane.api_client() as admin:
        core = k8s.CoreV1Api(admin)
        for name in ("mirrorgate-tls", "mirrorgate-ca"):
            core.create_namespaced_secret(
                mg.NAMESPACE,
                secret(name, kind="Opaque"),  # type: ignore[arg-type]
                dry_run="All",
            )
        elsewhere = refusal(
            core.create_namespaced_secret, namespace, secret("mirrorgate-tls", kind="Opaque")
        )
    assert SECRETS_REFUSAL in certificates[0], certificates
    assert SECRETS_REFUSAL in certificates[1], certificates
    assert "cert-manager keeps the certificates" in certificates[0]
    assert CONFIGMAPS_REFUSAL in certificates[2], certificates
    assert mg.RESERVED_REFUSAL in elsewhere
    operations = [
        {
            "op": "add",
            "path": "/webhooks/0/clientConfig/caBundle",
            "value": base64.b64encode(b"x").decode(),
        }
    ]
    with as_service_account(own_control_plane) as api:
        messages = [
            refusal(functools.partial(_patch, kind=kind), api, operations)
            for kind in ("mutating", "validating")
        ]
    assert "mutatingwebhookconfigurations" in messages[0]
    assert "validatingwebhookconfigurations" in messages[1]


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
    skipped = {
        "metadata": {"name": "skipped", "labels": {"mirrorgate.io/skip": "true"}},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]},
    }
    plain = {**skipped, "metadata": {"name": "plain"}}
    with plane.api_client() as admin:
        tenant = kube.tenant(admin, namespace, "pods")
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


# --------------------------------------------------------------------------- the reserved prefix


def test_nobody_but_mirrorgate_creates_a_secret_of_the_reserved_prefix(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """A tenant, a cluster administrator and another ServiceAccount named mirrorgate are
    refused mirrorgate-*, in a tenant namespace and in mirrorgate's own, by name or
    generateName; other names (the control) are the tenant's, and mirrorgate's own pull
    secret is created."""
    plane = installed.control_plane
    namespace = make_namespace(ENFORCE_LABELS)
    name = f"mirrorgate-{secrets.token_hex(3)}"
    refused: dict[str, str] = {}
    with plane.api_client() as admin:
        tenant = kube.tenant(admin, namespace, "secrets")
        mg.wait_reserved_in_force(admin, namespace)
        core = k8s.CoreV1Api(admin)
        refused["administrator"] = refusal(core.create_namespaced_secret, namespace, secret(name))
        refused["administrator, mirrorgate's namespace"] = refusal(
            core.create_namespaced_secret, mg.NAMESPACE, secret(name, kind="Opaque")
        )
        refused["generateName"] = refusal(
            core.create_namespaced_secret,
            namespace,
            {**secret(""), "metadata": {"generateName": "mirrorgate-"}},
        )
    with plane.api_client(user=tenant, groups=()) as api:
        core = k8s.CoreV1Api(api)
        refused["tenant"] = refusal(core.create_namespaced_secret, namespace, secret(name))
        core.create_namespaced_secret(namespace, secret(f"app-{secrets.token_hex(3)}"))  # type: ignore[arg-type]
    elsewhere = {"kind": "ServiceAccount", "name": "mirrorgate", "namespace": "elsewhere"}
    with plane.api_client() as api:
        # mirrorgate's ClusterRole, so that RBAC lets it and the policy decides.
        kube.bind(
            k8s.RbacAuthorizationV1Api(api),
            f"e2e-elsewhere-{secrets.token_hex(3)}",
            ("ClusterRole", "mirrorgate"),
            elsewhere,
        )
        api.set_default_header("Impersonate-User", "system:serviceaccount:elsewhere:mirrorgate")
        refused["another ServiceAccount named mirrorgate"] = refusal(
            k8s.CoreV1Api(api).create_namespaced_secret,
            namespace,
            secret(name, labels={MANAGED_BY: "mirrorgate"}),
        )
    with as_service_account(plane) as api:
        k8s.CoreV1Api(api).create_namespaced_secret(
            namespace,
            secret(name, labels={MANAGED_BY: "mirrorgate"}),  # type: ignore[arg-type]
        )
    assert {k: mg.RESERVED_REFUSAL in v for k, v in refused.items()} == dict.fromkeys(
        refused, True
    ), refused
    assert (
        f"Secret {namespace}/{name}: the name prefix mirrorgate- is reserved" in refused["tenant"]
    )


def _squat_events(api: k8s.ApiClient, namespace: str) -> list[k8s.CoreV1Event]:
    found = k8s.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector="reason=PullSecretNameSquatted"
    )
    return list(found.items)


def test_a_squatted_copy_is_reported_and_under_deny_refuses_the_pod(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """A mirrorgate-<credential> made before install: each admission that meets it is counted,
    one Warning Event names it, and under deny the Pod is refused saying why: never admitted
    as written, nor pointing at the mirror without its login."""
    registry, server = installed.registry, installed.server
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        mg.made_before_install(
            api,
            namespace,
            k8s.V1Secret(
                metadata=k8s.V1ObjectMeta(name=SQUATTED),
                type="Opaque",
                data={"k": base64.b64encode(b"a tenant's").decode()},
            ),
        )
        before = metric(metrics_text(server), SQUAT_METRIC)
        skipped = [
            create_pod(api, namespace, pod(installed, name=name))[0]["spec"]
            for name in ("first", "second")
        ]
        wait_until(
            lambda: None if _squat_events(api, namespace) else "no Event yet",
            timeout=15,
            what="the squatting reported",
        )
        counted = metric(metrics_text(server), SQUAT_METRIC) - before
        events = _squat_events(api, namespace)
        policy = e2e_policy(registry)
        rewrite_policy(server, "onCredentialError: deny\n" + policy)
        try:
            with pytest.raises(k8s.ApiException) as denied:
                create_pod(api, namespace, pod(installed, name="denied"))
            stored = k8s.CoreV1Api(api).list_namespaced_pod(namespace).items
        finally:
            rewrite_policy(server, policy)
    assert [s["containers"][0]["image"] for s in skipped] == [registry.upstream_image] * 2
    assert counted == 2
    # Two admissions, one Event: reported once per name, not once per Pod.
    assert len(events) == 1, events
    (event,) = events
    assert (event.type, event.involved_object.kind, event.involved_object.name) == (
        "Warning",
        "Secret",
        SQUATTED,
    )
    assert f"Secret {namespace}/{SQUATTED} was not made by mirrorgate" in str(event.message)
    body = str(denied.value.body)
    assert f"Secret {namespace}/{SQUATTED} exists and was not created by mirrorgate" in body
    assert "the name prefix mirrorgate- is reserved" in body
    assert sorted(str(p.metadata.name) for p in stored if p.metadata) == ["first", "second"]


# --------------------------------------------------------------------------- ConfigMaps

RECORD_LABELS = {MANAGED_BY: "mirrorgate", "mirrorgate.io/record": "pull-secret"}
ACCEPTED = "mirrorgate-policy-accepted"


def _config_map(name: str, data: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": data,
    }


def _record(namespace: str, secret_name: str, **data: str) -> dict[str, Any]:
    fields = {"namespace": namespace, "secret": secret_name, "credential": "c", **data}
    return _config_map(f"copy.{namespace}.{secret_name}", fields, RECORD_LABELS)


def _accepted(api: k8s.ApiClient) -> dict[str, str] | None:
    return kube.config_map_data(api, mg.NAMESPACE, ACCEPTED)


def test_service_account_writes_only_its_own_config_maps(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """Never the policy, the provider configuration, a ConfigMap elsewhere or a record that is
    not one; the accepted policy only labelled for the policy webhook, which refuses an
    invalid one. The controls: a record created, completed and dropped, a valid accepted
    policy, the CA certificate published."""
    plane = installed.control_plane
    tenant_namespace = make_namespace(ENFORCE_LABELS)
    wait_in_force(plane, tenant_namespace)
    home = mg.NAMESPACE
    policy_text = e2e_policy(installed.registry)
    own = {MANAGED_BY: "mirrorgate"}
    accepted_labels = {**own, "mirrorgate.io/policy": "accepted"}
    copy_name = f"mirrorgate-{secrets.token_hex(3)}"
    with plane.api_client() as admin:
        original = _accepted(admin)
    with as_service_account(plane) as api:
        core = k8s.CoreV1Api(api)
        create = core.create_namespaced_config_map
        other_name = {
            **_record(tenant_namespace, copy_name),
            "metadata": {"name": f"copy.{tenant_namespace}.other", "labels": RECORD_LABELS},
        }
        refused = {
            "the policy": refusal(
                create,
                home,
                _config_map(
                    "mirrorgate-policy",
                    {"policy.yaml": policy_text},
                    {**own, "mirrorgate.io/policy": "true"},
                ),
            ),
            "the provider configuration": refusal(
                create,
                home,
                _config_map("mirrorgate-credential-providers", {"config.yaml": "{}"}, own),
            ),
            "a record of another name": refusal(create, home, other_name),
            "a record with more data": refusal(
                create, home, _record(tenant_namespace, copy_name, extra="x")
            ),
            "a record of a Secret not mirrorgate's": refusal(
                create, home, _record(tenant_namespace, "app-login")
            ),
            "the accepted policy unlabelled": refusal(
                create, home, _config_map(ACCEPTED, {"policy.yaml": policy_text}, own)
            ),
        }
        # Elsewhere RBAC already refuses (the Role is mirrorgate's namespace's).
        elsewhere = refusal(create, tenant_namespace, _record(tenant_namespace, copy_name))
        # The session's server keeps its accepted policy: replaced here, as it does.
        assert original is not None
        replace = core.replace_namespaced_config_map
        with pytest.raises(k8s.ApiException) as invalid:
            replace(
                ACCEPTED,
                home,
                _config_map(  # type: ignore[arg-type]
                    ACCEPTED, {"policy.yaml": "mirrors: [{source: docker.io}]\n"}, accepted_labels
                ),
                dry_run="All",
            )
        # The controls: what the code writes.
        record = create(home, _record(tenant_namespace, copy_name))  # type: ignore[arg-type]
        assert record.metadata is not None
        done = _record(tenant_namespace, copy_name, uid="u", fingerprint="f")
        done["metadata"]["resourceVersion"] = record.metadata.resource_version
        core.replace_namespaced_config_map(str(record.metadata.name), home, done)  # type: ignore[arg-type]
        core.delete_namespaced_config_map(str(record.metadata.name), home)
        replace(
            ACCEPTED,
            home,
            _config_map(ACCEPTED, {"policy.yaml": policy_text}, accepted_labels),  # type: ignore[arg-type]
            dry_run="All",
        )
        published = create(
            home,
            _config_map("mirrorgate-ca", {"ca.crt": "pem"}, own),  # type: ignore[arg-type]
            dry_run="All",
        )
    assert "forbidden" in elsewhere
    assert published.data == {"ca.crt": "pem"}
    assert {k: CONFIGMAPS_REFUSAL in v for k, v in refused.items()} == dict.fromkeys(
        refused, True
    ), refused
    # The policy webhook judged mirrorgate's own copy as it judges the policy.
    assert invalid.value.status == 403, invalid.value.body
    assert "policy.mirrorgate.io" in str(invalid.value.body)
    assert ACCEPTED in str(invalid.value.body)
    with plane.api_client() as admin:
        after = k8s.CoreV1Api(admin).list_namespaced_config_map(
            home, label_selector="mirrorgate.io/record=pull-secret"
        )
        now = _accepted(admin)
    assert f"copy.{tenant_namespace}.{copy_name}" not in {
        c.metadata.name for c in after.items if c.metadata
    }
    assert now == original  # the accepted policy was written only as a dry run


def test_service_account_creates_only_its_own_events(installed: Installed) -> None:
    """A Normal Event, another reason or another reporter are refused; the squatting
    Warning (the control) is created."""
    plane = installed.control_plane
    wait_in_force(plane, "kube-system")

    def event(reason: str, kind: str = "Warning", reporter: str = "mirrorgate") -> dict[str, Any]:
        return {
            "metadata": {"generateName": "e2e."},
            "involvedObject": {
                "kind": "Namespace",
                "name": "kube-system",
                "namespace": "kube-system",
            },
            "type": kind,
            "reason": reason,
            "message": "x",
            "reportingComponent": reporter,
        }

    with as_service_account(plane) as api:
        core = k8s.CoreV1Api(api)
        messages = [
            refusal(
                core.create_namespaced_event,
                "kube-system",
                event("PullSecretNameSquatted", "Normal"),
            ),
            refusal(core.create_namespaced_event, "kube-system", event("NodeNotReady")),
            refusal(
                core.create_namespaced_event,
                "kube-system",
                event("PolicyRejected", reporter="kubelet"),
            ),
        ]
        core.create_namespaced_event("kube-system", event("PullSecretNameSquatted"))  # type: ignore[arg-type]
    assert all(EVENTS_REFUSAL in m for m in messages), messages
