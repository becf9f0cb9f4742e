"""An object's verdict, and the checks that ClusterMirrorPolicies and MirrorPolicies share."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Literal

from mirrorgate.policy import matching, rulechecks
from mirrorgate.policy.collector import Collector
from mirrorgate.policy.collector import json_quote as _quote
from mirrorgate.policy.model import FieldError
from mirrorgate.policy.objects import PolicyObject
from mirrorgate.policy.rules import MirrorRule

__all__ = [
    "Reason",
    "Verdict",
    "credentials_of",
    "cross_checks",
    "in_object",
    "in_spec",
    "refused",
]

Reason = Literal["Accepted", "Invalid", "Conflict", "NotGranted", "FixedRule"]


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """Whether an object is in force, and if not why: its ``Accepted`` condition."""

    accepted: bool
    reason: Reason
    message: str
    """Every problem, one per line, each with its field path (``spec.mirrors[0].source``)."""
    observed_generation: int = 0
    warnings: tuple[FieldError, ...] = ()
    """What is valid but unsafe, as ``policy check`` warns of it."""


def refused(reason: Reason, errors: Iterable[FieldError], obj: PolicyObject) -> Verdict:
    return Verdict(False, reason, "\n".join(map(str, errors)), obj.generation)


def in_spec(errors: Iterable[FieldError]) -> list[FieldError]:
    return [FieldError(f"spec.{e.path}" if e.path else "spec", e.message) for e in errors]


def credentials_of(rule: MirrorRule) -> tuple[str, ...]:
    return rule.credentials


def cross_checks(rules: Sequence[MirrorRule]) -> list[FieldError]:
    """The checks across rules that the loader makes within one document, over ``rules``
    from several: one mirror path per source, no nesting, one transport per host."""
    errors = Collector()
    seen: dict[tuple[str, str], MirrorRule] = {}
    for rule in rules:
        key = matching.mirror_key(rule.mirror, https=rule.scheme == "https")
        other = seen.setdefault(key, rule)
        if other is not rule:
            errors.add(
                f"{rule.label}.mirror",
                f"{_quote(str(rule.mirror))} is already the mirror of {other.label}; give "
                "each source its own mirror path",
            )
    rulechecks.check_nested_mirrors(rules, errors)
    rulechecks.check_mirror_transports(rules, errors)
    return errors.errors


def in_object(policy_rules: Iterable[MirrorRule], obj: PolicyObject) -> tuple[MirrorRule, ...]:
    """``policy_rules`` as rules of ``obj``: named by it in messages, unless it is unnamed."""
    if not obj.named:
        return tuple(policy_rules)
    return tuple(dataclasses.replace(r, origin=str(obj.key)) for r in policy_rules)
