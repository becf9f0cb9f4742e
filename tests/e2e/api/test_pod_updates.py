"""Pod UPDATE, image volumes and wide Pods against the real API server (issue 28, item 1).

Before, Pod UPDATE never reached mirrorgate (`kubectl set image` pulled from
upstream), image volumes were never rewritten, and a Pod past
--max-containers was admitted as written in an enforce namespace.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from mirrorgate.webhook import admission
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness import versioned
from tests.e2e.harness.apiload import DURATION, api_server_samples
from tests.e2e.harness.apiload import _total as total
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS, metric, metrics_text
from tests.e2e.harness.kube import create_pod, warning_messages
from tests.e2e.harness.suite import CREDENTIAL, DOCKERHUB_MIRROR, Installed, MakeNamespace

pytestmark = pytest.mark.e2e

ANNOTATION = policy.ORIGINAL_IMAGES_ANNOTATION
SECRET = policy.pull_secret_name(CREDENTIAL)


def hub_pod(name: str = "web", image: str = "docker.io/library/nginx:1.27") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": image}]},
    }


def set_image(
    api: k8s.ApiClient, namespace: str, name: str, image: str
) -> tuple[dict[str, Any], list[str]]:
    """What `kubectl set image pod/NAME app=IMAGE` sends: a strategic merge patch (an UPDATE)."""
    body = {"spec": {"containers": [{"name": "app", "image": image}]}}
    patched, _, headers = k8s.CoreV1Api(api).patch_namespaced_pod_with_http_info(
        name, namespace, body
    )
    stored: dict[str, Any] = api.sanitize_for_serialization(patched)  # type: ignore[no-untyped-call]
    return stored, warning_messages(headers)


def enforce_counts(api: k8s.ApiClient) -> tuple[float, float, float]:
    """The API server's calls of enforce.mirrorgate.io for UPDATE, the updates its match
    condition left out, and the condition's evaluation errors."""
    page, webhook = api_server_samples(api), mg.ENFORCE_WEBHOOK
    return (
        total(page, f"{DURATION}_count", webhook, operation="UPDATE"),
        total(page, "apiserver_admission_match_condition_exclusions", webhook),
        total(page, "apiserver_admission_match_condition_evaluation_errors", webhook),
    )


def test_set_image_on_a_running_pod_goes_to_the_mirror(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """`kubectl set image` reaches mirrorgate; the record names the image it replaced."""
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, _ = create_pod(api, namespace, hub_pod())
        assert created["spec"]["containers"][0]["image"] == f"{DOCKERHUB_MIRROR}/library/nginx:1.27"
        calls, _, errors = enforce_counts(api)
        updated, warnings = set_image(api, namespace, "web", "nginx:1.28")
        after = enforce_counts(api)
    assert updated["spec"]["containers"][0]["image"] == f"{DOCKERHUB_MIRROR}/library/nginx:1.28"
    assert json.loads(updated["metadata"]["annotations"][ANNOTATION]) == {
        "containers/app": "nginx:1.28"
    }
    assert warnings == []
    assert (after[0] - calls, after[2] - errors) == (1, 0)


def test_an_update_of_a_label_never_reaches_mirrorgate(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """The match condition leaves out updates that change no image: nothing waits for
    mirrorgate, and the Pod is unchanged."""
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, _ = create_pod(api, namespace, hub_pod())
        before = enforce_counts(api)
        patched = k8s.CoreV1Api(api).patch_namespaced_pod(
            "web", namespace, {"metadata": {"labels": {"release": "canary"}}}
        )
        after = enforce_counts(api)
    stored = api.sanitize_for_serialization(patched)
    assert stored["spec"]["containers"] == created["spec"]["containers"]
    assert stored["metadata"]["annotations"] == created["metadata"]["annotations"]
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (0, 1, 0)


def test_an_update_needing_a_pull_secret_the_pod_lacks_is_refused(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """The suite's upstream needs the credential; a Pod made without it cannot gain it."""
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, _ = create_pod(api, namespace, hub_pod())
        assert "imagePullSecrets" not in created["spec"]
        with pytest.raises(k8s.ApiException) as refused:
            set_image(api, namespace, "web", installed.registry.upstream_image)
        stored = api.sanitize_for_serialization(
            k8s.CoreV1Api(api).read_namespaced_pod("web", namespace)
        )
    assert refused.value.status == 403
    message = json.loads(str(refused.value.body))["message"]
    assert f"needs {SECRET!r}" in message
    assert "Recreate the Pod" in message
    assert stored["spec"]["containers"][0]["image"] == f"{DOCKERHUB_MIRROR}/library/nginx:1.27"


def _image_volume_pod(installed: Installed) -> dict[str, Any]:
    body = hub_pod()
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "tools", "mountPath": "/tools"}]
    body["spec"]["volumes"] = [
        {"name": "app", "image": {"reference": installed.registry.upstream_image}},
        {"name": "tools", "image": {"reference": "busybox:1.36", "pullPolicy": "IfNotPresent"}},
    ]
    return body


def test_an_image_volume_is_pulled_through_the_mirror(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """spec.volumes[].image.reference is rewritten, gets the pull secret, and is recorded.

    Needs 1.35 (image volumes on by default); before it, the documented fallback
    (harness/versioned.py): removed after admission (1.34: the record names them),
    refused by the API server (1.31-1.33), or (1.30) an emptyDir, so nothing is pulled."""
    registry = installed.registry
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        made = versioned.create_with_image_volumes(api, namespace, _image_volume_pod(installed))
    if made is None:
        return
    created, warnings = made
    if not versioned.image_volumes():
        records = {"containers/app": "docker.io/library/nginx:1.27"}
        if versioned.image_volumes_admitted():  # 1.34: recorded, then removed after admission
            records |= {"volumes/app": registry.upstream_image, "volumes/tools": "busybox:1.36"}
        assert json.loads(created["metadata"]["annotations"][ANNOTATION]) == records
        return
    volumes = created["spec"]["volumes"]
    assert volumes[0]["image"]["reference"] == registry.mirror_image
    assert volumes[1]["image"] == {
        "reference": f"{DOCKERHUB_MIRROR}/library/busybox:1.36",
        "pullPolicy": "IfNotPresent",
    }
    assert created["spec"]["imagePullSecrets"] == [{"name": SECRET}]
    # A volume named like a container has a record of its own.
    assert json.loads(created["metadata"]["annotations"][ANNOTATION]) == {
        "containers/app": "docker.io/library/nginx:1.27",
        "volumes/app": registry.upstream_image,
        "volumes/tools": "busybox:1.36",
    }
    assert warnings == []


def test_a_pod_past_max_containers_is_refused_to_enforce(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    count = admission.MAX_CONTAINERS + 1
    body = hub_pod()
    body["spec"]["containers"] = [
        {"name": f"c{i}", "image": "docker.io/library/nginx:1.27"} for i in range(count)
    ]
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        with pytest.raises(k8s.ApiException) as refused:
            create_pod(api, namespace, body)
    assert refused.value.status == 403
    message = json.loads(str(refused.value.body))["message"]
    assert f"names {count:,} images" in message
    assert "serve --max-containers" in message


def test_images_left_unmirrored_are_counted_by_reason(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """An audit namespace's covered images are counted, as alerts see them."""
    before = metric(
        metrics_text(installed.server), "mirrorgate_images_left_unmirrored_total", reason="audit"
    )
    with installed.control_plane.api_client() as api:
        namespace = make_namespace({policy.MODE_LABEL: "audit"})
        create_pod(api, namespace, hub_pod())
    after = metric(
        metrics_text(installed.server), "mirrorgate_images_left_unmirrored_total", reason="audit"
    )
    assert after - before == 1
