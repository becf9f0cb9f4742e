"""The CustomResourceDefinitions of ClusterMirrorPolicy and MirrorPolicy, built from
:data:`fields.FIELDS`, and the reference's field table from the same rows.

Values out: ``webhook/policyfile/crds.py`` writes them to
``manifests/base/crds/`` and docs/policy-reference.md (``make docs``), and a
test holds the checked-in files equal to what this builds.
"""

from __future__ import annotations

import copy
from typing import Any

from mirrorgate.policy.fields import FIELDS, LIMITS, Field
from mirrorgate.policy.objects import CLUSTER_KIND, GROUP, NAMESPACED_KIND, VERSION, Kind

__all__ = ["crd", "field_table", "spec_schema"]

_PLURALS = {CLUSTER_KIND: "clustermirrorpolicies", NAMESPACED_KIND: "mirrorpolicies"}
_SHORT = {CLUSTER_KIND: ["cmpol"], NAMESPACED_KIND: ["mpol"]}
_DESCRIPTIONS = {
    CLUSTER_KIND: "The platform team's mirror policy: mirrors, credentials and their grants, "
    "health and exclusions; several are merged. Its spec is a mirrorgate policy file "
    "(docs/policy-reference.md).",
    NAMESPACED_KIND: "A team's mirror rules for the Pods of its namespace, ahead of the "
    "cluster's for the same source; they name only credentials a ClusterMirrorPolicy "
    "grants to the namespace, and never override a rule it marks fixed.",
}
_TEAM_RULE_CHECKS = [
    {
        "rule": "!has(self.fixed)",
        "message": "only a ClusterMirrorPolicy's rule can be fixed; a MirrorPolicy's rules "
        "are its own namespace's",
    }
]


def _plain(text: str) -> str:
    return text.replace("`", "").replace("\\|", "|")


def _child(node: dict[str, Any], segment: str) -> dict[str, Any]:
    if segment == "<name>":
        return node["additionalProperties"]  # type: ignore[no-any-return]
    if segment.endswith("[]"):
        return node["properties"][segment[:-2]]["items"]  # type: ignore[no-any-return]
    return node["properties"][segment]  # type: ignore[no-any-return]


def _add(root: dict[str, Any], field: Field) -> None:
    if field.schema is None:
        return
    *parents, name = field.path.split(".")
    node = root
    for segment in parents:
        node = _child(node, segment)
    schema = copy.deepcopy(dict(field.schema))
    for inner in (schema, schema.get("items"), schema.get("additionalProperties")):
        if isinstance(inner, dict) and inner.get("type") == "object":
            inner.setdefault("properties", {})
    node.setdefault("properties", {})[name] = {"description": _plain(field.text), **schema}
    if field.required:
        node.setdefault("required", []).append(name)


def spec_schema(kind: Kind) -> dict[str, Any]:
    """The OpenAPI v3 schema of ``kind``'s ``spec``."""
    root: dict[str, Any] = {"type": "object", "properties": {}}
    team = kind == NAMESPACED_KIND
    for field in FIELDS:
        if not team or field.path.split(".")[0].removesuffix("[]") == "mirrors":
            _add(root, field)
    if team:
        mirrors = root["properties"]["mirrors"]
        mirrors["maxItems"] = LIMITS["team_mirrors"]
        mirrors["items"]["x-kubernetes-validations"].extend(_TEAM_RULE_CHECKS)
    return root


_CONDITION = {
    "type": "object",
    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
    "properties": {
        "type": {"type": "string", "maxLength": 316},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "maxLength": 1024},
        "message": {"type": "string", "maxLength": 32768},
    },
}


def _status() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Written by mirrorgate's leader: whether the running replicas "
        "accepted this object.",
        "properties": {
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "The metadata.generation the conditions judge.",
            },
            "conditions": {
                "type": "array",
                "description": "Accepted: True when the object is in force; False with a "
                "reason (Invalid, Conflict, NotGranted, FixedRule) and a message naming "
                "each problem.",
                "maxItems": 8,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": _CONDITION,
            },
        },
    }


def crd(kind: Kind) -> dict[str, Any]:
    """The CustomResourceDefinition of ``kind``, as the API server takes it."""
    plural = _PLURALS[kind]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "mirrorgate"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": _SHORT[kind],
                "categories": ["mirrorgate"],
            },
            "scope": "Cluster" if kind == CLUSTER_KIND else "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": "Accepted",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Accepted")].status',
                        },
                        {
                            "name": "Reason",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Accepted")].reason',
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": _DESCRIPTIONS[kind],
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(kind),
                                "status": _status(),
                            },
                        }
                    },
                }
            ],
        },
    }


def field_table() -> str:
    """The reference's table of fields (docs/policy-reference.md, ``## Fields``)."""
    lines = ["| field | type | default | what it does |", "| --- | --- | --- | --- |"]
    lines += [f"| `{f.path}` | {f.kind} | {f.default} | {f.text} |" for f in FIELDS]
    return "\n".join(lines) + "\n"
