"""A rewrite plan as RFC 6902 JSON Patch operations on exactly the fields that change.

Never a diff of whole objects and never a re-serialised typed Pod: the API
server applies these few operations to the object it holds, so every field we
do not know about survives untouched. Parents are created when absent,
because ``add`` into a missing object fails the whole patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict, TypeGuard

import orjson

import policy

__all__ = ["Operation", "annotation_value", "build_patch", "escape"]


class Operation(TypedDict):
    op: Literal["add", "replace"]
    path: str
    value: Any


def escape(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901: ``~`` → ``~0``, ``/`` → ``~1``)."""
    return token.replace("~", "~0").replace("/", "~1")


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    return type(value) is dict or isinstance(value, Mapping)


def annotation_value(originals: Mapping[str, str]) -> str:
    """The original-images annotation: compact JSON, keys sorted so it is stable."""
    return orjson.dumps(originals, option=orjson.OPT_SORT_KEYS).decode()


_ANNOTATION_POINTER = f"/metadata/annotations/{escape(policy.ORIGINAL_IMAGES_ANNOTATION)}"


def build_patch(pod: Mapping[str, Any], plan: policy.RewritePlan) -> list[Operation]:
    """The operations that apply ``plan`` to ``pod`` (empty when nothing changes)."""
    ops: list[Operation] = [
        {"op": "replace", "path": r.site.pointer, "value": r.new_image} for r in plan.rewrites]

    if plan.original_images is not None:
        metadata = pod.get("metadata")
        key = policy.ORIGINAL_IMAGES_ANNOTATION
        value = annotation_value(plan.original_images)
        if not _is_mapping(metadata):
            ops.append({"op": "add", "path": "/metadata",
                        "value": {"annotations": {key: value}}})
        elif not _is_mapping(metadata.get("annotations")):
            ops.append({"op": "add", "path": "/metadata/annotations",
                        "value": {key: value}})
        else:
            # `add` on an existing member replaces it (RFC 6902 4.1).
            ops.append({"op": "add", "path": _ANNOTATION_POINTER, "value": value})

    if plan.pull_secrets:
        existing = pod["spec"].get("imagePullSecrets")  # a plan with secrets had a spec
        if not isinstance(existing, list):
            ops.append({"op": "add", "path": "/spec/imagePullSecrets",
                        "value": [{"name": name} for name in plan.pull_secrets]})
        else:
            ops.extend({"op": "add", "path": "/spec/imagePullSecrets/-", "value": {"name": name}}
                       for name in plan.pull_secrets)
    return ops
