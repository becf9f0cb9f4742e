"""What the API server does with an image volume, by minor (docs/install.md, "Supported
Kubernetes versions"): the API-server and the node tests of image volumes run either side.

From 1.35 image volumes are beta and on by default, and mirrorgate rewrites them. Before,
the ImageVolume gate is off by default, and what the API server does differs by minor:

* 1.34 (run on v1.34.4) removes each image volume, and every mount of it, without a
  warning: the Pod is stored and runs without them;
* 1.31 to 1.33 (not in the matrix) drop the field after admission and refuse the Pod,
  whose volume has no type left;
* 1.30 (run on v1.30.14) does not know the field: it drops it with a warning and
  defaults the volume to an emptyDir.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from tests.e2e.harness.binaries import kubernetes_minor
from tests.e2e.harness.kube import create_pod

IMAGE_VOLUMES_SINCE = 35
IMAGE_VOLUMES_REMOVED_SINCE = 34
IMAGE_VOLUME_FIELD_SINCE = 31


def image_volumes() -> bool:
    """Whether this minor's API server keeps image volumes (on by default)."""
    return kubernetes_minor() >= IMAGE_VOLUMES_SINCE


def image_volumes_admitted() -> bool:
    """Whether mirrorgate sees a Pod's image volumes: from 1.31 the API server knows the
    field and drops it (or the volume) only after admission, so mirrorgate rewrites and
    records volumes that the stored Pod no longer has (1.34); 1.30 drops it as it decodes."""
    return kubernetes_minor() >= IMAGE_VOLUME_FIELD_SINCE


def create_with_image_volumes(
    api: k8s.ApiClient, namespace: str, body: dict[str, Any]
) -> tuple[dict[str, Any], list[str]] | None:
    """Create ``body`` (a Pod whose volumes are all image volumes). Before 1.35 asserts
    the documented fallback: on 1.34 the volumes and their mounts gone, without a
    warning; None where the API server refuses it (1.31-1.33); on 1.30 every volume an
    emptyDir, each dropped field named in a warning."""
    minor = kubernetes_minor()
    named = {v["name"] for v in body["spec"]["volumes"]}
    if IMAGE_VOLUME_FIELD_SINCE <= minor < IMAGE_VOLUMES_REMOVED_SINCE:
        with pytest.raises(k8s.ApiException) as refused:
            create_pod(api, namespace, body)
        assert refused.value.status == 422
        assert "must specify a volume type" in str(refused.value.body)
        return None
    created, warnings = create_pod(api, namespace, body)
    if IMAGE_VOLUMES_REMOVED_SINCE <= minor < IMAGE_VOLUMES_SINCE:
        assert {v["name"] for v in created["spec"]["volumes"]} & named == set()
        mounts = [
            m["name"] for c in created["spec"]["containers"] for m in c.get("volumeMounts") or ()
        ]
        assert set(mounts) & named == set(), mounts
        assert warnings == []
    if minor < IMAGE_VOLUME_FIELD_SINCE:
        volumes = created["spec"]["volumes"]
        assert [v for v in volumes if "image" in v] == []
        assert {v["name"] for v in volumes if "emptyDir" in v} >= named
        for index in range(len(body["spec"]["volumes"])):
            field = f'unknown field "spec.volumes[{index}].image"'
            assert any(field in w for w in warnings), (field, warnings)
    return created, warnings
