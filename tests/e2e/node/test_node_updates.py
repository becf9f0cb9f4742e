"""On the real node: a Pod UPDATE that changes an image, and an image volume, both pull
through the mirror (issue 28, item 1).

Before, `kubectl set image` on a running Pod reached no webhook and the
kubelet pulled the new image from the upstream; an image volume
(``spec.volumes[].image``, beta and on by default since Kubernetes 1.35) was
never rewritten and got no pull secret. containerd 2 mounts image volumes
through the CRI (``ImageSpec`` mounts); the kubelet pulls them with the
Pod's pull secrets, as it does a container's image.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from tests.e2e.harness import nodepods, versioned
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.incluster import Release
from tests.e2e.harness.kube import create_pod
from tests.e2e.harness.nodepods import Workload, by_node, manifest_statuses, push_workload
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.suite import CREDENTIAL
from tests.e2e.node.test_node import IMAGE, INSTALLED, make_namespace, mirror_image

pytestmark = [pytest.mark.e2e, pytest.mark.node, INSTALLED, IMAGE]

SECRET = policy.pull_secret_name(CREDENTIAL)


def pulled_through_the_mirror(registry: RegistryStack, workload: Workload) -> None:
    """The node fetched ``workload`` from the mirror, and never from the upstream."""
    assert 200 in manifest_statuses(by_node(registry.access_log("mirror"), workload))
    assert by_node(registry.access_log("upstream"), workload) == []


def test_set_image_on_a_running_pod_pulls_the_new_image_through_the_mirror(
    node_installed: Release,
) -> None:
    registry = node_installed.registry
    first, second = (push_workload(registry, f"node/update-{n}") for n in ("first", "second"))
    with node_installed.control_plane.api_client() as api:
        namespace = make_namespace(api, "set-image", ENFORCE_LABELS, granted=True)
        create_pod(api, namespace, nodepods.pod("app", [nodepods.container("app", first.image)]))
        nodepods.wait_running(api, namespace, "app")
        # What `kubectl set image pod/app app=<second>` sends.
        k8s.CoreV1Api(api).patch_namespaced_pod(
            "app", namespace, {"spec": {"containers": [{"name": "app", "image": second.image}]}}
        )

        def restarted_with_the_second_image() -> str | None:
            stored = nodepods.read(api, namespace, "app")
            for status in stored["status"].get("containerStatuses", []):
                if status["image"].endswith(second.image.rpartition("/")[2]) and (
                    "running" in status.get("state", {})
                ):
                    return None
            return nodepods.describe(stored)

        wait_until(
            restarted_with_the_second_image,
            timeout=nodepods.RUNNING_TIMEOUT,
            what="the container restarted with the new image",
            interval=0.2,
        )
        stored = nodepods.read(api, namespace, "app")
        logs = nodepods.log(api, namespace, "app", "app")
    assert stored["spec"]["containers"][0]["image"] == mirror_image(registry, second)
    assert stored["spec"]["imagePullSecrets"] == [{"name": SECRET}]
    assert second.greeting in logs
    for workload in (first, second):
        pulled_through_the_mirror(registry, workload)


def test_an_image_volume_is_pulled_through_the_mirror(node_installed: Release) -> None:
    """The volume's image is the `hello` program: the container runs it from the volume.

    Needs 1.35 (image volumes on by default); before it, the documented fallback
    (harness/versioned.py), and the node never fetches the volume's image."""
    registry = node_installed.registry
    app, tools = (push_workload(registry, f"node/volume-{n}") for n in ("app", "tools"))
    greeting = "hello from the image volume"
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app"},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "app",
                    "image": app.image,
                    "command": ["/tools/hello"],
                    "env": [{"name": "GREETING", "value": greeting}],
                    "volumeMounts": [{"name": "tools", "mountPath": "/tools"}],
                }
            ],
            "volumes": [{"name": "tools", "image": {"reference": tools.image}}],
        },
    }
    with node_installed.control_plane.api_client() as api:
        namespace = make_namespace(api, "image-volume", ENFORCE_LABELS, granted=True)
        made = versioned.create_with_image_volumes(api, namespace, body)
        if made is None or not versioned.image_volumes():
            assert by_node(registry.access_log("mirror"), tools) == []
            assert by_node(registry.access_log("upstream"), tools) == []
            return
        created, _ = made
        nodepods.wait_running(api, namespace, "app")
        logs = nodepods.log(api, namespace, "app", "app")
    assert created["spec"]["volumes"][0]["image"]["reference"] == mirror_image(registry, tools)
    assert created["spec"]["imagePullSecrets"] == [{"name": SECRET}]
    assert logs.strip() == greeting
    for workload in (app, tools):
        pulled_through_the_mirror(registry, workload)
