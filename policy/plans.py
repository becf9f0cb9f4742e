"""The rewrite plan: what admission should change on one Pod, and why."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

from mirrorgate.policy.decision import Outcome
from mirrorgate.policy.sites import ImageSite

__all__ = [
    "ORIGINAL_IMAGES_ANNOTATION",
    "PULL_SECRET_PREFIX",
    "ImageRewrite",
    "RewritePlan",
    "audit_mode_line",
    "pull_secret_name",
]

ORIGINAL_IMAGES_ANNOTATION = "mirrorgate.io/original-images"
PULL_SECRET_PREFIX = "mirrorgate-"  # noqa: S105 - a name prefix, not a secret


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
    """``up``, or the health problem its rule's ``onMirrorDown: keep`` rewrote it through."""


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
class RewritePlan:
    """Everything admission should change on one Pod, and why."""

    rewrites: tuple[ImageRewrite, ...] = ()
    pull_secrets: tuple[str, ...] = ()
    """Secret names to append to ``spec.imagePullSecrets`` (not yet there)."""
    credentials: tuple[str, ...] = ()
    """Credentials whose pull secret must exist in the namespace for this plan."""
    original_images: Mapping[str, str] | None = None
    """The annotation's new content (to be written as a JSON object); None leaves it as is."""
    warnings: tuple[str, ...] = ()
    skipped: str | None = None
    """Why the whole Pod was left alone, if it was."""
    outcomes: Mapping[str, Outcome] = dataclasses.field(default_factory=dict)
    """Each image's outcome by site key (see :mod:`policy.decision`)."""
    fallbacks: int = 0
    """Images left as written because their mirror or credential is unhealthy."""


def audit_mode_line(rewrite: ImageRewrite, *, health: bool = False) -> str:
    """The one-line report of a rewrite that audit mode does not make.

    ``health`` appends the mirror's health, where probes have established it.
    """
    line = (
        f"mirrorgate audit: {rewrite.site.shown} would use {rewrite.new_image} "
        f"(was {rewrite.site.image})"
    )
    return f"{line}; health: {rewrite.health}" if health else line
