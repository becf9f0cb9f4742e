"""Merging the ClusterMirrorPolicies: the cluster's policy, and a verdict on each object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mirrorgate.policy import loader
from mirrorgate.policy.collector import json_quote as _quote
from mirrorgate.policy.model import CredentialGrant, FieldError, Policy, PolicyError
from mirrorgate.policy.objects import ObjectKey, PolicyObject
from mirrorgate.policy.rules import MirrorRule, Source
from mirrorgate.policy.verdicts import (
    Verdict,
    credentials_of,
    cross_checks,
    in_object,
    in_spec,
    refused,
)

__all__ = ["compose_cluster"]

# Settings of the whole cluster that one ClusterMirrorPolicy at most may set.
_SINGLE_SETTINGS = ("onCredentialError", "health")
_EMPTY = loader.load({})


def _credential_names(obj: PolicyObject) -> tuple[str, ...]:
    credentials = obj.spec.get("credentials")
    return tuple(map(str, credentials)) if isinstance(credentials, Mapping) else ()


class _Cluster:
    """The ClusterMirrorPolicies accepted so far, merged."""

    def __init__(self) -> None:
        self.rules: list[MirrorRule] = []
        self.sources: dict[Source, MirrorRule] = {}
        self.grants: dict[str, tuple[CredentialGrant, ObjectKey]] = {}
        self.settings: dict[str, ObjectKey] = {}
        self.policies: dict[ObjectKey, Policy] = {}

    def conflicts(self, obj: PolicyObject, own: Policy) -> list[FieldError]:
        errors: list[FieldError] = []
        for setting in _SINGLE_SETTINGS:
            if setting in obj.spec and setting in self.settings:
                errors.append(
                    FieldError(
                        f"spec.{setting}",
                        f"is already set by {self.settings[setting]}: one ClusterMirrorPolicy "
                        "sets it for the cluster",
                    )
                )
        registries = {g.registry: (n, k) for n, (g, k) in self.grants.items() if g.registry}
        for name in _credential_names(obj):
            grant = own.grants.get(name)
            if name in self.grants:
                errors.append(
                    FieldError(
                        f"spec.credentials.{name}", f"is already defined by {self.grants[name][1]}"
                    )
                )
            elif grant is not None and grant.registry in registries:
                other, where = registries[grant.registry]
                errors.append(
                    FieldError(
                        f"spec.credentials.{name}.registry",
                        f"{_quote(str(grant.registry))} is already the registry of "
                        f"credentials.{other} in {where}; give each credential its own "
                        "host or path",
                    )
                )
        for rule in own.rules:
            other_rule = self.sources.get(rule.source)
            if other_rule is not None:
                errors.append(
                    FieldError(
                        f"spec.mirrors[{rule.index}].source",
                        f"{_quote(str(rule.source))} is already the source of {other_rule.label}",
                    )
                )
        if not errors:
            errors.extend(cross_checks([*self.rules, *own.rules]))
        return errors

    def accept(self, obj: PolicyObject, own: Policy) -> None:
        self.policies[obj.key] = own
        self.rules.extend(own.rules)
        self.sources.update((r.source, r) for r in own.rules)
        for name in _credential_names(obj):
            self.grants[name] = (own.grants[name], obj.key)
        for setting in _SINGLE_SETTINGS:
            if setting in obj.spec:
                self.settings[setting] = obj.key


def _names_elsewhere(obj: PolicyObject) -> bool:
    """Whether a rule of ``obj`` names a credential that ``obj`` does not define."""
    own = set(_credential_names(obj))
    mirrors = obj.spec.get("mirrors")
    for rule in mirrors if isinstance(mirrors, list) else ():
        named = rule.get("credential") if isinstance(rule, Mapping) else None
        names = [named] if isinstance(named, str) else named if isinstance(named, list) else []
        if any(isinstance(n, str) and n not in own for n in names):
            return True
    return False


def compose_cluster(objects: Sequence[PolicyObject], verdicts: dict[ObjectKey, Verdict]) -> Policy:
    """The accepted ClusterMirrorPolicies' merged policy; a verdict for each into ``verdicts``."""
    # The credentials every object defines, so that a rule may name another object's
    # (read only when one does: loading a thousand grants is not free).
    defined: dict[str, CredentialGrant] = {}
    for obj in objects if any(map(_names_elsewhere, objects)) else ():
        try:
            grants = loader.load({"credentials": obj.spec.get("credentials")}).grants
        except PolicyError:
            continue  # its own load below says what is wrong
        for name, grant in grants.items():
            defined.setdefault(name, grant)
    merged = _Cluster()
    for obj in objects:
        own_names = set(_credential_names(obj))
        try:
            loaded = loader.load(
                obj.spec, known={n: g for n, g in defined.items() if n not in own_names}
            )
        except PolicyError as error:
            verdicts[obj.key] = refused("Invalid", in_spec(error.errors), obj)
            continue
        own = loaded.with_rules(in_object(loaded.rules, obj))
        errors = merged.conflicts(obj, own)
        if errors:
            verdicts[obj.key] = refused("Conflict", errors, obj)
            continue
        merged.accept(obj, own)
        verdicts[obj.key] = Verdict(
            True, "Accepted", "", obj.generation, tuple(in_spec(loaded.warnings))
        )
    # A rule naming the credential of an object that was refused cannot apply:
    # refuse its object too, until no accepted rule names a missing credential.
    changed = True
    while changed:
        changed = False
        for key, own in list(merged.policies.items()):
            missing = [
                (rule, name)
                for rule in own.rules
                for name in credentials_of(rule)
                if name not in merged.grants
            ]
            if missing:
                rule, name = missing[0]
                obj = next(o for o in objects if o.key == key)
                verdicts[key] = refused(
                    "Invalid",
                    [
                        FieldError(
                            f"spec.mirrors[{rule.index}].credential",
                            f"{_quote(name)} is defined by a ClusterMirrorPolicy that is not "
                            "accepted",
                        )
                    ],
                    obj,
                )
                rebuilt = _Cluster()
                for o in objects:
                    if o.key in merged.policies and o.key != key:
                        rebuilt.accept(o, merged.policies[o.key])
                merged, changed = rebuilt, True
                break
    return _merged_policy(merged)


def _merged_policy(merged: _Cluster) -> Policy:
    policies = list(merged.policies.values())
    setter = {s: merged.policies[k] for s, k in merged.settings.items()}
    warnings = [
        FieldError(f"{key}: spec.{w.path}", w.message)
        for key, own in merged.policies.items()
        for w in own.warnings
    ]
    return Policy(
        rules=tuple(merged.rules),
        exclude_images=tuple(dict.fromkeys(g for p in policies for g in p.exclude_images)),
        exclude_namespaces=tuple(dict.fromkeys(g for p in policies for g in p.exclude_namespaces)),
        grants={name: grant for name, (grant, _) in merged.grants.items()},
        on_credential_error=setter.get("onCredentialError", _EMPTY).on_credential_error,
        health=setter.get("health", _EMPTY).health,
        warnings=tuple(warnings),
    )
