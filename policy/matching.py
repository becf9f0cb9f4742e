"""Which rule an image falls under, in time that does not grow with the rule count.

Precedence, most specific first:

1. an image already under a mirror prefix is final (never rewritten again,
   so that reinvocation and Pod updates converge);
2. the source with the same host and the longest repository-path prefix,
   then the source that is the exact host;
3. the longest wildcard suffix (``*.gcr.io`` covers ``eu.gcr.io``, not
   ``gcr.io`` itself).

Every lookup is a dictionary probe per path component or host label, so
1,000 rules cost what one rule costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Literal

from mirrorgate.policy import reference
from mirrorgate.policy.hosts import DOCKER_HUB_ALIASES, canonical_host
from mirrorgate.policy.rules import MirrorRule

__all__ = ["DOCKER_HUB_ALIASES", "Resolution", "ResolutionOutcome", "RuleIndex", "rewritten_name"]

ResolutionOutcome = Literal["rewrite", "on-mirror", "excluded", "unmatched", "invalid"]


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
    error: str | None = None
    """Why the image is not a valid reference (``invalid`` only)."""


def canonical_path(host: str, path: str) -> str:
    """Docker Hub's one-component names live under library/, whichever alias was written."""
    if "/" not in path and canonical_host(host) == reference.DEFAULT_DOMAIN:
        return reference.OFFICIAL_REPO_PREFIX + path
    return path


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
        self._mirrors: dict[tuple[str, str], MirrorRule] = {}
        for rule in rules:
            if rule.source.wildcard:
                self._wildcards[rule.source.host] = rule
            else:
                self._sources[(rule.source.host, rule.source.path)] = rule
            self._mirrors[(rule.mirror.host, rule.mirror.path)] = rule

    def mirror_rule(self, ref: reference.ImageReference) -> MirrorRule | None:
        """The rule whose mirror prefix ``ref`` already sits under (longest prefix)."""
        if not self._mirrors:
            return None
        for prefix in _prefixes(ref.path):
            rule = self._mirrors.get((ref.domain, prefix))
            if rule is not None:
                return rule
        return None

    def source_rule(self, ref: reference.ImageReference) -> MirrorRule | None:
        """The most specific rule whose source covers ``ref``."""
        host = canonical_host(ref.domain)
        if self._sources:
            for prefix in _prefixes(canonical_path(ref.domain, ref.path)):
                rule = self._sources.get((host, prefix))
                if rule is not None:
                    return rule
        if self._wildcards and ":" not in host:
            # Strip one leading label at a time: the longest suffix first.
            cut = host.find(".")
            while cut != -1:
                rule = self._wildcards.get(host[cut + 1 :])
                if rule is not None:
                    return rule
                cut = host.find(".", cut + 1)
        return None


def rewritten_name(rule: MirrorRule, ref: reference.ImageReference) -> str:
    """The repository name on the mirror (without tag or digest).

    ``mirror + "/" +`` the normalised path after the source prefix; for a
    wildcard source the matched host stays as the first path component, so
    that images of different registries cannot collide on one mirror.
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
