"""Checks across the rules of a loaded policy: what each rule cannot see alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mirrorgate.policy import matching
from mirrorgate.policy.collector import Collector, json_quote
from mirrorgate.policy.model import CredentialGrant, FieldError
from mirrorgate.policy.rules import MirrorRule, Scheme

__all__ = ["check_mirror_transports", "check_nested_mirrors", "transport_problems", "warnings"]


def check_mirror_transports(rules: Sequence[MirrorRule], errors: Collector) -> None:
    """Mirrors are probed (and exported) per host, so the rules on one host must reach
    it alike: the same scheme, the same CA, the same verification."""
    first: dict[str, MirrorRule] = {}
    for rule in rules:
        other = first.setdefault(rule.mirror.host, rule)
        for key, mine, theirs in (
            ("mirror", rule.scheme + "://", other.scheme + "://"),
            ("caFile", rule.ca_file, other.ca_file),
            ("insecureSkipVerify", rule.skip_verify, other.skip_verify),
        ):
            if mine != theirs:
                errors.add(
                    rule.field(key),
                    f"{json_quote(mine)} differs from {other.field(key)} "
                    f"({json_quote(theirs)}) on the same mirror host "
                    f"{json_quote(rule.mirror.host)}",
                )


def transport_problems(
    rule: Mapping[str, object], where: str, scheme: Scheme, errors: Collector
) -> tuple[str | None, bool]:
    """A rule's ``caFile`` and ``insecureSkipVerify``, checked against its scheme."""
    ca_file = rule.get("caFile")
    if ca_file is not None and (not isinstance(ca_file, str) or not ca_file):
        errors.add(
            f"{where}.caFile", f"must be the path of a PEM CA bundle, got {json_quote(ca_file)}"
        )
        ca_file = None
    skip = rule.get("insecureSkipVerify", False)
    if not isinstance(skip, bool):
        errors.add(f"{where}.insecureSkipVerify", f"must be true or false, got {json_quote(skip)}")
        skip = False
    if scheme == "http":
        for key, given in (("caFile", ca_file is not None), ("insecureSkipVerify", skip)):
            if given:
                errors.add(f"{where}.{key}", "has no use on a plain-HTTP (http://) mirror")
    elif skip and ca_file is not None:
        errors.add(
            f"{where}.insecureSkipVerify",
            "and caFile contradict each other: verify with the CA, or do not verify",
        )
    return ca_file, skip


def warnings(
    rules: Sequence[MirrorRule], grants: Mapping[str, CredentialGrant]
) -> tuple[FieldError, ...]:
    """What a valid policy allows that is unsafe or rarely meant: ``policy check`` and the
    policy's admission warn of it, once per rule or grant.

    A ``"*"`` grant hands the credential to anyone who can create a Pod in any
    opted-in namespace (docs/security.md).
    """
    found: list[FieldError] = []
    for rule in rules:
        if rule.skip_verify:
            found.append(
                FieldError(
                    rule.field("insecureSkipVerify"),
                    f"TLS certificates of {json_quote(rule.mirror.host)} are not verified: anyone "
                    "on the network path can serve images (and read credentials) in its name",
                )
            )
        if rule.scheme == "http" and rule.credentials:
            found.append(
                FieldError(
                    rule.field("mirror"),
                    f"{json_quote(rule.mirror_url)} is plain HTTP but needs credential "
                    f"{', '.join(map(json_quote, rule.credentials))}: the login would cross "
                    "the network in clear",
                )
            )
    for name, grant in grants.items():
        if "*" in grant.namespaces:
            found.append(
                FieldError(
                    f"credentials.{name}.namespaces",
                    '"*" grants this credential to every opted-in namespace: anyone who can '
                    "create a Pod in one can pull with it; name the namespaces that need it, "
                    "or select them by an admin-only label (namespaceSelector)",
                )
            )
            continue
        globs = [g for g in grant.namespaces if not _GLOB_CHARS.isdisjoint(g)]
        if globs:
            found.append(
                FieldError(
                    f"credentials.{name}.namespaces",
                    f"{json_quote(globs[0])} is a glob: whoever may create a namespace whose "
                    "name it matches (Capsule, HNC, Rancher projects) gets this credential; "
                    "name the namespaces, or select them by an admin-only label "
                    "(namespaceSelector, docs/credentials.md)",
                )
            )
    return tuple(found)


_GLOB_CHARS = frozenset("*?[")


def check_nested_mirrors(rules: Sequence[MirrorRule], errors: Collector) -> None:
    """A mirror under another mirror's prefix makes images of two rules collide.

    ``m.example/hub`` and ``m.example/hub/library`` would both hold
    ``m.example/hub/library/nginx``, and on re-admission the image would be
    credited to the wrong rule and its credential. One dictionary probe per
    path component, so this stays linear in the number of rules.
    """
    by_prefix = {matching.mirror_key(r.mirror, https=r.scheme == "https"): r for r in rules}
    for rule in rules:
        host, path = matching.mirror_key(rule.mirror, https=rule.scheme == "https")
        parents = [path[:i] for i in range(len(path)) if path[i] == "/"]
        for parent in ([""] if path else []) + parents:
            outer = by_prefix.get((host, parent))
            if outer is not None:
                errors.add(
                    rule.field("mirror"),
                    f"{json_quote(str(rule.mirror))} lies under {json_quote(str(outer.mirror))}, "
                    f"the mirror of {outer.label}; mirror paths must not nest",
                )
                break
