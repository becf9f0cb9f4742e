"""Small Kubernetes helpers for e2e tests: namespaces, Pods, cert-manager CRDs, warnings,
the real kubectl."""

from __future__ import annotations

import re
import secrets
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import dynamic

from mirrorgate.webhook.policyfile import crds
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.procs import wait_until

# RFC 7234 warn-value as kube-apiserver sends it: `299 - "text"` (quotes escaped).
_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"')
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def run_kubectl(kubectl: Path, kubeconfig: Path, *args: str) -> str:
    """``kubectl ARGS`` as ``kubeconfig``'s user; its output (fails the test on an error)."""
    done = subprocess.run(
        [str(kubectl), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def namespace_name(hint: str) -> str:
    """A unique DNS-1123 label that still says which test made it."""
    slug = _NOT_DNS.sub("-", hint.lower()).strip("-")[:40].rstrip("-") or "ns"
    return f"e2e-{slug}-{secrets.token_hex(3)}"


def create_namespace(api: k8s.ApiClient, name: str, labels: Mapping[str, str] | None = None) -> str:
    """Create namespace `name` with `labels` and its `default` ServiceAccount.

    With no controller-manager nothing creates `default`, and the ServiceAccount
    admission plugin (which runs before the webhooks, as in production) rejects
    every Pod in a namespace without it. Where a controller-manager runs (the
    node cluster) it may create `default` first, which is just as good.
    """
    core = k8s.CoreV1Api(api)
    core.create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=dict(labels or {})))
    )
    try:
        core.create_namespaced_service_account(
            name, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
        )
    except k8s.ApiException as error:
        if error.status != 409:
            raise
    return name


def create_pod(
    api: k8s.ApiClient,
    namespace: str,
    body: k8s.V1Pod | Mapping[str, Any],
    dry_run: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """Create a Pod (a model or its JSON); the stored object as a dict, and the warnings."""
    core = k8s.CoreV1Api(api)
    # The generated client takes plain dicts at run time; its annotations say models.
    pod: Any = body if isinstance(body, k8s.V1Pod) else dict(body)
    created, _, headers = core.create_namespaced_pod_with_http_info(
        namespace, pod, dry_run="All" if dry_run else None
    )
    stored: dict[str, Any] = api.sanitize_for_serialization(created)  # type: ignore[no-untyped-call]
    return stored, warning_messages(headers)


def cert_manager_crds(api: k8s.ApiClient) -> None:
    """Stand-ins for cert-manager's CRDs, which cannot be installed here.

    Same group, versions and kinds, with a permissive schema: enough for the
    API server to accept or reject the overlay's objects by kind and shape.
    """
    extensions = k8s.ApiextensionsV1Api(api)
    for kind, plural in (("Issuer", "issuers"), ("Certificate", "certificates")):
        body = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.cert-manager.io"},
            "spec": {
                "group": "cert-manager.io",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
        try:
            extensions.create_custom_resource_definition(body)  # type: ignore[arg-type]
        except k8s.ApiException as error:
            if error.status != 409:
                raise


def warning_messages(headers: Any) -> list[str]:
    """The texts of all `Warning` headers of a response (admission warnings among them).

    `headers` is the third element of a `*_with_http_info` call's result (a urllib3
    HTTPHeaderDict) or any mapping; repeated headers are all read.
    """
    if hasattr(headers, "getlist"):
        values: list[str] = headers.getlist("Warning")
    else:
        value = headers.get("Warning") if isinstance(headers, Mapping) else None
        values = [value] if value else []
    messages: list[str] = []
    for value in values:
        messages += [m.replace('\\"', '"').replace("\\\\", "\\") for m in _WARNING.findall(value)]
    return messages


def bind(
    rbac: k8s.RbacAuthorizationV1Api,
    name: str,
    role: tuple[str, str],
    subject: dict[str, str],
    *,
    namespace: str | None = None,
) -> None:
    """Bind ``role`` (kind, name) to ``subject`` as ``name``: a RoleBinding in ``namespace``,
    or a ClusterRoleBinding without one."""
    body = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role[0], "name": role[1]},
        "subjects": [subject],
    }
    if namespace is None:
        rbac.create_cluster_role_binding(body)  # type: ignore[arg-type]
    else:
        rbac.create_namespaced_role_binding(namespace, body)  # type: ignore[arg-type]


def user_subject(name: str) -> dict[str, str]:
    """The RBAC subject of the user ``name`` (as a client certificate's CN names it)."""
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}


def apply(
    api: k8s.ApiClient,
    objects: Iterable[Mapping[str, Any]],
    *,
    field_manager: str = "mirrorgate-e2e",
    dry_run: bool = False,
) -> None:
    """Server-side apply of each object, as `kubectl apply --server-side --force-conflicts`
    does (with `--dry-run=server` when ``dry_run``)."""
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    for obj in objects:
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        client.server_side_apply(  # type: ignore[no-untyped-call]
            resource,
            body=obj,
            namespace=obj["metadata"].get("namespace"),
            field_manager=field_manager,
            force_conflicts=True,
            dry_run="All" if dry_run else None,
        )


def config_map_data(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, str] | None:
    """The data of ConfigMap ``namespace``/``name``; None when there is none."""
    found = k8s.CoreV1Api(api).list_namespaced_config_map(
        namespace, field_selector=f"metadata.name={name}"
    )
    return dict(found.items[0].data or {}) if found.items else None


def refusal(call: Any, *args: Any) -> str:
    """The API server's message for a refused call (fails the test if it was allowed)."""
    with pytest.raises(k8s.ApiException) as caught:
        call(*args)
    assert caught.value.status == 403, caught.value.body
    return str(caught.value.body)


def tenant(api: k8s.ApiClient, namespace: str, resource: str) -> str:
    """A user who may create ``resource`` in ``namespace`` and nothing else (a Role of its
    own: no controller-manager fills the aggregated `edit` role here)."""
    user = f"e2e-tenant-{secrets.token_hex(3)}"
    rbac = k8s.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        {  # type: ignore[arg-type]
            "metadata": {"name": user},
            "rules": [{"apiGroups": [""], "resources": [resource], "verbs": ["create"]}],
        },
    )
    bind(rbac, user, ("Role", user), user_subject(user), namespace=namespace)
    return user


POLICY_CRDS = ("clustermirrorpolicies.mirrorgate.io", "mirrorpolicies.mirrorgate.io")


def install_policy_crds(api: k8s.ApiClient) -> None:
    """mirrorgate's two policy CRDs, from the tree, created on a control plane of a test's
    own; returns once the API server serves both (Established)."""
    extensions = k8s.ApiextensionsV1Api(api)
    for path in sorted((REPO_ROOT / crds.CRD_DIR).glob("*.yaml")):
        extensions.create_custom_resource_definition(yaml.safe_load(path.read_text()))

    def established() -> str | None:
        for name in POLICY_CRDS:
            status = extensions.read_custom_resource_definition(name).status
            conditions = {c.type: c.status for c in (status and status.conditions) or ()}
            if conditions.get("Established") != "True":
                return f"{name}: {conditions}"
        return None

    wait_until(established, timeout=30, what="the policy CRDs established", interval=0.2)
