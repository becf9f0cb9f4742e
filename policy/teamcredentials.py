"""A rule's ``credential``: one name, or a list of them, one per team.

Two teams that share one source (a Harbor proxy project) but have robots of
their own write one rule with both robots; a Pod uses the one granted to its
namespace. The rule: at most one of a rule's credentials is granted to any
namespace. Grants by name and glob are checked here when the policy loads,
and a policy where two overlap is refused, naming both and a namespace they
share. Grants by ``namespaceSelector`` depend on labels that change after
loading: ``policy check`` warns of them, and admission leaves an image as
written where a namespace turns out granted two (``credential-ambiguous``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from mirrorgate.dnsnames import DNS_LABEL_RE
from mirrorgate.policy.collector import Collector, json_quote
from mirrorgate.policy.globoverlap import shared_namespace
from mirrorgate.policy.model import CredentialGrant, FieldError
from mirrorgate.policy.rules import Mirror, MirrorRule

__all__ = [
    "CREDENTIAL_NAME_RE",
    "check_shared_grants",
    "parse_credential_name",
    "parse_rule_credentials",
    "selector_warnings",
]

# A credential becomes the Secret `mirrorgate-<name>` and the label value
# `mirrorgate.io/credential: <name>`: a DNS label fits both.
CREDENTIAL_NAME_RE = DNS_LABEL_RE


def parse_credential_name(value: object, path: str, errors: Collector) -> str | None:
    if isinstance(value, str) and CREDENTIAL_NAME_RE.fullmatch(value):
        return value
    errors.add(
        path,
        f"{json_quote(value)} is not a valid credential name "
        "(lower-case letters, digits and '-', at most 63 characters)",
    )
    return None


def parse_rule_credentials(
    value: object,
    where: str,
    mirror: Mirror | None,
    grants: Mapping[str, CredentialGrant],
    errors: Collector,
) -> tuple[str, ...]:
    """``mirrors[].credential`` as a tuple of names (empty: none), each granted somewhere and
    each covering ``mirror``."""
    if value is None:
        return ()
    if isinstance(value, list):
        if not value:
            errors.add(
                where, "is an empty list: name at least one credential, or leave the field out"
            )
        items = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
    else:
        items = [(where, value)]
    names: list[str] = []
    for path, item in items:
        name = parse_credential_name(item, path, errors)
        if name is None:
            continue
        if name in names:
            errors.add(path, f"{json_quote(name)} is listed twice")
            continue
        names.append(name)
        grant = grants.get(name)
        if grant is None:
            errors.add(
                path,
                f"{json_quote(name)} is not granted to any namespace: add "
                f"credentials.{name}.namespaces",
            )
        elif mirror is not None and not grant.covers(mirror):
            errors.add(
                path,
                f"credential {json_quote(name)} is for {json_quote(str(grant.registry))}, which "
                f"does not cover the mirror {json_quote(str(mirror))}: the kubelet would not "
                "send it",
            )
    return tuple(names)


def _pairs(rule: MirrorRule) -> Sequence[tuple[str, str]]:
    names = rule.credentials
    return [(a, b) for n, a in enumerate(names) for b in names[n + 1 :]]


def check_shared_grants(
    rules: Sequence[MirrorRule], grants: Mapping[str, CredentialGrant], errors: Collector
) -> None:
    """Refuse a rule two of whose credentials are granted, by name or glob, to one namespace.

    Judged once per pair of credentials, however many rules name the pair; names
    against names is a set intersection, and only globs against globs walk automata.
    """
    judged: dict[tuple[str, str], tuple[str, str, str] | None] = {}
    for rule in rules:
        for a, b in _pairs(rule):
            if a not in grants or b not in grants:
                continue
            if (a, b) not in judged:
                judged[(a, b)] = _shared(grants[a], grants[b])
            found = judged[(a, b)]
            if found is not None:
                namespace, glob_a, glob_b = found
                errors.add(
                    rule.field("credential"),
                    f"{json_quote(a)} and {json_quote(b)} are both granted to namespace "
                    f"{json_quote(namespace)} (credentials.{a}.namespaces {json_quote(glob_a)}, "
                    f"credentials.{b}.namespaces {json_quote(glob_b)}): a Pod there could use "
                    "either; grant each namespace one of a rule's credentials",
                )


_GLOB_CHARS = frozenset("*?[")


def _shared(a: CredentialGrant, b: CredentialGrant) -> tuple[str, str, str] | None:
    """A namespace both grants name or match, with the entry of each that reaches it."""
    names_a = [n for n in a.namespaces if _GLOB_CHARS.isdisjoint(n)]
    names_b = {n for n in b.namespaces if _GLOB_CHARS.isdisjoint(n)}
    for name in names_a:
        if name in names_b:
            return name, name, name
    globs_a = [g for g in a.namespaces if not _GLOB_CHARS.isdisjoint(g)]
    globs_b = [g for g in b.namespaces if not _GLOB_CHARS.isdisjoint(g)]
    for names, globs, flipped in ((names_a, globs_b, False), (sorted(names_b), globs_a, True)):
        for name in names:
            for glob in globs:
                if fnmatch.fnmatchcase(name, glob):
                    return (name, glob, name) if flipped else (name, name, glob)
    for glob_a in globs_a:
        for glob_b in globs_b:
            namespace = shared_namespace(glob_a, glob_b)
            if namespace is not None:
                return namespace, glob_a, glob_b
    return None


def selector_warnings(
    rules: Sequence[MirrorRule], grants: Mapping[str, CredentialGrant]
) -> list[FieldError]:
    """A warning per rule whose credentials may meet in one namespace by its labels: that
    cannot be checked ahead, and such a namespace's images stay as written."""
    found: list[FieldError] = []
    for rule in rules:
        for a, b in _pairs(rule):
            by_label = [n for n in (a, b) if n in grants and grants[n].selector is not None]
            if by_label:
                found.append(
                    FieldError(
                        rule.field("credential"),
                        f"{json_quote(a)} and {json_quote(b)}: credentials."
                        f"{by_label[0]}.namespaceSelector grants by label, so whether one "
                        "namespace is granted both cannot be checked ahead; in a namespace "
                        "granted both, images stay as written (credential-ambiguous)",
                    )
                )
                break
    return found
