"""The policy loader: a decoded policy document in, a validated :class:`Policy` out.

The input is the plain data a YAML or JSON document decodes to; reading and
decoding the file is the caller's business (this package does no I/O).
Every problem is collected, not just the first, and each one names the field
path and the bad value::

    mirrors[2].source: "Docker.io" is not a valid registry host
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import cast

from mirrorgate.policy import (
    matching,
    mirrorlists,
    reference,
    rulechecks,
    selectors,
    teamcredentials,
)
from mirrorgate.policy.collector import Collector, type_name
from mirrorgate.policy.collector import json_quote as _quote
from mirrorgate.policy.durations import parse_duration
from mirrorgate.policy.health import DEFAULT_HEALTH_SETTINGS, HealthSettings
from mirrorgate.policy.hosts import canonical_host, mirror_problem, registry_host_problem
from mirrorgate.policy.model import (
    DELIVERIES,
    ON_CREDENTIAL_ERROR,
    CredentialGrant,
    Delivery,
    OnCredentialError,
    Policy,
    PolicyError,
)
from mirrorgate.policy.rules import (
    CATCH_ALL,
    ON_MIRROR_DOWN,
    ON_NOT_GRANTED,
    Mirror,
    MirrorRule,
    OnMirrorDown,
    OnNotGranted,
    Scheme,
    Source,
)
from mirrorgate.policy.teamcredentials import CREDENTIAL_NAME_RE, parse_credential_name

__all__ = ["CREDENTIAL_NAME_RE", "load", "probe_duration"]

# Namespace globs: DNS-label characters plus the fnmatch wildcards.
_NAMESPACE_GLOB_RE = re.compile(r"[-a-z0-9*?\[\]!]{1,63}", re.ASCII)

_TOP_LEVEL_KEYS = (
    "onCredentialError",
    "skipPullPolicyNever",
    "health",
    "mirrors",
    "exclude",
    "credentials",
)
# Fields a policy once had: what to do instead.
_REMOVED_KEYS = {
    "mode": "the policy no longer sets the mode; remove this line. Each namespace's "
    "mirrorgate.io/mode label (enforce or audit) decides, and the server's "
    "--audit-only (the chart's mode: audit) makes the whole cluster report only",
}
_RULE_KEYS = (
    "source",
    "mirror",
    "credential",
    "onNotGranted",
    "onMirrorDown",
    "caFile",
    "insecureSkipVerify",
    "fixed",
)
# `mirror: http://host/path` declares a plain-HTTP mirror; `https://` is the
# default spelled out. Only a rule's mirror takes a scheme.
MIRROR_SCHEMES: tuple[Scheme, ...] = ("https", "http")
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_HEALTH_KEYS = ("interval", "timeout", "failureThreshold", "successThreshold")
# Probing more often than this is load on the mirror without news; less often
# than this leaves an outage unnoticed for too long to be worth the name.
MIN_INTERVAL, MAX_INTERVAL = 0.1, 3600.0
MAX_THRESHOLD = 100
_EXCLUDE_KEYS = ("images", "namespaces")
_GRANT_KEYS = ("namespaces", "namespaceSelector", "registry", "provider", "delivery")
# A provider is named as in the kubelet's CredentialProviderConfig: a file
# name in the plugin directory.
_PROVIDER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _parse_source(value: object, path: str, errors: Collector) -> Source | None:
    if not isinstance(value, str) or not value:
        errors.add(path, f"must be a registry host or host/path, got {_quote(value)}")
        return None
    if value == CATCH_ALL:
        return Source(host="", path="", wildcard=True)
    if value.startswith("*."):
        suffix = value[2:]
        if (
            "/" in suffix
            or ":" in suffix
            or "*" in suffix
            or registry_host_problem(suffix) is not None
        ):
            errors.add(
                path,
                f"{_quote(value)} is not a valid wildcard host "
                "(write *.example.com: whole hosts only, no port, no path)",
            )
            return None
        return Source(host=suffix, path="", wildcard=True)
    problem = registry_host_problem(value)
    if problem is not None:
        errors.add(path, f"{_quote(value)} is not a valid registry host: {problem}")
        return None
    host, _, repo = value.rstrip("/").partition("/")
    if repo and (reference.split_name(f"{host}/{repo}") != (host, repo)):
        errors.add(path, f"{_quote(value)} has an invalid repository path {_quote(repo)}")
        return None
    return Source(host=canonical_host(host), path=repo, wildcard=False)


def _parse_mirror(value: object, path: str, errors: Collector) -> Mirror | None:
    if not isinstance(value, str) or not value:
        errors.add(path, f"must be host[:port][/path], got {_quote(value)}")
        return None
    problem = mirror_problem(value)
    if problem is not None:
        errors.add(path, problem)
        return None
    host, _, repo = value.rstrip("/").partition("/")
    return Mirror(host=host, path=repo)


def _parse_rule_mirror(value: object, path: str, errors: Collector) -> tuple[Mirror | None, Scheme]:
    """A rule's ``[http://|https://]host[:port][/path]``: the mirror and how to reach it.

    ``https://`` is the default spelled out and means the same as no scheme;
    ``http://`` is a plain-HTTP mirror. Any other scheme is refused, saying so.
    """
    scheme: Scheme = "https"
    if isinstance(value, str) and (found := _SCHEME_RE.match(value)):
        written = found.group(1)
        if written not in MIRROR_SCHEMES:
            errors.add(
                path,
                f"{_quote(value)}: {_quote(written + '://')} is not a mirror "
                "scheme (write http:// for a plain-HTTP mirror, https:// or no "
                "scheme for HTTPS)",
            )
            return None, scheme
        scheme = cast("Scheme", written)
        value = value[found.end() :]
    return _parse_mirror(value, path, errors), scheme


def _rule_mirror(
    entry: mirrorlists.MirrorEntry,
    index: int,
    source: Source | None,
    grants: Mapping[str, CredentialGrant],
    seen_mirrors: dict[tuple[str, str], str],
    errors: Collector,
) -> MirrorRule | None:
    """One mirror of the rule ``mirrors[index]`` as a rule of its own (None: invalid)."""
    mirror, scheme = _parse_rule_mirror(entry.url, entry.url_path, errors)
    where = entry.prefix
    credentials = teamcredentials.parse_rule_credentials(
        entry.fields.get("credential"), f"{where}.credential", mirror, grants, errors
    )
    ca_file, skip_verify = rulechecks.transport_problems(entry.fields, where, scheme, errors)
    key = matching.mirror_key(mirror, https=scheme == "https") if mirror is not None else None
    if key is not None and key in seen_mirrors:
        # Two sources under one mirror path collide (ghcr.io/org/app and
        # quay.io/org/app would become the same image).
        errors.add(
            entry.url_path,
            f"{_quote(str(mirror))} is already the mirror of "
            f"{seen_mirrors[key]}; give each source its own mirror path",
        )
        return None
    if source is None or mirror is None or key is None:
        return None
    rule = MirrorRule(
        index=index,
        source=source,
        mirror=mirror,
        credentials=credentials,
        ca_file=ca_file,
        scheme=scheme,
        skip_verify=skip_verify,
        position=entry.position,
    )
    seen_mirrors[key] = rule.label
    return rule


def _parse_namespace_globs(value: object, path: str, errors: Collector) -> tuple[str, ...]:
    globs = errors.string_list(value, path)
    for i, glob in enumerate(globs):
        if not _NAMESPACE_GLOB_RE.fullmatch(glob):
            errors.add(f"{path}[{i}]", f"{_quote(glob)} is not a namespace name or glob")
    return globs


def _parse_image_globs(value: object, path: str, errors: Collector) -> tuple[str, ...]:
    globs = errors.string_list(value, path)
    for i, glob in enumerate(globs):
        if any(c.isspace() for c in glob):
            errors.add(f"{path}[{i}]", f"{_quote(glob)} contains white space")
    return globs


def probe_duration(text: str) -> float | None:
    """Seconds of a ``health`` duration (Go's grammar, :func:`parse_duration`), or None.

    A probe schedule is never negative: ``-1s`` is refused as not a duration.
    """
    seconds = parse_duration(text)
    return None if seconds is None or seconds < 0 else seconds


def _parse_health(value: object, errors: Collector) -> HealthSettings:
    """The ``health`` block, defaults filled in; durations are strings like ``10s``."""
    block = errors.mapping(value, "health", _HEALTH_KEYS)
    seconds: dict[str, float] = {}
    for key in ("interval", "timeout"):
        default = getattr(DEFAULT_HEALTH_SETTINGS, key)
        raw = block.get(key)
        parsed = probe_duration(raw) if isinstance(raw, str) else None
        if raw is not None and parsed is None:
            errors.add(
                f"health.{key}",
                f"{_quote(raw)} is not a duration (write it like 10s, 500ms or 1m30s)",
            )
        seconds[key] = default if parsed is None else parsed
    interval, timeout = seconds["interval"], seconds["timeout"]
    interval_ok = MIN_INTERVAL <= interval <= MAX_INTERVAL
    if not interval_ok:
        errors.add(
            "health.interval",
            f"{_quote(block.get('interval'))} is outside {MIN_INTERVAL:g}s to {MAX_INTERVAL:g}s",
        )
    if timeout <= 0:
        errors.add("health.timeout", f"{_quote(block.get('timeout'))} must be more than 0s")
    elif interval_ok and timeout > interval:
        # Probes of one round would still be running when the next one starts.
        errors.add(
            "health.timeout",
            f"{_quote(block.get('timeout', '2s'))} is longer than health.interval ({interval:g}s)",
        )
    thresholds: dict[str, int] = {}
    for key, field in (
        ("failureThreshold", "failure_threshold"),
        ("successThreshold", "success_threshold"),
    ):
        raw = block.get(key, getattr(DEFAULT_HEALTH_SETTINGS, field))
        if type(raw) is not int or not 1 <= raw <= MAX_THRESHOLD:
            errors.add(
                f"health.{key}", f"{_quote(raw)} is not a whole number from 1 to {MAX_THRESHOLD}"
            )
            raw = getattr(DEFAULT_HEALTH_SETTINGS, field)
        thresholds[field] = raw
    return HealthSettings(interval=interval, timeout=timeout, **thresholds)


def load(document: object, *, known: Mapping[str, CredentialGrant] | None = None) -> Policy:
    """Validate a decoded policy document and build the :class:`Policy`.

    ``known`` are credentials defined elsewhere that its rules may name (the
    other ClusterMirrorPolicies', the cluster's for a MirrorPolicy); the
    policy's ``grants`` are the document's own.
    Raises :class:`PolicyError` listing every problem, each with its path.
    """
    errors = Collector()
    top = errors.mapping(document, "", _TOP_LEVEL_KEYS, _REMOVED_KEYS)
    if document is None:
        errors.add("", "the policy is empty")

    on_error = top.get("onCredentialError", "skip")
    if on_error not in ON_CREDENTIAL_ERROR:
        errors.add(
            "onCredentialError",
            f"{_quote(on_error)} is not one of: {', '.join(ON_CREDENTIAL_ERROR)}",
        )
    skip_never = top.get("skipPullPolicyNever", True)
    if not isinstance(skip_never, bool):
        errors.add("skipPullPolicyNever", f"must be true or false, got {_quote(skip_never)}")

    grants: dict[str, CredentialGrant] = {}
    seen_registries: dict[Mirror, str] = {}
    grants_doc = errors.mapping(top.get("credentials"), "credentials", None)
    for name, grant_doc in grants_doc.items():
        where = f"credentials.{name}"
        if parse_credential_name(name, where, errors) is None:
            continue
        grant = errors.mapping(grant_doc, where, _GRANT_KEYS)
        selector = (
            selectors.parse_selector(
                grant["namespaceSelector"], f"{where}.namespaceSelector", errors
            )
            if grant.get("namespaceSelector") is not None
            else None
        )
        if "namespaces" not in grant and "namespaceSelector" not in grant:
            errors.add(
                f"{where}.namespaces",
                "is required (or namespaceSelector): the namespaces whose Pods may use "
                "this credential",
            )
        namespaces = _parse_namespace_globs(grant.get("namespaces"), f"{where}.namespaces", errors)
        if grant.get("namespaces") == [] and selector is None:
            errors.add(f"{where}.namespaces", "is empty: the credential would reach no namespace")
        registry = (
            _parse_mirror(grant["registry"], f"{where}.registry", errors)
            if grant.get("registry") is not None
            else None
        )
        if registry is not None and registry in seen_registries:
            # The kubelet keeps one login per key: the second would silently win.
            errors.add(
                f"{where}.registry",
                f"{_quote(str(registry))} is already the registry of "
                f"credentials.{seen_registries[registry]}; give each credential its own "
                "host or path",
            )
        elif registry is not None:
            seen_registries[registry] = name
        provider = grant.get("provider")
        if provider is not None and not (
            isinstance(provider, str) and _PROVIDER_NAME_RE.fullmatch(provider)
        ):
            errors.add(
                f"{where}.provider",
                f"{_quote(provider)} is not a valid provider name "
                "(a file name in --credential-provider-bin-dir)",
            )
            provider = None
        delivery = grant.get("delivery", "pullSecret")
        if delivery not in DELIVERIES:
            errors.add(
                f"{where}.delivery",
                f"{_quote(delivery)} is not one of: {', '.join(DELIVERIES)}",
            )
            delivery = "pullSecret"
        grants[name] = CredentialGrant(
            name=name,
            namespaces=namespaces,
            registry=registry,
            provider=provider,
            selector=selector,
            delivery=cast("Delivery", delivery),
        )

    # What rules may name: the document's own credentials and the ones known elsewhere
    # (only the own are the policy's: their globs compiled, their warnings given).
    available = {**(known or {}), **grants}
    rules: list[MirrorRule] = []
    seen_sources: dict[Source, int] = {}
    seen_mirrors: dict[tuple[str, str], str] = {}
    for i, rule_doc in enumerate(errors.sequence(top.get("mirrors"), "mirrors")):
        where = f"mirrors[{i}]"
        if not isinstance(rule_doc, Mapping):
            errors.add(
                where, f"must be a mapping with source and mirror, got {type_name(rule_doc)}"
            )
            continue
        rule = errors.mapping(rule_doc, where, _RULE_KEYS)
        for required in ("source", "mirror"):
            if required not in rule:
                errors.add(f"{where}.{required}", "is required")
        source = (
            _parse_source(rule.get("source"), f"{where}.source", errors)
            if "source" in rule
            else None
        )
        on_not_granted = rule.get("onNotGranted", "skip")
        if on_not_granted not in ON_NOT_GRANTED:
            errors.add(
                f"{where}.onNotGranted",
                f"{_quote(on_not_granted)} is not one of: {', '.join(ON_NOT_GRANTED)}",
            )
        on_down = rule.get("onMirrorDown", "fallback")
        if on_down not in ON_MIRROR_DOWN:
            errors.add(
                f"{where}.onMirrorDown",
                f"{_quote(on_down)} is not one of: {', '.join(ON_MIRROR_DOWN)}",
            )
        fixed = rule.get("fixed", False)
        if not isinstance(fixed, bool):
            errors.add(f"{where}.fixed", f"must be true or false, got {_quote(fixed)}")
            fixed = False
        if source is not None and source in seen_sources:
            written = rule["source"]
            same = "" if written == str(source) else f" (as {_quote(str(source))})"
            errors.add(
                f"{where}.source",
                f"{_quote(written)}{same} is already the source of mirrors[{seen_sources[source]}]",
            )
        entries = mirrorlists.mirror_entries(rule, where, errors) if "mirror" in rule else []
        built = [
            _rule_mirror(entry, i, source, available, seen_mirrors, errors) for entry in entries
        ]
        if source is None or not entries or None in built:
            continue
        seen_sources[source] = i
        rules += [
            dataclasses.replace(
                r,
                on_mirror_down=cast("OnMirrorDown", on_down),
                on_not_granted=cast("OnNotGranted", on_not_granted),
                fixed=fixed,
            )
            for r in built
            if r is not None
        ]

    rulechecks.check_nested_mirrors(rules, errors)
    teamcredentials.check_shared_grants(rules, available, errors)
    rulechecks.check_mirror_transports(rules, errors)
    health = _parse_health(top.get("health"), errors)

    exclude = errors.mapping(top.get("exclude"), "exclude", _EXCLUDE_KEYS)
    exclude_images = _parse_image_globs(exclude.get("images"), "exclude.images", errors)
    exclude_namespaces = _parse_namespace_globs(
        exclude.get("namespaces"), "exclude.namespaces", errors
    )

    if errors.errors:
        raise PolicyError(errors.errors, errors.omitted)
    return Policy(
        rules=tuple(rules),
        exclude_images=exclude_images,
        exclude_namespaces=exclude_namespaces,
        grants=grants,
        on_credential_error=cast("OnCredentialError", on_error),
        skip_pull_policy_never=skip_never is not False,
        health=health,
        warnings=(
            *rulechecks.warnings(rules, grants),
            *teamcredentials.selector_warnings(rules, grants),
        ),
    )
