"""A rewrite plan as RFC 6902 JSON Patch operations on exactly the fields that change.

Never a diff of whole objects and never a re-serialised typed Pod: the API
server applies these few operations to the object it holds, so every field we
do not know about survives untouched. Parents are created when absent,
because ``add`` into a missing object fails the whole patch.

Pure: what is kept of a patch between requests, the admission cache keeps
(:mod:`webhook.admissioncache`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, TypeGuard

import orjson

from mirrorgate import policy

__all__ = ["Operation", "annotation_value", "build_patch", "encoded_patch", "escape"]


class Operation(TypedDict):
    op: Literal["add", "replace", "remove"]
    path: str
    value: NotRequired[Any]


def escape(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901: ``~`` → ``~0``, ``/`` → ``~1``)."""
    return token.replace("~", "~0").replace("/", "~1")


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    return type(value) is dict or isinstance(value, Mapping)


def annotation_value(originals: Mapping[str, str]) -> str:
    """The original-images annotation: compact JSON, keys sorted so it is stable."""
    return orjson.dumps(originals, option=orjson.OPT_SORT_KEYS).decode()


_ANNOTATION_POINTER = f"/metadata/annotations/{escape(policy.ORIGINAL_IMAGES_ANNOTATION)}"

# Where a patch attaches to a Pod, the only things it reads of the Pod
# beyond the plan: does the annotations object exist (else its parent, or
# metadata itself, is added whole), and does spec.imagePullSecrets (else the
# list is added whole).
Anchors = tuple[Literal["metadata", "annotations", "annotation"], bool]


def _anchors(pod: Mapping[str, Any], plan: policy.RewritePlan) -> Anchors:
    secrets_listed = bool(plan.pull_secrets) and isinstance(
        pod["spec"].get("imagePullSecrets"), list
    )  # a plan with secrets had a spec
    if plan.original_images is None:
        return "annotation", secrets_listed
    metadata = pod.get("metadata")
    if not _is_mapping(metadata):
        return "metadata", secrets_listed
    if not _is_mapping(metadata.get("annotations")):
        return "annotations", secrets_listed
    return "annotation", secrets_listed


def build_patch(pod: Mapping[str, Any], plan: policy.RewritePlan) -> list[Operation]:
    """The operations that apply ``plan`` to ``pod`` (empty when nothing changes)."""
    return _operations(plan, _anchors(pod, plan))


def _operations(plan: policy.RewritePlan, anchors: Anchors) -> list[Operation]:
    annotation, secrets_listed = anchors
    ops: list[Operation] = [
        {"op": "replace", "path": r.site.pointer, "value": r.new_image} for r in plan.rewrites
    ]

    if plan.original_images is not None and not plan.original_images:
        # A record rebuilt empty: nothing was rewritten, so the Pod carries none.
        if annotation == "annotation":
            ops.append({"op": "remove", "path": _ANNOTATION_POINTER})
    elif plan.original_images is not None:
        key = policy.ORIGINAL_IMAGES_ANNOTATION
        value = annotation_value(plan.original_images)
        if annotation == "metadata":
            ops.append({"op": "add", "path": "/metadata", "value": {"annotations": {key: value}}})
        elif annotation == "annotations":
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {key: value}})
        else:
            # `add` on an existing member replaces it (RFC 6902 4.1).
            ops.append({"op": "add", "path": _ANNOTATION_POINTER, "value": value})

    if plan.pull_secrets:
        if not secrets_listed:
            ops.append(
                {
                    "op": "add",
                    "path": "/spec/imagePullSecrets",
                    "value": [{"name": name} for name in plan.pull_secrets],
                }
            )
        else:
            ops.extend(
                {"op": "add", "path": "/spec/imagePullSecrets/-", "value": {"name": name}}
                for name in plan.pull_secrets
            )
    return ops


def encoded_patch(pod: Mapping[str, Any], plan: policy.RewritePlan) -> str | None:
    """:func:`build_patch` as an AdmissionResponse carries it (base64 of its JSON); or None."""
    operations = build_patch(pod, plan)
    return base64.b64encode(orjson.dumps(operations)).decode("ascii") if operations else None
