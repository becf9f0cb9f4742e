"""The mirror policy: what users write, validated once when it is loaded.

The input is the plain data a YAML or JSON document decodes to; reading and
decoding the file is the caller's business (this package does no I/O).
Every problem is collected, not just the first, and each one names the field
path and the bad value::

    mirrors[2].source: "Docker.io" is not a valid registry host

Nothing here is validated again per request: a :class:`Policy` that exists is
a policy that is valid.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

from mirrorgate.policy import matching, reference
from mirrorgate.policy.health import DEFAULT_HEALTH_SETTINGS, HealthSettings
from mirrorgate.policy.quoting import quote
from mirrorgate.policy.rules import Mirror, MirrorRule

if TYPE_CHECKING:
    from mirrorgate.policy.selectors import LabelSelector

__all__ = [
    "ALWAYS_EXCLUDED_NAMESPACES",
    "AUDIT",
    "DELIVERIES",
    "ENFORCE",
    "MODES",
    "CredentialChoice",
    "CredentialGrant",
    "Delivery",
    "FieldError",
    "Mode",
    "OnCredentialError",
    "Policy",
    "PolicyError",
]

Mode = Literal["enforce", "audit"]
"""How an admission treats a Pod: set by the namespace's mirrorgate.io/mode label (or the
server's --audit-only), never by the policy."""
ENFORCE: Mode = "enforce"
AUDIT: Mode = "audit"
MODES: tuple[Mode, ...] = (ENFORCE, AUDIT)
OnCredentialError = Literal["skip", "deny"]
ON_CREDENTIAL_ERROR: tuple[OnCredentialError, ...] = ("skip", "deny")
Delivery = Literal["pullSecret", "kubelet"]
"""How a granted namespace's Pods get a credential's login: ``pullSecret`` copies it into
the namespace as ``mirrorgate-<name>`` and attaches it; ``kubelet`` leaves no copy anywhere,
and the node's credential-provider plugin fetches it for each pull, for the Pod's service
account (docs/security.md)."""
DELIVERIES: tuple[Delivery, ...] = ("pullSecret", "kubelet")

# The control plane pulls its own images before any webhook can help it;
# rewriting them risks a cluster that cannot restart. Not configurable.
ALWAYS_EXCLUDED_NAMESPACES = ("kube-system",)

MAX_ERRORS = 1000
"""Problems a :class:`PolicyError` keeps; it counts the rest."""


@dataclasses.dataclass(frozen=True, slots=True)
class FieldError:
    """One problem in a policy document, located by its field path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PolicyError(ValueError):
    """A policy document that cannot be used; ``errors`` lists the problems found.

    At most :data:`MAX_ERRORS` of them: ``omitted`` counts the rest, which a
    document of a hundred thousand bad entries would otherwise turn into a
    message of megabytes.
    """

    def __init__(self, errors: Sequence[FieldError], omitted: int = 0) -> None:
        self.errors = tuple(errors)
        self.omitted = omitted
        more = [f"... and {omitted} more"] if omitted else []
        super().__init__("\n".join([*(str(e) for e in self.errors), *more]))


@dataclasses.dataclass(frozen=True, slots=True)
class CredentialGrant:
    """Which namespaces may receive a copy of a credential: by name (or fnmatch glob), or by
    a namespace label (``namespaceSelector``); either one grants."""

    name: str
    namespaces: tuple[str, ...]
    registry: Mirror | None = None
    """The scope of the login, ``host[:port][/path]``: the key of the generated
    ``.dockerconfigjson`` (the kubelet sends the most specific key that covers
    an image). None: the store entry's own key."""
    provider: str | None = None
    """A kubelet credential-provider plugin that issues this login; None: the store."""
    selector: LabelSelector | None = None
    """``namespaceSelector``: namespaces whose labels it matches are granted too."""
    delivery: Delivery = "pullSecret"
    """How the login reaches the kubelet: a Secret copy per namespace, or the plugin."""

    @property
    def pull_secret(self) -> bool:
        """Whether a granted namespace holds a copy (``delivery: pullSecret``)."""
        return self.delivery == "pullSecret"

    def covers(self, mirror: Mirror) -> bool:
        """Whether images under ``mirror`` fall under this credential's scope."""
        scope = self.registry
        if scope is None:
            return True
        return scope.host == mirror.host and (
            not scope.path or f"{mirror.path}/".startswith(f"{scope.path}/")
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
    """A validated policy. Build it with :func:`load`."""

    rules: tuple[MirrorRule, ...]
    exclude_images: tuple[str, ...]
    exclude_namespaces: tuple[str, ...]
    grants: Mapping[str, CredentialGrant]
    on_credential_error: OnCredentialError = "skip"
    skip_pull_policy_never: bool = True
    """``skipPullPolicyNever``: images of containers (and image volumes) whose pull policy
    is ``Never`` stay as written: the node has them already and will not pull them."""
    health: HealthSettings = DEFAULT_HEALTH_SETTINGS
    warnings: tuple[FieldError, ...] = ()
    """What is valid but unsafe (verification skipped, credentials over plain HTTP):
    ``policy check`` prints it and exits 1."""

    # Derived once, so that matching an image or a namespace costs the same
    # whatever the number of rules and globs.
    index: matching.RuleIndex = dataclasses.field(init=False, repr=False)
    _excluded_image: re.Pattern[str] | None = dataclasses.field(init=False, repr=False)
    _excluded_namespace: re.Pattern[str] | None = dataclasses.field(init=False, repr=False)
    _grant_patterns: dict[str, re.Pattern[str] | None] = dataclasses.field(init=False, repr=False)
    _mirror_lists: dict[int, tuple[MirrorRule, ...]] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        derived = {
            "index": matching.RuleIndex(self.rules),
            "_excluded_image": _compile_globs(
                [matching.canonical_glob(g) for g in self.exclude_images]
            ),
            "_excluded_namespace": _compile_globs(
                (*ALWAYS_EXCLUDED_NAMESPACES, *self.exclude_namespaces)
            ),
            "_grant_patterns": {
                name: _compile_globs(grant.namespaces) for name, grant in self.grants.items()
            },
            "_mirror_lists": _mirror_lists(self.rules),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    def with_rules(self, rules: tuple[MirrorRule, ...]) -> Policy:
        """This policy with ``rules`` instead of its own, all else shared (the compiled globs
        too): a namespace's policy, its MirrorPolicies' rules beside the cluster's."""
        clone = copy.copy(self)
        object.__setattr__(clone, "rules", rules)  # frozen: set once, here
        object.__setattr__(clone, "index", matching.RuleIndex(rules))
        return clone

    def resolve(self, image: str) -> matching.Resolution:
        """What this policy does with ``image``, namespace aside.

        Pure, and the same answer every time: a caller may keep it (the
        webhook's admission cache does).
        """
        if len(image) > reference.REFERENCE_LENGTH_MAX:
            # Cannot be valid: answered without parsing it.
            return matching.Resolution(
                image=image,
                outcome="invalid",
                error=f"{len(image)} characters is longer than any valid reference "
                f"(at most {reference.REFERENCE_LENGTH_MAX})",
            )
        try:
            ref = reference.parse_normalized(image)
        except reference.InvalidReferenceError as error:
            return matching.Resolution(image=image, outcome="invalid", error=error.reason)
        if self.is_image_excluded(ref):
            return matching.Resolution(
                image=image,
                outcome="excluded",
                reference=ref,
                host=matching.compared_host(ref, None, on_mirror=False),
            )
        rule = self.index.mirror_rule(ref)
        if rule is not None:
            return matching.Resolution(
                image=image,
                outcome="on-mirror",
                rule=rule,
                reference=ref,
                host=matching.compared_host(ref, rule, on_mirror=True),
            )
        return self._through(image, ref, self.index.source_rules(ref))

    def _through(
        self, image: str, ref: reference.ImageReference, rules: Iterator[MirrorRule]
    ) -> matching.Resolution:
        """``ref`` under the first of ``rules``, and under the next ones while each rule says
        ``onNotGranted: next`` (the chain is as long as the rules that cover one image)."""
        rule = next(rules, None)
        if rule is None:
            return matching.Resolution(image=image, outcome="unmatched", reference=ref)
        mirrors = self.mirror_list(rule)
        images: list[str] = []
        for candidate in mirrors:
            new_image, problem = _on_mirror(candidate, ref)
            if new_image is None:
                # Every mirror of a rule must hold every image of its source.
                return matching.Resolution(
                    image=image, outcome="invalid", reference=ref, error=problem
                )
            images.append(new_image)
        broader = self._through(image, ref, rules) if rule.on_not_granted == "next" else None
        if broader is not None and broader.outcome == "unmatched":
            broader = None  # no broader rule: the chain ends here
        return matching.Resolution(
            image=image,
            outcome="rewrite",
            rule=rule,
            new_image=images[0],
            reference=ref,
            host=matching.compared_host(ref, rule, on_mirror=False),
            standbys=tuple(
                matching.Standby(r, new) for r, new in zip(mirrors[1:], images[1:], strict=True)
            ),
            broader=broader,
        )

    def mirror_list(self, rule: MirrorRule) -> tuple[MirrorRule, ...]:
        """Every mirror of ``rule``'s entry in ``mirrors``, in order (one, for most rules)."""
        return self._mirror_lists.get(rule.index, (rule,))

    def is_image_excluded(self, ref: reference.ImageReference) -> bool:
        """Whether an ``exclude.images`` glob matches the reference as the network sees it.

        A glob is tried on the whole reference and on the name alone, so
        ``docker.io/library/nginx`` excludes every tag of nginx. Both sides
        are compared with hosts as the network sees them
        (:func:`matching.canonical_name`): ``Registry.K8s.io:443/pause:3.9`` is
        excluded by ``registry.k8s.io/pause:*``.
        """
        pattern = self._excluded_image
        if pattern is None:
            return False
        name = matching.canonical_name(ref)
        return (
            pattern.fullmatch(name + str(ref)[len(ref.name) :]) is not None
            or pattern.fullmatch(name) is not None
        )

    def is_namespace_excluded(self, namespace: str) -> bool:
        pattern = self._excluded_namespace
        return pattern is not None and pattern.fullmatch(namespace) is not None

    @property
    def has_selectors(self) -> bool:
        """Whether any grant reads namespace labels (else they need not be looked up)."""
        return any(grant.selector is not None for grant in self.grants.values())

    def label_grants(self, labels: Mapping[str, str] | None) -> frozenset[str] | None:
        """The credentials whose ``namespaceSelector`` matches ``labels`` (None: unknown).

        All that a plan reads of a namespace's labels: a cache of plans keys by it.
        """
        if labels is None:
            return None
        return frozenset(
            name
            for name, grant in self.grants.items()
            if grant.selector is not None and grant.selector.matches(labels)
        )

    def is_granted(
        self, credential: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> bool:
        """Whether ``namespace`` (with ``labels``; None: not known) may receive ``credential``."""
        if self._by_name(credential, namespace):
            return True
        grant = self.grants.get(credential)
        selector = grant.selector if grant is not None else None
        return selector is not None and labels is not None and selector.matches(labels)

    def choose_credential(
        self, rule: MirrorRule, namespace: str, labels: Mapping[str, str] | None = None
    ) -> CredentialChoice:
        """Which of ``rule``'s credentials a Pod in ``namespace`` uses, or why it can use none.

        The one statement of the grant check and its wording, for admission
        warnings, ``explain`` and ``audit`` alike. ``labels`` are the
        namespace's, as mirrorgate's own cache holds them; None while they
        are not known, when only the names can grant. Two granted (possible
        only by ``namespaceSelector``: the loader refuses it by name) is no
        choice at all: mirrorgate never guesses which team's robot to use.
        """
        names = rule.credentials
        if not names:
            return CredentialChoice(None)
        granted = [c for c in names if self.is_granted(c, namespace, labels)]
        if len(granted) == 1:
            return CredentialChoice(granted[0])
        if granted:
            by_label = [c for c in granted if not self._by_name(c, namespace)]
            how = f" (by credentials.{by_label[0]}.namespaceSelector)" if by_label else ""
            return CredentialChoice(
                None,
                f"credentials {granted[0]!r} and {granted[1]!r} of {rule.label} are both "
                f"granted to namespace {quote(namespace)}{how}; mirrorgate does not choose "
                "between them",
                ambiguous=True,
            )
        which = (
            f"credential {names[0]!r}"
            if len(names) == 1
            else f"none of the credentials {', '.join(map(repr, names))}"
        )
        verb = "is not granted" if len(names) == 1 else "is granted"
        reason = f"{which} of {rule.label} {verb} to namespace {quote(namespace)}"
        selecting = [c for c in names if (g := self.grants.get(c)) and g.selector is not None]
        if selecting and labels is None:
            reason += (
                f" (its labels, which credentials.{selecting[0]}.namespaceSelector reads, "
                "are not known yet)"
            )
        return CredentialChoice(None, reason)

    def _by_name(self, credential: str, namespace: str) -> bool:
        pattern = self._grant_patterns.get(credential)
        return pattern is not None and pattern.fullmatch(namespace) is not None


class CredentialChoice(NamedTuple):
    """What :meth:`Policy.choose_credential` found for one rule in one namespace."""

    credential: str | None
    """The credential to use (None: the rule needs none, or none can be used)."""
    refusal: str | None = None
    """Why the rule cannot be used in the namespace (None: it can)."""
    ambiguous: bool = False
    """The refusal is that two credentials are granted, not that none is."""


def _mirror_lists(rules: Sequence[MirrorRule]) -> dict[int, tuple[MirrorRule, ...]]:
    """The rules that list several mirrors, by index: their entries in order."""
    lists: dict[int, list[MirrorRule]] = {}
    for rule in rules:
        if rule.position is not None:
            lists.setdefault(rule.index, []).append(rule)
    return {index: tuple(entries) for index, entries in lists.items()}


def _on_mirror(
    rule: MirrorRule, ref: reference.ImageReference
) -> tuple[str, None] | tuple[None, str]:
    """``ref`` on ``rule``'s mirror, or why it cannot be there."""
    new_name = matching.rewritten_name(rule, ref)
    try:
        new_ref = reference.parse_normalized(new_name + str(ref)[len(ref.name) :])
    except reference.InvalidReferenceError as error:
        # e.g. a mirror path that pushes the repository past 255 characters.
        return None, f"the name on {rule.label}'s mirror would be invalid: {error.reason}"
    if new_ref.domain != rule.mirror.host:
        # The image is the source prefix itself and the mirror has no path:
        # the bare mirror host would be read as a Docker Hub name.
        return None, f"{rule.label}'s mirror has no repository path to hold this image"
    return str(new_ref), None


def _compile_globs(globs: Sequence[str]) -> re.Pattern[str] | None:
    if not globs:
        return None
    # fnmatch.translate gives `(?s:...)\Z`; joined they form one alternation
    # that the regex engine scans once.
    return re.compile("|".join(fnmatch.translate(g) for g in globs))
