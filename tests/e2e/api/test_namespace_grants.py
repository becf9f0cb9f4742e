"""examples/namespace-grants: the grant labels kept admin-only, on the real API server.

``credentials.<name>.namespaceSelector`` grants a login by a namespace
label; the example ValidatingAdmissionPolicy is what keeps a tenant who may
create or label namespaces from granting himself one.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from tests.e2e.harness import kube
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.procs import wait_until

pytestmark = pytest.mark.e2e

EXAMPLE = REPO_ROOT / "examples" / "namespace-grants" / "admin-only-grant-labels.yaml"
LABEL = "grants.mirrorgate.io/hub-robot"
REFUSAL = "only platform admins may set, change or remove grants.mirrorgate.io/ labels"


def _namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}}


def _refused(call: Any, *args: Any) -> str:
    with pytest.raises(k8s.ApiException) as caught:
        call(*args)
    assert caught.value.status in (400, 403, 422), caught.value.body
    return str(caught.value.body)


def test_only_admins_set_the_grant_labels(control_plane: ControlPlane) -> None:
    """A tenant who may create and label namespaces can neither create one with a grant
    label nor add, change or remove one; a platform admin can; other labels stay free."""
    objects = [o for o in yaml.safe_load_all(EXAMPLE.read_text()) if o]
    tenant = f"e2e-tenant-{secrets.token_hex(3)}"
    names = [f"e2e-grants-{secrets.token_hex(3)}" for _ in range(3)]
    with control_plane.api_client() as admin:
        rbac = k8s.RbacAuthorizationV1Api(admin)
        rbac.create_cluster_role(
            {  # type: ignore[arg-type]
                "metadata": {"name": tenant},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["namespaces"],
                        "verbs": ["create", "get", "patch", "update"],
                    }
                ],
            }
        )
        kube.bind(rbac, tenant, ("ClusterRole", tenant), kube.user_subject(tenant))
        for obj in objects:
            k8s_utils.create_from_dict(admin, obj)  # type: ignore[no-untyped-call]
        try:
            with (
                control_plane.api_client(user=tenant, groups=()) as tenant_api,
                control_plane.api_client(
                    user=f"{tenant}-admin", groups=("platform-admins", "system:masters")
                ) as platform_api,
            ):
                core, platform = k8s.CoreV1Api(tenant_api), k8s.CoreV1Api(platform_api)

                def in_force() -> str | None:
                    try:
                        core.create_namespace(
                            _namespace(names[0], {LABEL: "true"}),  # type: ignore[arg-type]
                            dry_run="All",
                        )
                    except k8s.ApiException as error:
                        return None if REFUSAL in str(error.body) else str(error.body)
                    return "allowed"

                wait_until(in_force, timeout=30, what="the grant-label policy", interval=0.2)
                created = _refused(core.create_namespace, _namespace(names[0], {LABEL: "true"}))
                core.create_namespace(_namespace(names[0], {"team": "a"}))  # type: ignore[arg-type]
                added = _refused(
                    core.patch_namespace, names[0], {"metadata": {"labels": {LABEL: "true"}}}
                )
                core.patch_namespace(names[0], {"metadata": {"labels": {"tier": "dev"}}})
                platform.patch_namespace(names[0], {"metadata": {"labels": {LABEL: "true"}}})
                changed = _refused(
                    core.patch_namespace, names[0], {"metadata": {"labels": {LABEL: "no"}}}
                )
                removed = _refused(
                    core.patch_namespace, names[0], {"metadata": {"labels": {LABEL: None}}}
                )
                core.patch_namespace(names[0], {"metadata": {"labels": {"tier": "prod"}}})
                platform.create_namespace(
                    _namespace(names[1], {LABEL: "true"})  # type: ignore[arg-type]
                )
                found = k8s.CoreV1Api(admin).read_namespace(names[0]).metadata
                labels = dict((found.labels if found is not None else None) or {})
        finally:
            admission = k8s.AdmissionregistrationV1Api(admin)
            admission.delete_validating_admission_policy_binding("mirrorgate-grant-labels")
            admission.delete_validating_admission_policy("mirrorgate-grant-labels")
            for name in names[:2]:
                try:
                    k8s.CoreV1Api(admin).delete_namespace(name)
                except k8s.ApiException as error:
                    if error.status != 404:
                        raise
    for message in (created, added, changed, removed):
        assert REFUSAL in message
    assert labels[LABEL] == "true"
    assert labels["tier"] == "prod"
