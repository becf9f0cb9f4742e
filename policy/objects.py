"""The policy as Kubernetes objects: ``ClusterMirrorPolicy`` and ``MirrorPolicy`` documents.

A ``ClusterMirrorPolicy`` (cluster-scoped, the platform team's) has a
``spec`` that is a policy file, the same grammar :func:`loader.load` reads,
where a rule may also say ``fixed: true``. A ``MirrorPolicy`` (namespaced, a
team's) has a ``spec.mirrors`` of rules of the same form, minus ``fixed``.
This module reads the envelope (``apiVersion``, ``kind``, ``metadata``) into a
:class:`PolicyObject`; :mod:`compose` judges the specs together. Pure: values
in, values out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal, cast

from mirrorgate.dnsnames import DNS_LABEL_RE
from mirrorgate.policy.collector import Collector, type_name
from mirrorgate.policy.collector import json_quote as _quote
from mirrorgate.policy.model import PolicyError

__all__ = [
    "API_VERSION",
    "CLUSTER_KIND",
    "DEFAULT_OBJECT_NAMESPACE",
    "GROUP",
    "KINDS",
    "NAMESPACED_KIND",
    "VERSION",
    "Kind",
    "ObjectKey",
    "PolicyObject",
    "is_policy_object",
    "parse_object",
]

GROUP = "mirrorgate.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
Kind = Literal["ClusterMirrorPolicy", "MirrorPolicy"]
CLUSTER_KIND: Kind = "ClusterMirrorPolicy"
NAMESPACED_KIND: Kind = "MirrorPolicy"
KINDS: tuple[Kind, ...] = (CLUSTER_KIND, NAMESPACED_KIND)
MIRROR_POLICY_SPEC_KEYS = ("mirrors",)
"""A MirrorPolicy's ``spec``: only rules; credentials, health and exclusions are the cluster's."""
DEFAULT_OBJECT_NAMESPACE = "default"
"""Where a MirrorPolicy without ``metadata.namespace`` goes when a file is read (kubectl's)."""
# An object name is a DNS subdomain (at most 253 characters of lower-case
# labels joined by dots); a namespace is a DNS label.
_MAX_NAME = 253


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectKey:
    """Which object: ``namespace`` is None for a ClusterMirrorPolicy."""

    kind: Kind
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        if self.namespace is None:
            return f"{self.kind} {self.name}"
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyObject:
    """One ClusterMirrorPolicy or MirrorPolicy as stored; its ``spec`` not judged yet."""

    key: ObjectKey
    spec: Mapping[str, object]
    generation: int = 0
    """``metadata.generation``: what a verdict's ``observedGeneration`` repeats (0: unknown)."""
    named: bool = True
    """Whether messages name it before its rules (``ClusterMirrorPolicy base
    spec.mirrors[0]``); False for the policy file served as an object, whose rules read
    ``mirrors[0]``, as they always did."""
    created: str = ""
    """``metadata.creationTimestamp`` (RFC 3339, so it sorts as text; empty: not yet
    stored). Of two objects in conflict the older keeps its rules."""

    @property
    def kind(self) -> Kind:
        return self.key.kind

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def namespace(self) -> str | None:
        return self.key.namespace


def is_policy_object(document: object) -> bool:
    """Whether ``document`` is meant as one of the kinds (it says ``kind: ...``), not a
    policy file: a policy file has no ``kind`` or ``apiVersion``."""
    return isinstance(document, Mapping) and ("kind" in document or "apiVersion" in document)


def _name(value: object, path: str, errors: Collector, *, label: bool) -> str:
    valid = (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_NAME
        and all(DNS_LABEL_RE.fullmatch(part) for part in value.split("."))
        and (not label or "." not in value)
    )
    if not valid:
        what = "a namespace name (a DNS label)" if label else "an object name (a DNS subdomain)"
        errors.add(path, f"{_quote(value)} is not {what}")
    return value if isinstance(value, str) else ""


def parse_object(document: object, *, namespace: str | None = None) -> PolicyObject:
    """The :class:`PolicyObject` a decoded document is; raises :class:`PolicyError`.

    ``namespace`` is where a MirrorPolicy without ``metadata.namespace`` goes
    (kubectl's ``-n``); a MirrorPolicy needs one or the other. Only the
    envelope is checked here: the ``spec`` is judged by :func:`compose.compose`,
    against the other objects.
    """
    errors = Collector()
    if not isinstance(document, Mapping):
        errors.add("", f"must be a mapping with apiVersion and kind, got {type_name(document)}")
        raise PolicyError(errors.errors)
    top = cast("Mapping[str, object]", document)
    kind = top.get("kind")
    if kind not in KINDS:
        errors.add("kind", f"{_quote(kind)} is not one of: {', '.join(KINDS)}")
    if top.get("apiVersion") != API_VERSION:
        errors.add(
            "apiVersion",
            f"{_quote(top.get('apiVersion'))} is not {API_VERSION} (the version this "
            "mirrorgate reads)",
        )
    metadata = errors.mapping(top.get("metadata"), "metadata", None)
    name = _name(metadata.get("name"), "metadata.name", errors, label=False)
    where = metadata.get("namespace", namespace)
    if kind == CLUSTER_KIND and "namespace" in metadata:
        errors.add("metadata.namespace", "a ClusterMirrorPolicy is cluster-scoped: remove it")
    if kind == NAMESPACED_KIND:
        if where is None:
            errors.add("metadata.namespace", "is required: a MirrorPolicy is namespaced")
        else:
            where = _name(where, "metadata.namespace", errors, label=True)
    generation = metadata.get("generation", 0)
    if type(generation) is not int:
        generation = 0
    created = metadata.get("creationTimestamp", "")
    spec = errors.mapping(top.get("spec"), "spec", None)
    if "spec" not in top:
        errors.add("spec", "is required")
    if kind == NAMESPACED_KIND:
        errors.mapping(spec, "spec", MIRROR_POLICY_SPEC_KEYS)
    if errors.errors:
        raise PolicyError(errors.errors, errors.omitted)
    return PolicyObject(
        key=ObjectKey(
            cast("Kind", kind),
            name,
            cast("str", where) if kind == NAMESPACED_KIND else None,
        ),
        spec=spec,
        generation=generation,
        created=created if isinstance(created, str) else str(created),
    )
