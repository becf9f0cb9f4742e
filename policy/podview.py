"""The parts of a Pod that planning and its patch read, and nothing else.

A review decoded in one process and planned in another crosses between them
as this view: a large Pod's bulk (environment, volumes, annotations of its
own) stays behind. The rule: :func:`policy.plan`, :func:`policy.shape_key`
and the JSON Patch made from the plan are the same for the view as for the
Pod (tests/policy/test_podview.py checks it).
"""

from __future__ import annotations

from typing import TypeVar, cast

from mirrorgate.policy.decision import MIRROR_POD_ANNOTATION, SKIP_LABEL
from mirrorgate.policy.plans import ORIGINAL_IMAGES_ANNOTATION
from mirrorgate.policy.sites import container_lists

__all__ = ["planning_view"]

_METADATA_KEYS = ("name", "generateName", "namespace")
_LABEL_KEYS = (SKIP_LABEL,)
_ANNOTATION_KEYS = (MIRROR_POD_ANNOTATION, ORIGINAL_IMAGES_ANNOTATION)
_CONTAINER_KEYS = ("name", "image", "imagePullPolicy")
_VOLUME_KEYS = ("name", "image")
_VOLUME_IMAGE_KEYS = ("reference", "pullPolicy")
_ABSENT = object()
_Pod = TypeVar("_Pod")


def _only(value: object, keys: tuple[str, ...]) -> object:
    """``value``'s ``keys`` if it is an object; anything else as it is (planning judges it)."""
    if type(value) is not dict:
        return value
    return {key: value[key] for key in keys if key in value}


def _containers(value: object) -> object:
    if type(value) is not list:
        return value
    return [_only(container, _CONTAINER_KEYS) for container in value]


def _volumes(value: object) -> object:
    """Each volume's name and image reference: the rest (a ConfigMap's items) stays behind,
    the volume itself stays (its index is an image volume's pointer)."""
    if type(value) is not list:
        return value
    kept: list[object] = []
    for volume in value:
        reduced = _only(volume, _VOLUME_KEYS)
        if type(reduced) is dict and "image" in reduced:
            reduced["image"] = _only(reduced["image"], _VOLUME_IMAGE_KEYS)
        kept.append(reduced)
    return kept


def planning_view(pod: _Pod) -> _Pod:
    """``pod`` reduced to what planning and its patch read (see the module's docstring).

    An object becomes a smaller object; anything else is returned as it is.
    """
    if type(pod) is not dict:
        return pod
    whole = cast("dict[str, object]", pod)
    view: dict[str, object] = {}
    metadata = whole.get("metadata", _ABSENT)
    if type(metadata) is dict:
        kept = _only(metadata, _METADATA_KEYS)
        assert type(kept) is dict
        for key, keys in (("labels", _LABEL_KEYS), ("annotations", _ANNOTATION_KEYS)):
            if key in metadata:
                kept[key] = _only(metadata[key], keys)
        view["metadata"] = kept
    elif metadata is not _ABSENT:
        view["metadata"] = metadata
    spec = whole.get("spec", _ABSENT)
    if type(spec) is dict:
        kept_spec: dict[str, object] = {
            field: _containers(containers)
            for field, containers in container_lists(spec)
            if field in spec
        }
        if "volumes" in spec:
            kept_spec["volumes"] = _volumes(spec["volumes"])
        if "imagePullSecrets" in spec:
            kept_spec["imagePullSecrets"] = spec["imagePullSecrets"]
        view["spec"] = kept_spec
    elif spec is not _ABSENT:
        view["spec"] = spec
    return cast("_Pod", view)
