"""What a tenant writes into a Pod cannot switch rewriting off: a forged record of the
originals, or a registry host spelled another way (real API server, manifests/base)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mirrorgate import policy
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.kube import create_pod
from tests.e2e.harness.suite import DOCKERHUB_MIRROR, Installed, MakeNamespace

pytestmark = pytest.mark.e2e

ANNOTATION = policy.ORIGINAL_IMAGES_ANNOTATION


def _pod(annotations: dict[str, str] | None, **images: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "annotations": annotations or {}},
        "spec": {"containers": [{"name": n, "image": i} for n, i in images.items()]},
    }


def test_a_forged_record_is_rebuilt_from_the_images_rewritten(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """Fake originals and a container that does not exist are dropped, with a warning;
    the stored record holds the originals of the images mirrorgate rewrote."""
    forged = json.dumps({"containers/app": "evil.example/app:1", "ghost/x": "nginx"})
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, warnings = create_pod(
            api, namespace, _pod({ANNOTATION: forged}, app="docker.io/library/nginx:1.27")
        )
    assert created["spec"]["containers"][0]["image"] == f"{DOCKERHUB_MIRROR}/library/nginx:1.27"
    assert json.loads(created["metadata"]["annotations"][ANNOTATION]) == {
        "containers/app": "docker.io/library/nginx:1.27"
    }
    assert any("dropped, and the record rebuilt" in w for w in warnings), warnings


def test_a_forged_record_on_a_mirrored_image_is_removed(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """Nothing rewritten, nothing recorded: the API server applies the remove."""
    forged = json.dumps({"containers/app": "busybox:1.36"})
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, _ = create_pod(
            api,
            namespace,
            _pod({ANNOTATION: forged, "team": "a"}, app=f"{DOCKERHUB_MIRROR}/library/nginx:1.27"),
        )
    assert created["metadata"]["annotations"] == {"team": "a"}


def test_hosts_spelled_another_way_are_the_same_host(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """Upper case and :443 reach Docker Hub as docker.io does: rewritten onto the mirror as
    configured; the mirror spelled so is already mirrored."""
    respelled_mirror = DOCKERHUB_MIRROR.replace("mirror.e2e.example", "Mirror.E2E.Example:443")
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(ENFORCE_LABELS)
        created, warnings = create_pod(
            api,
            namespace,
            _pod(
                None,
                hub="Registry-1.Docker.IO:443/library/nginx:1.27",
                mirrored=f"{respelled_mirror}/library/busybox:1.36",
            ),
        )
    images = [c["image"] for c in created["spec"]["containers"]]
    assert images == [
        f"{DOCKERHUB_MIRROR}/library/nginx:1.27",
        f"{respelled_mirror}/library/busybox:1.36",
    ]
    assert json.loads(created["metadata"]["annotations"][ANNOTATION]) == {
        "containers/hub": "Registry-1.Docker.IO:443/library/nginx:1.27"
    }
    assert warnings == []
