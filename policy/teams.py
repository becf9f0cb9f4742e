"""Judging a namespace's MirrorPolicies against the cluster's policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from mirrorgate.policy import loader, rulechecks
from mirrorgate.policy.collector import Collector
from mirrorgate.policy.collector import json_quote as _quote
from mirrorgate.policy.model import FieldError, Policy, PolicyError
from mirrorgate.policy.objects import PolicyObject
from mirrorgate.policy.quoting import quote
from mirrorgate.policy.rules import MirrorRule, Source
from mirrorgate.policy.verdicts import Verdict, cross_checks, in_object, in_spec, refused

__all__ = ["Fixed", "effective", "judge_namespaced"]


class Fixed:
    """The cluster's ``fixed: true`` rules, found from a source in a probe per path
    component or host label (:func:`taken_from`)."""

    def __init__(self, rules: Iterable[MirrorRule]) -> None:
        self._sources: dict[tuple[str, str], MirrorRule] = {}
        self._wildcards: dict[str, MirrorRule] = {}
        for rule in rules:
            if not rule.fixed:
                continue
            if rule.source.wildcard:
                self._wildcards[rule.source.host] = rule
            else:
                self._sources[(rule.source.host, rule.source.path)] = rule

    def taken_from(self, source: Source) -> MirrorRule | None:
        """The fixed rule a rule for ``source`` would take images from, if any: one whose
        source is the same or broader, so that ``source`` is matched ahead of it."""
        if not self._sources and not self._wildcards:
            return None
        if not source.wildcard:
            path = source.path
            # The path and each of its parents in whole components, down to the host.
            for prefix in (
                [path] * bool(path) + [path[:i] for i, c in enumerate(path) if c == "/"] + [""]
            ):
                rule = self._sources.get((source.host, prefix))
                if rule is not None:
                    return rule
            if ":" in source.host:
                return None
        # The suffixes of a host (or of a wildcard's own suffix, itself included).
        host = source.host
        suffixes = [host[i + 1 :] for i, c in enumerate(host) if c == "."]
        for suffix in [host] * source.wildcard + suffixes:
            rule = self._wildcards.get(suffix)
            if rule is not None:
                return rule
        return None


def effective(own: Sequence[MirrorRule], cluster: Policy) -> tuple[MirrorRule, ...]:
    """A namespace's rules: its own, then the cluster's for every other source."""
    sources = {r.source for r in own}
    return (*own, *(r for r in cluster.rules if r.source not in sources))


def _precheck(obj: PolicyObject, cluster: Policy) -> list[FieldError]:
    """What a MirrorPolicy's rules may not say that a policy file's may."""
    errors: list[FieldError] = []
    mirrors = obj.spec.get("mirrors")
    for i, rule in enumerate(mirrors if isinstance(mirrors, list) else ()):
        if not isinstance(rule, Mapping):
            continue
        if "fixed" in rule:
            errors.append(
                FieldError(
                    f"spec.mirrors[{i}].fixed",
                    "only a ClusterMirrorPolicy's rule can be fixed; a MirrorPolicy's rules "
                    "are its own namespace's",
                )
            )
        credential = rule.get("credential")
        if isinstance(credential, str) and credential not in cluster.grants:
            errors.append(
                FieldError(
                    f"spec.mirrors[{i}].credential",
                    f"{_quote(credential)} is not a credential of the cluster policy: a "
                    "MirrorPolicy names credentials a ClusterMirrorPolicy grants to its namespace",
                )
            )
    return errors


def judge_namespaced(
    obj: PolicyObject,
    cluster: Policy,
    fixed: Fixed,
    labels: Mapping[str, str] | None,
    accepted: Sequence[MirrorRule],
    hosts: Mapping[str, MirrorRule],
) -> tuple[Verdict, tuple[MirrorRule, ...]]:
    """``obj``'s verdict and rules, beside the ``accepted`` rules of its namespace so
    far; ``hosts`` holds a rule of each mirror host in use anywhere, which are probed
    (and exported) per host, so every namespace must reach a host alike."""
    namespace = obj.namespace or ""
    errors = _precheck(obj, cluster)
    try:
        loaded = loader.load({"mirrors": obj.spec.get("mirrors")}, known=cluster.grants)
    except PolicyError as error:
        shown = {e.path for e in errors}
        errors.extend(e for e in in_spec(error.errors) if e.path not in shown)
    if errors:
        return refused("Invalid", errors, obj), ()
    rules = in_object(loaded.rules, obj)
    # Every credential a team's rule names must be granted to its namespace: a list names
    # one robot per team, and a team names only its own.
    not_granted = [
        FieldError(
            f"spec.mirrors[{rule.index}].credential",
            _not_granted(cluster, rule, name, namespace, labels),
        )
        for rule in rules
        for name in rule.credentials
        if not cluster.is_granted(name, namespace, labels)
    ]
    if not_granted:
        return refused("NotGranted", not_granted, obj), ()
    overriding = [
        FieldError(
            f"spec.mirrors[{rule.index}].source",
            f"{_quote(str(rule.source))} would take images from {taken.label} "
            f"({_quote(str(taken.source))}), which the cluster policy marks fixed: "
            "a MirrorPolicy may not override it",
        )
        for rule in rules
        if (taken := fixed.taken_from(rule.source)) is not None
    ]
    if overriding:
        return refused("FixedRule", overriding, obj), ()
    mine = {r.source: r for r in accepted}
    errors = [
        FieldError(
            f"spec.mirrors[{rule.index}].source",
            f"{_quote(str(rule.source))} is already the source of {mine[rule.source].label}",
        )
        for rule in rules
        if rule.source in mine
    ] or cross_checks(
        # The cluster's first, so that each problem is reported on this object's rule.
        [*effective([*accepted, *rules], cluster)[len(accepted) + len(rules) :], *accepted, *rules]
    )
    if not errors:
        transports = Collector()
        rulechecks.check_mirror_transports([*hosts.values(), *rules], transports)
        errors = transports.errors
    if errors:
        return refused("Conflict", errors, obj), ()
    warnings = in_spec(rulechecks.warnings(rules, {}))
    if cluster.is_namespace_excluded(namespace):
        warnings.append(
            FieldError(
                "metadata.namespace",
                f"namespace {_quote(namespace)} is excluded by the cluster policy: these "
                "rules change nothing there",
            )
        )
    return Verdict(True, "Accepted", "", obj.generation, tuple(warnings)), rules


def _not_granted(
    cluster: Policy,
    rule: MirrorRule,
    credential: str,
    namespace: str,
    labels: Mapping[str, str] | None,
) -> str:
    """Why ``rule`` may not name ``credential`` in ``namespace`` (labels None: not known)."""
    reason = (
        f"credential {credential!r} of {rule.label} is not granted to namespace {quote(namespace)}"
    )
    grant = cluster.grants.get(credential)
    if grant is not None and grant.selector is not None and labels is None:
        reason += (
            f" (its labels, which credentials.{credential}.namespaceSelector reads, "
            "are not known yet)"
        )
    return reason
