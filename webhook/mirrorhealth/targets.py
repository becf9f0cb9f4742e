"""What the health probes probe: the mirror hosts and logins of every policy in force.

The cluster's rules are probed whole: the platform team writes them. In a cluster,
each namespace's MirrorPolicies may add rules on mirror hosts of their own; those are
probed too, or ``health`` (failover, and falling back to the original while a mirror
is down) could not work for them. Tenants write MirrorPolicies, and every host costs a
probe each round (and a login per robot on it), so the hosts that MirrorPolicies add
are capped at :data:`MAX_TEAM_HOSTS`, taken fairly: each namespace's first new host,
then each one's second, and so on, namespaces in name order. Past the cap a host is
not probed: its rules rewrite as if it were up; the monitor warns, /readyz lists it
and ``mirrorgate_mirror_hosts_unprobed`` counts them.

A team's rule may only name credentials the cluster grants its namespace. One missing
from the store fails wherever it is named; one for another registry host than the team
rule's mirror is not held against the credential (that would let one team's rule make
every namespace's fall back): the team's rule is then not logged in with it, only its
mirror probed.
"""

from __future__ import annotations

import dataclasses
import itertools
import ssl
from collections.abc import Mapping, Sequence

from mirrorgate import policy
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.mirrorhealth import probes

__all__ = [
    "MAX_TEAM_HOSTS",
    "Targets",
    "TeamRules",
    "Transport",
    "credential_problems",
    "probed_targets",
]

MAX_TEAM_HOSTS = 32
"""Mirror hosts that MirrorPolicies add to the cluster's and that are probed (see the module)."""

TeamRules = Mapping[str, Sequence[policy.MirrorRule]]
"""Each namespace's own rules (:attr:`policy.Composition.team_rules`)."""


def _registry_host(registry: str) -> str:
    return registry.partition("/")[0].lower()


def credential_problems(
    mirror_policy: policy.Policy, credentials: Mapping[str, Credential]
) -> dict[str, str]:
    """Policy credentials that cannot serve their rules, by name, with why.

    Missing from the store, or for a registry host other than the mirror
    host of a rule that uses it: the generated pull secret would not
    authenticate the kubelet to the mirror.
    """
    problems: dict[str, str] = {}
    for rule in mirror_policy.rules:
        for name in rule.credentials:
            if name in problems:
                continue
            credential = credentials.get(name)
            if credential is None:
                problems[name] = "not in the credential store"
            elif _registry_host(credential.registry) != rule.mirror.host.lower():
                problems[name] = (
                    f"is for registry {_registry_host(credential.registry)!r}, not "
                    f"{rule.mirror.host!r}, the mirror host of {rule.label}"
                )
    return problems


@dataclasses.dataclass(frozen=True)
class Transport:
    """How a mirror host is reached: plain HTTP, or TLS with its CA file and verification.

    The policy makes every rule on one host agree on it (MirrorPolicies' rules too: the
    composition refuses a rule that reaches a host otherwise than the rules before it).
    """

    plain: bool = False
    ca_file: str | None = None
    skip_verify: bool = False

    @classmethod
    def of(cls, rule: policy.MirrorRule) -> Transport:
        return cls(plain=rule.scheme == "http", ca_file=rule.ca_file, skip_verify=rule.skip_verify)

    def context(self, mirror_ca: str | None = None) -> ssl.SSLContext | None:
        """The probes' TLS context; None: plain HTTP. Raises ValueError for a bad CA file."""
        if self.plain:
            return None
        return probes.tls_context(self.ca_file, skip_verify=self.skip_verify, mirror_ca=mirror_ca)


@dataclasses.dataclass(frozen=True)
class Targets:
    """What the policies in force and one store snapshot ask to be probed."""

    hosts: Mapping[str, Transport]
    """Mirror host → how it is reached."""
    logins: Mapping[str, tuple[str, str]]
    """Credential → (mirror host, a repository under the mirror's path to scope a token to)."""
    misconfigured: Mapping[str, str]
    mirrors: Mapping[str, str]
    """Each probed rule's mirror as written → its host (the gauge's label)."""
    unprobed: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Hosts of MirrorPolicies past :data:`MAX_TEAM_HOSTS` → the namespaces whose rules name
    them: not probed."""


def _team_hosts(
    team_rules: TeamRules, known: Mapping[str, object], cap: int
) -> tuple[set[str], dict[str, tuple[str, ...]]]:
    """The hosts MirrorPolicies add to ``known`` that are probed (at most ``cap``, taken in
    turn from each namespace), and the rest with the namespaces that name them."""
    namespaces = sorted(team_rules)
    added = [
        list(dict.fromkeys(r.mirror.host for r in team_rules[ns] if r.mirror.host not in known))
        for ns in namespaces
    ]
    chosen: dict[str, None] = {}
    for column in itertools.zip_longest(*added):
        for host in column:
            if host is not None and len(chosen) < cap:
                chosen.setdefault(host, None)
    past: dict[str, list[str]] = {}
    for ns, hosts in zip(namespaces, added, strict=True):
        for host in hosts:
            if host not in chosen:
                past.setdefault(host, []).append(ns)
    return set(chosen), {host: tuple(found) for host, found in past.items()}


def _login(rule: policy.MirrorRule) -> tuple[str, str]:
    path = rule.mirror.path
    return rule.mirror.host, f"{path}/mirrorgate-health" if path else "mirrorgate-health"


def probed_targets(
    mirror_policy: policy.Policy,
    credentials: Mapping[str, Credential],
    team_rules: TeamRules | None = None,
    *,
    cap: int = MAX_TEAM_HOSTS,
) -> Targets:
    """The cluster's rules (``mirror_policy``) and the namespaces' own (``team_rules``),
    as targets (see the module)."""
    hosts: dict[str, Transport] = {}
    logins: dict[str, tuple[str, str]] = {}
    for rule in mirror_policy.rules:
        hosts.setdefault(rule.mirror.host, Transport.of(rule))
        for name in rule.credentials:  # each team's robot logs in on its own
            logins.setdefault(name, _login(rule))
    misconfigured = credential_problems(mirror_policy, credentials)
    for name in misconfigured:
        logins.pop(name, None)
    mirrors = {str(r.mirror): r.mirror.host for r in mirror_policy.rules}
    chosen, unprobed = _team_hosts(team_rules or {}, hosts, cap)
    for namespace in sorted(team_rules or {}):
        for rule in (team_rules or {})[namespace]:
            host = rule.mirror.host
            if host in chosen:
                hosts.setdefault(host, Transport.of(rule))
            if host not in hosts:
                continue  # past the cap
            mirrors.setdefault(str(rule.mirror), host)
            for name in rule.credentials:
                if name in logins or name in misconfigured:
                    continue  # the cluster's rules (or an earlier namespace's) decided it
                credential = credentials.get(name)
                if credential is None:
                    misconfigured[name] = "not in the credential store"
                elif _registry_host(credential.registry) == host.lower():
                    logins[name] = _login(rule)
    return Targets(
        hosts=hosts,
        logins=logins,
        misconfigured=misconfigured,
        mirrors=mirrors,
        unprobed=unprobed,
    )
