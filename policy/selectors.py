"""Label selectors, as Kubernetes writes them: ``matchLabels`` and ``matchExpressions``.

``credentials.<name>.namespaceSelector`` grants a credential by a namespace
label, so that a grant survives tenants who may create namespaces (Capsule,
HNC, Rancher projects): a name glob such as ``team-*`` would hand the login
to any namespace they make, a label only to the namespaces an admin labels
(docs/credentials.md shows the ValidatingAdmissionPolicy that keeps the
label admin-only).

The semantics are apimachinery's ``LabelSelectorAsSelector``: every
requirement must hold; ``In`` needs the key with one of the values, ``NotIn``
holds when the key is absent or has none of them, ``Exists`` and
``DoesNotExist`` look at the key only. One difference, on purpose: an empty
selector, which Kubernetes reads as "everything", is refused here, because a
grant to every namespace should be written as such (``namespaces: ["*"]``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Literal, cast

from mirrorgate.policy.collector import Collector, json_quote

__all__ = ["OPERATORS", "LabelSelector", "Operator", "Requirement", "parse_selector"]

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: tuple[Operator, ...] = ("In", "NotIn", "Exists", "DoesNotExist")
_SELECTOR_KEYS = ("matchLabels", "matchExpressions")
_EXPRESSION_KEYS = ("key", "operator", "values")
# apimachinery's validation: a qualified name, optionally under a DNS-subdomain prefix.
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY_RE = re.compile(rf"(?:{_PREFIX}/)?{_NAME}", re.ASCII)
_VALUE_RE = re.compile(rf"(?:{_NAME})?", re.ASCII)
_PREFIX_LENGTH_MAX = 253


@dataclasses.dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def holds(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        if self.operator == "In":
            return value is not None and value in self.values
        return value is None or value not in self.values


@dataclasses.dataclass(frozen=True, slots=True)
class LabelSelector:
    """Requirements that must all hold (never none: see the module)."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.holds(labels) for r in self.requirements)

    def __str__(self) -> str:
        """The selector as ``kubectl get -l`` writes it."""
        parts = []
        for r in self.requirements:
            values = ",".join(sorted(r.values))
            parts.append(
                {
                    "In": f"{r.key} in ({values})",
                    "NotIn": f"{r.key} notin ({values})",
                    "Exists": r.key,
                    "DoesNotExist": f"!{r.key}",
                }[r.operator]
            )
        return ",".join(parts)


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        return (
            f"{json_quote(key)} is not a label key (an optional DNS-subdomain prefix and '/', "
            "then at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric)"
        )
    prefix, slash, _ = key.rpartition("/")
    if slash and len(prefix) > _PREFIX_LENGTH_MAX:
        return f"{json_quote(key)}: the prefix is longer than {_PREFIX_LENGTH_MAX} characters"
    return None


def _value_ok(value: object) -> bool:
    return isinstance(value, str) and _VALUE_RE.fullmatch(value) is not None


def parse_selector(value: object, path: str, errors: Collector) -> LabelSelector | None:
    """A ``namespaceSelector`` block, every problem added to ``errors`` under ``path``."""
    block = errors.mapping(value, path, _SELECTOR_KEYS)
    if not isinstance(value, Mapping):
        return None
    requirements: list[Requirement] = []
    problems_before = len(errors.errors) + errors.omitted
    labels = errors.mapping(block.get("matchLabels"), f"{path}.matchLabels", None)
    for key, wanted in labels.items():
        where = f"{path}.matchLabels.{key}"
        problem = _key_problem(key)
        if problem is not None:
            errors.add(where, problem)
        elif not _value_ok(wanted):
            errors.add(where, f"{json_quote(wanted)} is not a label value")
        else:
            requirements.append(Requirement(key, "In", frozenset({cast("str", wanted)})))
    for i, expression in enumerate(
        errors.sequence(block.get("matchExpressions"), f"{path}.matchExpressions")
    ):
        where = f"{path}.matchExpressions[{i}]"
        found = _parse_expression(expression, where, errors)
        if found is not None:
            requirements.append(found)
    if not requirements and len(errors.errors) + errors.omitted == problems_before:
        errors.add(
            path,
            "selects every namespace (no requirement): write the labels it needs, or "
            'namespaces: ["*"] if every opted-in namespace is meant',
        )
        return None
    return LabelSelector(tuple(requirements)) if requirements else None


def _parse_expression(value: object, where: str, errors: Collector) -> Requirement | None:
    if not isinstance(value, Mapping):
        errors.add(where, "must be a mapping with key, operator and values")
        return None
    expression = errors.mapping(value, where, _EXPRESSION_KEYS)
    key, operator = expression.get("key"), expression.get("operator")
    problem = _key_problem(key)
    if problem is not None:
        errors.add(f"{where}.key", problem)
    if operator not in OPERATORS:
        errors.add(
            f"{where}.operator", f"{json_quote(operator)} is not one of: {', '.join(OPERATORS)}"
        )
        return None
    values = errors.string_list(expression.get("values"), f"{where}.values")
    bad = [v for v in values if not _value_ok(v)]
    for v in bad:
        errors.add(f"{where}.values", f"{json_quote(v)} is not a label value")
    if operator in ("In", "NotIn") and not values:
        errors.add(f"{where}.values", f"must not be empty for {operator}")
        return None
    if operator in ("Exists", "DoesNotExist") and expression.get("values"):
        errors.add(f"{where}.values", f"must be empty for {operator}")
        return None
    if problem is not None or bad:
        return None
    return Requirement(cast("str", key), operator, frozenset(values))
