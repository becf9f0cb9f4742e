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
``pull-policy-never`` a rule covers it, but its container (or image volume)
                      has pull policy ``Never``: the node uses the image it
                      already has, so it is left as written (``skipPullPolicyNever``)
``not-granted``       a rule covers it, but none of its credentials is granted
                      to the namespace (or two are, by label): left as written
                      with a warning, because a Pod must never point at a
                      mirror it cannot authenticate to. The rule's
                      ``onNotGranted`` may instead pass it to the next broader
                      rule (``next``) or refuse the Pod (``deny``)
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
from mirrorgate.policy.rules import MirrorRule

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
    "pull-policy-never",
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
    "pull-policy-never",
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
    """The rule that decided, the image on its mirror, the parsed reference."""
    reason: str | None = None
    """Why the image stays as written (every outcome but ``rewrite``)."""
    warning: str | None = None
    """What admission tells the client about it (prefixed with the container), if anything."""
    credential: str | None = None
    """The deciding rule's credential granted to the namespace (``rewrite``,
    ``already-mirrored``): the pull secret the Pod gets."""
    passed: tuple[tuple[MirrorRule, str], ...] = ()
    """The rules tried before the deciding one, each with why it was passed over
    (``onNotGranted: next``), most specific first."""
    denial: str | None = None
    """Why the Pod is refused under enforce (``onNotGranted: deny``); audit warns instead."""
    ambiguous: bool = False
    """Two of the rule's credentials are granted to the namespace (``not-granted``)."""


def decide_image(
    found: Resolution,
    *,
    namespace: str,
    mirror_policy: Policy,
    labels: Mapping[str, str] | None = None,
    pull_never: bool = False,
) -> ImageDecision:
    """Admission's decision for an image in a non-exempt Pod of ``namespace``, from what
    ``mirror_policy`` resolves it to (:meth:`Policy.resolve`); ``labels`` are the
    namespace's, for grants by ``namespaceSelector`` (None: not known); ``pull_never``:
    its container's ``imagePullPolicy`` (an image volume's ``pullPolicy``) is ``Never``."""
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
    if pull_never and mirror_policy.skip_pull_policy_never:
        return ImageDecision(
            "pull-policy-never",
            found,
            "its pull policy is Never: the node runs the image it already has "
            "(skipPullPolicyNever)",
        )
    choice = mirror_policy.choose_credential(rule, namespace, labels)
    if found.outcome == "on-mirror":
        reason = f"already under the mirror of {rule.label}"
        if choice.refusal is None:
            return ImageDecision("already-mirrored", found, reason, credential=choice.credential)
        return ImageDecision(
            "already-mirrored",
            found,
            f"{reason}, but {choice.refusal}",
            f"image {quote(image)} is on a mirror but {choice.refusal}",
        )
    return _walk(found, namespace=namespace, mirror_policy=mirror_policy, labels=labels)


def _walk(
    found: Resolution,
    *,
    namespace: str,
    mirror_policy: Policy,
    labels: Mapping[str, str] | None,
) -> ImageDecision:
    """The first rule of ``found``'s chain that can be used in ``namespace`` decides;
    ``onNotGranted`` says what a rule that cannot does."""
    passed: list[tuple[MirrorRule, str]] = []
    current = found
    while True:
        rule = current.rule
        if current.outcome == "invalid" or rule is None:
            error = current.error
            return ImageDecision(
                "invalid",
                current,
                error,
                f"image {quote(found.image)} left as written: {error}",
                passed=tuple(passed),
            )
        choice = mirror_policy.choose_credential(rule, namespace, labels)
        refusal = choice.refusal
        if refusal is None or _standby_granted(current, namespace, mirror_policy, labels):
            # Of a list of mirrors, :func:`policy.failover.choose_mirror` picks the one (and
            # its credential) by grant and health; ``credential`` is the first mirror's.
            return ImageDecision(
                "rewrite", current, credential=choice.credential, passed=tuple(passed)
            )
        if not choice.ambiguous and rule.on_not_granted == "next":
            if current.broader is not None:
                passed.append((rule, refusal))
                current = current.broader
                continue
            refusal += "; no broader rule covers the image (onNotGranted: next)"
        denial = None
        if not choice.ambiguous and rule.on_not_granted == "deny":
            denial = f"{refusal}, and {rule.label} says onNotGranted: deny"
            refusal = denial
        return ImageDecision(
            "not-granted",
            current,
            refusal,
            f"image {quote(found.image)} left as written: {refusal}",
            passed=tuple(passed),
            denial=denial,
            ambiguous=choice.ambiguous,
        )


def _standby_granted(
    found: Resolution, namespace: str, mirror_policy: Policy, labels: Mapping[str, str] | None
) -> bool:
    """Whether a later mirror of the rule's list is granted where its first is not
    (:mod:`policy.failover` then passes the first over and chooses the credential)."""
    return any(
        mirror_policy.choose_credential(standby.rule, namespace, labels).refusal is None
        for standby in found.standbys
    )
