"""Admission against the real API server: the webhook registered from manifests/base."""

from __future__ import annotations

import base64
import contextlib
import json

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from mirrorgate.webhook import admission
from tests.e2e.harness.fixtures_secrets import AUDIT_LABELS, ENFORCE_LABELS
from tests.e2e.harness.kube import create_pod, warning_messages
from tests.e2e.harness.suite import CREDENTIAL, DOCKERHUB_MIRROR, Installed, MakeNamespace, pod

pytestmark = pytest.mark.e2e

ANNOTATION = policy.ORIGINAL_IMAGES_ANNOTATION
SECRET = policy.pull_secret_name(CREDENTIAL)


def secret_exists(api: k8s.ApiClient, namespace: str, name: str = SECRET) -> bool:
    try:
        k8s.CoreV1Api(api).read_namespaced_secret(name, namespace)
    except k8s.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def test_enforce_rewrites_and_provisions_before_admission(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """An enforce namespace: images rewritten, originals kept, secret attached and present."""
    registry = installed.registry
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, warnings = create_pod(api, namespace, pod(installed))
        # Read at once: the Secret must exist before the create call returned.
        assert secret_exists(api, namespace)
    spec = created["spec"]
    assert spec["containers"][0]["image"] == registry.mirror_image
    assert spec["containers"][1]["image"] == f"{DOCKERHUB_MIRROR}/library/nginx:1.27"
    assert spec["initContainers"][0]["image"] == f"{DOCKERHUB_MIRROR}/library/busybox:1.36"
    assert spec["imagePullSecrets"] == [{"name": SECRET}]
    assert json.loads(created["metadata"]["annotations"][ANNOTATION]) == {
        "containers/app": registry.upstream_image,
        "containers/sidecar": "docker.io/library/nginx:1.27",
        "initContainers/init": "busybox:1.36",
    }
    assert warnings == []


def test_audit_namespace_stores_pod_unchanged_and_warns(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """An audit namespace: the Pod is stored as written; one warning per planned rewrite."""
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(AUDIT_LABELS)
        created, warnings = create_pod(api, namespace, pod(installed))
        assert not secret_exists(api, namespace)
    assert [c["image"] for c in created["spec"]["containers"]] == [
        installed.registry.upstream_image,
        "docker.io/library/nginx:1.27",
    ]
    assert created["spec"]["initContainers"][0]["image"] == "busybox:1.36"
    assert ANNOTATION not in (created["metadata"].get("annotations") or {})
    assert "imagePullSecrets" not in created["spec"]
    assert len(warnings) == 3, warnings
    assert any(
        f"containers/app would use {installed.registry.mirror_image}" in w for w in warnings
    ), warnings
    assert any(
        f"initContainers/init would use {DOCKERHUB_MIRROR}/library/busybox:1.36" in w
        for w in warnings
    ), warnings


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param(None, id="unlabelled"),
        pytest.param({"mirrorgate.io/mode": "bogus"}, id="unknown-mode"),
    ],
)
def test_namespace_not_opted_in_is_untouched(
    installed: Installed, make_namespace: MakeNamespace, labels: dict[str, str] | None
) -> None:
    """A namespace without an opt-in label: the Pod is stored exactly as written."""
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(labels)
        created, warnings = create_pod(api, namespace, pod(installed))
    assert created["spec"]["containers"][0]["image"] == installed.registry.upstream_image
    assert ANNOTATION not in (created["metadata"].get("annotations") or {})
    assert warnings == []


def test_kube_system_is_untouched_even_when_labelled(installed: Installed) -> None:
    """kube-system labelled for enforcement is still never mutated."""
    with installed.control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.patch_namespace("kube-system", {"metadata": {"labels": ENFORCE_LABELS}})
        try:
            with contextlib.suppress(k8s.ApiException):  # it may exist from an earlier test
                core.create_namespaced_service_account(
                    "kube-system", k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
                )
            created, warnings = create_pod(api, "kube-system", pod(installed, name="sys-e2e"))
        finally:
            core.patch_namespace(
                "kube-system", {"metadata": {"labels": {"mirrorgate.io/mode": None}}}
            )
    assert created["spec"]["containers"][0]["image"] == installed.registry.upstream_image
    assert "imagePullSecrets" not in created["spec"]
    assert warnings == []


def test_skip_label_opts_a_pod_out(installed: Installed, make_namespace: MakeNamespace) -> None:
    """A Pod labelled mirrorgate.io/skip=true is not sent to the webhook at all."""
    body = pod(installed, labels={"mirrorgate.io/skip": "true"})
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, _ = create_pod(api, namespace, body)
    assert created["spec"]["containers"][0]["image"] == installed.registry.upstream_image


def test_server_side_dry_run_rewrites_without_creating_secret(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """dryRun=All: the returned Pod is rewritten, and no Secret was created."""
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, _ = create_pod(api, namespace, pod(installed), dry_run=True)
        assert not secret_exists(api, namespace)
        with pytest.raises(k8s.ApiException) as missing:
            k8s.CoreV1Api(api).read_namespaced_pod("web", namespace)
        assert missing.value.status == 404
    assert created["spec"]["containers"][0]["image"] == installed.registry.mirror_image
    assert created["spec"]["imagePullSecrets"] == [{"name": SECRET}]


def test_generate_name_pod_is_rewritten(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """A Pod with only generateName (as controllers make them) is handled."""
    body = pod(installed)
    body.metadata = k8s.V1ObjectMeta(generate_name="web-")
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, _ = create_pod(api, namespace, body)
    assert created["metadata"]["name"].startswith("web-")
    assert created["spec"]["containers"][0]["image"] == installed.registry.mirror_image


def test_ephemeral_container_is_rewritten_and_recorded(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """`kubectl debug`: a container added through pods/ephemeralcontainers is rewritten.

    The API server ignores metadata changes on this subresource, so the
    original is recorded in the user's warning (and the audit log), and the
    annotation written at creation stays as it was.
    """
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, _ = create_pod(api, namespace, pod(installed))
        core = k8s.CoreV1Api(api)
        patch = {
            "spec": {
                "ephemeralContainers": [
                    {"name": "debugger", "image": "busybox:1.36", "command": ["sh"]}
                ]
            }
        }
        updated, _, headers = core.patch_namespaced_pod_ephemeralcontainers_with_http_info(
            "web", namespace, patch
        )
        stored = api.sanitize_for_serialization(updated)
    (debugger,) = stored["spec"]["ephemeralContainers"]
    assert debugger["image"] == f"{DOCKERHUB_MIRROR}/library/busybox:1.36"
    assert warning_messages(headers) == [
        f"mirrorgate: ephemeralContainers/debugger uses {DOCKERHUB_MIRROR}/library/busybox:1.36 "
        "(was busybox:1.36)"
    ]
    assert (
        stored["metadata"]["annotations"][ANNOTATION]
        == created["metadata"]["annotations"][ANNOTATION]
    )
    # The containers admitted at creation are not touched again.
    assert [c["image"] for c in stored["spec"]["containers"]] == [
        c["image"] for c in created["spec"]["containers"]
    ]


def test_generated_secret_is_a_dockerconfigjson_for_the_mirror(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """The generated Secret's shape: one `auths` entry for the mirror, labelled as ours.

    That the real kubelet picks it for the rewritten image and the mirror
    accepts it is shown on the node (tests/e2e/node/test_node.py, scenario 2).
    """
    registry = installed.registry
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        create_pod(api, namespace, pod(installed))
        secret = k8s.CoreV1Api(api).read_namespaced_secret(SECRET, namespace)
    assert secret.type == "kubernetes.io/dockerconfigjson"
    assert secret.metadata is not None
    assert secret.data is not None
    assert secret.metadata.labels == {
        "app.kubernetes.io/managed-by": "mirrorgate",
        "mirrorgate.io/credential": CREDENTIAL,
    }
    config = json.loads(base64.b64decode(secret.data[".dockerconfigjson"]))
    assert list(config["auths"]) == [registry.host]
    assert config == registry.dockerconfigjson()  # username, password and a matching auth


def test_a_pod_wider_than_max_containers_is_stored_as_written_in_audit_saying_why(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """Issue 19: past --max-containers the Pod is not planned; the user is told why. In an
    enforce namespace it is refused (issue 28, tests/e2e/api/test_pod_updates.py); in an
    audit one it is stored as written.

    The warning is the proof that the webhook answered: under failurePolicy
    Ignore the Pod would be stored as written without it too.
    """
    count = admission.MAX_CONTAINERS + 1
    wide = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="wide"),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name=f"c{i}", image="busybox:1.36") for i in range(count)]
        ),
    )
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(AUDIT_LABELS)
        created, warnings = create_pod(api, namespace, wide)
    assert {c["image"] for c in created["spec"]["containers"]} == {"busybox:1.36"}
    assert ANNOTATION not in (created["metadata"].get("annotations") or {})
    assert warnings == [
        f"mirrorgate: the Pod names {count:,} images (containers and image volumes), more "
        f"than the {admission.MAX_CONTAINERS:,} it checks (serve --max-containers); "
        "its images are left as written, unchecked"
    ]
