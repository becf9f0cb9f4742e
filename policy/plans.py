"""The rewrite plan: what admission should change on one Pod, and why."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal, NamedTuple, get_args

from mirrorgate.policy.decision import ImageOutcome
from mirrorgate.policy.quoting import quote
from mirrorgate.policy.sites import ImageSite

__all__ = [
    "ORIGINAL_IMAGES_ANNOTATION",
    "PULL_SECRET_PREFIX",
    "UNMIRRORED_REASONS",
    "ImageRewrite",
    "RewritePlan",
    "UnmirroredReason",
    "audit_mode_line",
    "credential_warning",
    "pull_secret_name",
]

ORIGINAL_IMAGES_ANNOTATION = "mirrorgate.io/original-images"
PULL_SECRET_PREFIX = "mirrorgate-"  # noqa: S105 - a name prefix, not a secret


UnmirroredReason = Literal[
    "credential-unavailable",
    "mirror-unhealthy",
    "not-granted",
    "invalid",
    "audit",
    "too-many-containers",
    "pull-policy-never",
    "credential-ambiguous",
]
"""Why an image a rule covers was admitted as written (the metric's ``reason`` label).

The planner gives the first four and the last two, for each image: its pull
secret could not be made or attached (``onCredentialError: skip``, or an
operation that cannot add one); its mirror is down (``onMirrorDown:
fallback``); its credential is not granted to the namespace; its name on the
mirror would not be a valid reference; its pull policy is ``Never``
(``skipPullPolicyNever``); or two of its rule's credentials are granted to the
namespace (by label), and mirrorgate does not choose. Admission adds ``audit``
(the namespace only reports) and ``too-many-containers`` (an audit namespace's
Pod past ``serve --max-containers``, not planned at all).
"""
UNMIRRORED_REASONS: tuple[UnmirroredReason, ...] = get_args(UnmirroredReason)


def pull_secret_name(credential: str) -> str:
    """The generated Secret that carries ``credential`` in a namespace."""
    return PULL_SECRET_PREFIX + credential


class ImageRewrite(NamedTuple):
    """A planned rewrite (a NamedTuple: cheap to build on the admission path)."""

    site: ImageSite
    new_image: str
    rule_label: str
    """The rule that decided it, as ``mirrors[N]``."""
    health: str = "up"
    """``up`` (``not probed`` without probes), or the health problem its rule's
    ``onMirrorDown: keep`` rewrote it through."""
    mirror: str = ""
    """The mirror it goes to, as written (``host[/path]``): of a rule's list, the one chosen
    (the ``mirror`` label of ``mirrorgate_images_rewritten_by_mirror_total``)."""


def credential_warning(site: ImageSite, reason: str, *, mirrored: bool) -> str:
    """The warning for an image whose credential cannot be used in this admission."""
    what = "is on a mirror but" if mirrored else "left as written:"
    return f"{site.shown}: image {quote(site.image)} {what} {reason}"


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
class RewritePlan:
    """Everything admission should change on one Pod, and why: a value, final once made.

    What the cluster answers afterwards (a pull secret that could not be made)
    is applied to the value with :meth:`without`, never by planning again.
    """

    rewrites: tuple[ImageRewrite, ...] = ()
    pull_secrets: tuple[str, ...] = ()
    """Secret names to append to ``spec.imagePullSecrets`` (not yet there)."""
    credentials: tuple[str, ...] = ()
    """Credentials whose pull secret must exist in the namespace for this plan."""
    original_images: Mapping[str, str] | None = None
    """The annotation's new content (to be written as a JSON object; empty: removed);
    None leaves it as is."""
    warnings: tuple[str, ...] = ()
    skipped: str | None = None
    """Why the whole Pod was left alone, if it was."""
    outcomes: Mapping[str, ImageOutcome] = dataclasses.field(default_factory=dict)
    """Each image's outcome by site key (see :mod:`policy.decision`)."""
    fallbacks: int = 0
    """Images left as written because their mirror or credential is unhealthy."""
    credential_sites: tuple[tuple[ImageSite, str], ...] = ()
    """Each image (rewritten or already on its mirror) that needs a credential, with it."""
    recorded: frozenset[str] = frozenset()
    """The site keys whose original this plan adds to ``original_images``."""
    unmirrored: Mapping[str, UnmirroredReason] = dataclasses.field(default_factory=dict)
    """Each image a rule covers that stays as written, by site key, with why."""
    unattachable: tuple[tuple[ImageSite, str], ...] = ()
    """Each image left as written because the pull secret it needs (named) is not on the Pod
    and cannot be added in this operation (an UPDATE, or kubectl debug's subresource)."""
    rebuilt: bool = False
    """The Pod's record held what is not mirrorgate's (:mod:`policy.originals`): it is
    written anew even where nothing is added to it."""
    denials: tuple[str, ...] = ()
    """Why an enforce namespace refuses the Pod: images under a rule that says
    ``onNotGranted: deny`` where none of its credentials is granted (audit only warns)."""

    def without(self, failures: Mapping[str, str]) -> RewritePlan:
        """This plan with the images of the credentials in ``failures`` left as written.

        ``failures`` maps each credential whose pull secret could not be made to
        why. Its images change to ``credential-unavailable``, each with a warning
        naming the pull secret and the reason (after the plan's own warnings),
        and leave the rewrites, the pull secrets, the credentials and the
        originals' record: a Pod must never point at a mirror it cannot
        authenticate to. Pure: the plan itself, which callers share, is unchanged.
        """
        failed = [(site, c) for site, c in self.credential_sites if c in failures]
        if not failed:
            return self
        outcomes = dict(self.outcomes)
        warnings = list(self.warnings)
        for site, credential in failed:
            reason = f"pull secret {pull_secret_name(credential)!r} is unavailable: "
            warnings.append(
                credential_warning(
                    site,
                    reason + failures[credential],
                    mirrored=outcomes.get(site.key) == "already-mirrored",
                )
            )
            outcomes[site.key] = "credential-unavailable"
        dropped = {site.key for site, _ in failed}
        recorded = self.recorded - dropped
        originals = self.original_images
        if originals is not None and recorded != self.recorded:
            gone = self.recorded & dropped
            originals = (
                {k: v for k, v in originals.items() if k not in gone}
                if recorded or self.rebuilt
                else None
            )
        secrets = {pull_secret_name(c) for c in failures}
        unmirrored: dict[str, UnmirroredReason] = dict(self.unmirrored)
        for rewrite in self.rewrites:
            if rewrite.site.key in dropped:  # an image already on its mirror stays there
                unmirrored[rewrite.site.key] = "credential-unavailable"
        return dataclasses.replace(
            self,
            rewrites=tuple(r for r in self.rewrites if r.site.key not in dropped),
            pull_secrets=tuple(s for s in self.pull_secrets if s not in secrets),
            credentials=tuple(c for c in self.credentials if c not in failures),
            original_images=originals,
            warnings=tuple(warnings),
            outcomes=outcomes,
            credential_sites=tuple(p for p in self.credential_sites if p[1] not in failures),
            recorded=recorded,
            unmirrored=unmirrored,
        )


def audit_mode_line(rewrite: ImageRewrite, *, health: bool = False) -> str:
    """The one-line report of a rewrite that audit mode does not make.

    ``health`` appends the mirror's health, where probes have established it.
    """
    line = (
        f"mirrorgate audit: {rewrite.site.shown} would use {rewrite.new_image} "
        f"(was {rewrite.site.image})"
    )
    return f"{line}; health: {rewrite.health}" if health else line
