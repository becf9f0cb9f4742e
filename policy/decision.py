"""What admission decides for one image of one Pod: the single statement of it.

The planner (and so admission and ``mirrorgate rewrite``), ``mirrorgate
explain`` and ``mirrorgate audit`` all ask these two functions, so that what
the tools report is what admission does.

Outcomes, first the Pod's, then each image's:

``excluded``          the namespace is excluded by the policy (always
                      ``kube-system``), or the image by ``exclude.images``
``skipped``           the Pod is labelled ``mirrorgate.io/skip=true`` or is a
                      static-Pod mirror owned by the kubelet
``invalid``           not a valid image reference, or its name on the mirror
                      would not be one; left as written with a warning
``no-rule``           no mirror rule covers the image
``already-mirrored``  already under a rule's mirror prefix: final (a warning
                      when that rule's credential is not granted here)
``not-granted``       a rule covers it, but its credential is not granted to
                      the namespace: left as written with a warning, because a
                      Pod must never point at a mirror it cannot authenticate to
``rewrite``           replaced by the image on the mirror

Admission alone adds ``credential-unavailable``: the pull secret the rewrite
needs could not be made (API down, RBAC, a Secret mirrorgate does not own) or
cannot be attached in this operation; and ``mirror-unhealthy``: the rule's
mirror is down or its credential cannot log in, and the rule says
``onMirrorDown: fallback``. They depend on the cluster and on the probes, so
the offline tools never report them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

from mirrorgate.policy.matching import Resolution
from mirrorgate.policy.model import Policy
from mirrorgate.policy.quoting import quote

__all__ = [
    "IMAGE_OUTCOMES",
    "MIRROR_POD_ANNOTATION",
    "MODE_LABEL",
    "SKIP_LABEL",
    "ImageDecision",
    "ImageOutcome",
    "PodExemption",
    "decide_image",
    "exempt_pod",
]

ImageOutcome = Literal[
    "excluded",
    "skipped",
    "invalid",
    "no-rule",
    "already-mirrored",
    "not-granted",
    "rewrite",
    "credential-unavailable",
    "mirror-unhealthy",
]
IMAGE_OUTCOMES: tuple[ImageOutcome, ...] = (
    "excluded",
    "skipped",
    "invalid",
    "no-rule",
    "already-mirrored",
    "not-granted",
    "rewrite",
    "credential-unavailable",
    "mirror-unhealthy",
)

SKIP_LABEL = "mirrorgate.io/skip"
MODE_LABEL = "mirrorgate.io/mode"
"""The Namespace label that opts a namespace in, with one of the policy's modes as its value."""
# Static pods are owned by the kubelet's manifest files; the API object is a
# read-only mirror that admission must not change.
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


class PodExemption(NamedTuple):
    """Why a whole Pod is left alone."""

    outcome: Literal["excluded", "skipped"]
    reason: str


def exempt_pod(
    *,
    namespace: str,
    labels: Mapping[str, object],
    annotations: Mapping[str, object],
    mirror_policy: Policy,
) -> PodExemption | None:
    """Why a Pod with these labels and annotations in ``namespace`` is left alone, or None."""
    if mirror_policy.is_namespace_excluded(namespace):
        return PodExemption("excluded", f"namespace {quote(namespace)} is excluded by the policy")
    if labels.get(SKIP_LABEL) == "true":
        return PodExemption("skipped", f"the Pod is labelled {SKIP_LABEL}=true")
    if MIRROR_POD_ANNOTATION in annotations:
        return PodExemption("skipped", "static-pod mirror, owned by the kubelet")
    return None


class ImageDecision(NamedTuple):
    """What admission does with one image of a Pod that is not exempt."""

    outcome: ImageOutcome
    resolution: Resolution
    """The rule, the image on the mirror, the parsed reference."""
    reason: str | None = None
    """Why the image stays as written (every outcome but ``rewrite``)."""
    warning: str | None = None
    """What admission tells the client about it (prefixed with the container), if anything."""


def decide_image(
    found: Resolution,
    *,
    namespace: str,
    mirror_policy: Policy,
    labels: Mapping[str, str] | None = None,
) -> ImageDecision:
    """Admission's decision for an image in a non-exempt Pod of ``namespace``, from what
    ``mirror_policy`` resolves it to (:meth:`Policy.resolve`); ``labels`` are the
    namespace's, for grants by ``namespaceSelector`` (None: not known)."""
    image = found.image
    rule = found.rule
    if found.outcome == "invalid":
        return ImageDecision(
            "invalid", found, found.error, f"image {quote(image)} left as written: {found.error}"
        )
    if found.outcome == "excluded":
        return ImageDecision("excluded", found, "matched by exclude.images")
    if rule is None:
        return ImageDecision("no-rule", found, "no mirror rule covers it")
    not_granted = mirror_policy.not_granted(rule, namespace, labels)
    if found.outcome == "on-mirror":
        reason = f"already under the mirror of {rule.label}"
        if not_granted is None:
            return ImageDecision("already-mirrored", found, reason)
        return ImageDecision(
            "already-mirrored",
            found,
            f"{reason}, but {not_granted}",
            f"image {quote(image)} is on a mirror but {not_granted}",
        )
    if not_granted is not None:
        return ImageDecision(
            "not-granted",
            found,
            not_granted,
            f"image {quote(image)} left as written: {not_granted}",
        )
    return ImageDecision("rewrite", found)
