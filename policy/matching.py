"""Which rule an image falls under, in time that does not grow with the rule count.

Precedence, most specific first:

1. an image already under a mirror prefix is final (never rewritten again,
   so that reinvocation and Pod updates converge);
2. the source with the same host and the longest repository-path prefix,
   then the source that is the exact host;
3. the longest wildcard suffix (``*.gcr.io`` covers ``eu.gcr.io``, not
   ``gcr.io`` itself);
4. the catch-all ``*``, for any host without a port that nothing above covers.

A rule whose credentials are not granted in a namespace may say
``onNotGranted: next``: then the next rule down this list that covers the
image decides (:attr:`Resolution.broader`).

Every lookup is a dictionary probe per path component or host label, so
1,000 rules cost what one rule costs.

Hosts are compared as the network sees them (:func:`hosts.network_host`):
``Quay.io:443/org/app`` is under the rule for ``quay.io`` and
``Harbor.Corp.Example:443/hub/nginx`` under the HTTPS mirror
``harbor.corp.example/hub``, because the runtime would pull them from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple

from mirrorgate.policy import reference
from mirrorgate.policy.hosts import DOCKER_HUB_ALIASES, canonical_host, network_host
from mirrorgate.policy.rules import Mirror, MirrorRule

__all__ = [
    "DOCKER_HUB_ALIASES",
    "Resolution",
    "ResolutionOutcome",
    "RuleIndex",
    "Standby",
    "mirror_key",
    "rewritten_name",
]

ResolutionOutcome = Literal["rewrite", "on-mirror", "excluded", "unmatched", "invalid"]


class Standby(NamedTuple):
    """A later mirror of a rule's list, with the image on it."""

    rule: MirrorRule
    new_image: str


@dataclasses.dataclass(frozen=True, slots=True)
class Resolution:
    """What the policy says about one image string, whatever the namespace."""

    image: str
    """The image exactly as written."""
    outcome: ResolutionOutcome
    rule: MirrorRule | None = None
    """The rule that matched (``rewrite``) or whose mirror holds the image (``on-mirror``)."""
    new_image: str | None = None
    """The image on the mirror (``rewrite`` only), tag and digest as written."""
    reference: reference.ImageReference | None = None
    host: str | None = None
    """The image's host as it was compared (:func:`hosts.network_host`): what ``explain``
    shows beside the domain as written (``rewrite``, ``on-mirror``, ``excluded``)."""
    error: str | None = None
    """Why the image is not a valid reference (``invalid`` only)."""
    standbys: tuple[Standby, ...] = ()
    """The rule's other mirrors after ``rule``, in order, each with the image on it
    (``rewrite`` only): admission takes the first the probes find up (:mod:`policy.failover`)."""
    broader: Resolution | None = None
    """What the next broader rule that covers the image resolves it to, where ``rule`` says
    ``onNotGranted: next`` (and so on down the chain); None otherwise."""

    def new_images(self) -> Iterator[str]:
        """The image on each mirror the chain may send this one to, most specific first
        (each rule's mirrors in their order)."""
        found: Resolution | None = self
        while found is not None:
            if found.new_image is not None:
                yield found.new_image
            for standby in found.standbys:
                yield standby.new_image
            found = found.broader


def compared_host(
    ref: reference.ImageReference, rule: MirrorRule | None, *, on_mirror: bool
) -> str:
    """The spelling of ``ref``'s host that met ``rule``'s mirror (``on_mirror``) or a source."""
    if on_mirror and rule is not None:
        return network_host(ref.domain, https=rule.scheme == "https")
    return canonical_host(ref.domain)


def mirror_key(mirror: Mirror, *, https: bool) -> tuple[str, str]:
    """The mirror prefix as the network sees it: two spellings of one prefix share a key."""
    return network_host(mirror.host, https=https), mirror.path


def canonical_path(host: str, path: str) -> str:
    """Docker Hub's one-component names live under library/, whichever alias was written."""
    if "/" not in path and canonical_host(host) == reference.DEFAULT_DOMAIN:
        return reference.OFFICIAL_REPO_PREFIX + path
    return path


def canonical_name(ref: reference.ImageReference) -> str:
    """``ref``'s repository as the network sees it: ``Registry-1.Docker.io:443/nginx`` is
    ``docker.io/library/nginx``."""
    return f"{canonical_host(ref.domain)}/{canonical_path(ref.domain, ref.path)}"


_GLOB_CHARS = frozenset("*?[")


def canonical_glob(glob: str) -> str:
    """An ``exclude.images`` glob with its host spelled as :func:`canonical_name` spells it.

    The part before the first ``/`` is a host: compared in lower case,
    without ``:443``, Docker Hub's aliases as docker.io (and a Docker Hub
    name of one component under ``library/``). A glob without a ``/`` has no
    host to rewrite; nor do the rest's tag and digest, which are case-sensitive.
    """
    host, slash, rest = glob.partition("/")
    if not slash:
        return glob
    if _GLOB_CHARS.isdisjoint(host):
        host = canonical_host(host)
        path = rest.split(":", 1)[0].split("@", 1)[0]
        if _GLOB_CHARS.isdisjoint(path):
            rest = canonical_path(host, path) + rest[len(path) :]
    else:
        host = network_host(host)
    return f"{host}/{rest}"


def _prefixes(path: str) -> Iterable[str]:
    """``a/b/c`` → ``a/b/c``, ``a/b``, ``a``, ``""``: longest first, whole components."""
    yield path
    cut = len(path)
    while (cut := path.rfind("/", 0, cut)) > 0:
        yield path[:cut]
    if path:
        yield ""


class RuleIndex:
    """Dictionaries over the rules of one policy, built once at load."""

    def __init__(self, rules: Iterable[MirrorRule]) -> None:
        self._sources: dict[tuple[str, str], MirrorRule] = {}
        self._wildcards: dict[str, MirrorRule] = {}
        self._catch_all: MirrorRule | None = None
        # By scheme: ``:443`` is the default port of an HTTPS mirror only.
        self._https_mirrors: dict[tuple[str, str], MirrorRule] = {}
        self._http_mirrors: dict[tuple[str, str], MirrorRule] = {}
        for rule in rules:
            # A rule's mirror list shares one source: the first entry stands for it.
            if rule.source.catch_all:
                self._catch_all = self._catch_all or rule
            elif rule.source.wildcard:
                self._wildcards.setdefault(rule.source.host, rule)
            else:
                self._sources.setdefault((rule.source.host, rule.source.path), rule)
            https = rule.scheme == "https"
            mirrors = self._https_mirrors if https else self._http_mirrors
            mirrors[mirror_key(rule.mirror, https=https)] = rule

    def mirror_rule(self, ref: reference.ImageReference) -> MirrorRule | None:
        """The rule whose mirror prefix ``ref`` already sits under (longest prefix)."""
        https, http = self._https_mirrors, self._http_mirrors
        if not https and not http:
            return None
        https_host = network_host(ref.domain, https=True)
        http_host = network_host(ref.domain, https=False)
        for prefix in _prefixes(ref.path):
            rule = https.get((https_host, prefix)) or http.get((http_host, prefix))
            if rule is not None:
                return rule
        return None

    def source_rule(self, ref: reference.ImageReference) -> MirrorRule | None:
        """The most specific rule whose source covers ``ref``."""
        return next(self.source_rules(ref), None)

    def source_rules(self, ref: reference.ImageReference) -> Iterator[MirrorRule]:
        """Every rule whose source covers ``ref``, most specific first (see the module)."""
        host = canonical_host(ref.domain)
        if self._sources:
            for prefix in _prefixes(canonical_path(ref.domain, ref.path)):
                rule = self._sources.get((host, prefix))
                if rule is not None:
                    yield rule
        if ":" in host:
            # A port has no place in a repository path: a host with one is on its own.
            return
        if self._wildcards:
            # Strip one leading label at a time: the longest suffix first.
            cut = host.find(".")
            while cut != -1:
                rule = self._wildcards.get(host[cut + 1 :])
                if rule is not None:
                    yield rule
                cut = host.find(".", cut + 1)
        if self._catch_all is not None:
            yield self._catch_all


def rewritten_name(rule: MirrorRule, ref: reference.ImageReference) -> str:
    """The repository name on the mirror (without tag or digest).

    ``mirror + "/" +`` the normalised path after the source prefix; for a
    wildcard source (and the catch-all) the matched host stays as the first
    path component, so that images of different registries cannot collide on
    one mirror: ``nginx`` is ``<mirror>/docker.io/library/nginx`` under ``*``.
    """
    path = canonical_path(ref.domain, ref.path)
    if rule.source.wildcard:
        rest = f"{canonical_host(ref.domain)}/{path}"
    elif rule.source.path:
        rest = path[len(rule.source.path) + 1 :]
    else:
        rest = path
    mirror = str(rule.mirror)
    return f"{mirror}/{rest}" if rest else mirror
