"""Builders for Pods and AdmissionReview bodies, and helpers to read the answers."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch

V1 = "admission.k8s.io/v1"
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
POD_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}
NAMESPACE = "team-a"

# Images and what the test policy (conftest.POLICY) makes of them.
HUB_IMAGE = "nginx:1.27"
HUB_MIRRORED = "harbor.corp.example/dockerhub-proxy/library/nginx:1.27"
HUB_SECRET = "mirrorgate-harbor-pull"
PROM_IMAGE = "quay.io/prometheus/prometheus:v2.53.0"
PROM_MIRRORED = "mirror.corp.example/prometheus/prometheus:v2.53.0"
UNMATCHED_IMAGE = "registry.example.org/team/app:1.0"


def pod(
    *images: str,
    name: str | None = "web",
    generate_name: str | None = None,
    namespace: str | None = None,
    field: str = "containers",
) -> dict[str, Any]:
    """A Pod with one container per image (named c0, c1, ...) in ``field``."""
    metadata: dict[str, Any] = {}
    if name is not None:
        metadata["name"] = name
    if generate_name is not None:
        metadata["generateName"] = generate_name
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {field: [{"name": f"c{i}", "image": image} for i, image in enumerate(images)]},
    }


def review(
    obj: Any,
    *,
    uid: str = "3f1c2a9e-0000-4000-8000-000000000001",
    operation: str = "CREATE",
    namespace: str | None = NAMESPACE,
    kind: dict[str, str] | None = None,
    sub_resource: str | None = None,
    dry_run: bool | None = None,
    old: Any = None,
    api_version: str = V1,
) -> dict[str, Any]:
    """An AdmissionReview request for ``obj`` as the API server would send it."""
    request: dict[str, Any] = {
        "uid": uid,
        "kind": kind or dict(POD_KIND),
        "resource": dict(POD_RESOURCE),
        "requestKind": kind or dict(POD_KIND),
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": obj,
    }
    if namespace is not None:
        request["namespace"] = namespace
    if sub_resource is not None:
        request["subResource"] = sub_resource
    if dry_run is not None:
        request["dryRun"] = dry_run
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def response_of(body: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` of an AdmissionReview answer, checked for the envelope."""
    assert body["kind"] == "AdmissionReview"
    response = body["response"]
    assert isinstance(response, dict)
    return response


def patch_ops(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoded JSON Patch of a response ([] when there is none)."""
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"], validate=True))
    assert isinstance(ops, list)
    return ops


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``obj`` with ``ops`` applied the way the API server applies them (original untouched)."""
    patched = jsonpatch.apply_patch(copy.deepcopy(obj), ops)
    assert isinstance(patched, dict)
    return patched


def original_images(obj: dict[str, Any]) -> dict[str, str]:
    """The decoded mirrorgate.io/original-images annotation of ``obj``."""
    value = json.loads(obj["metadata"]["annotations"]["mirrorgate.io/original-images"])
    assert isinstance(value, dict)
    return value
