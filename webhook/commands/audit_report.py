"""The audit report: what the policy makes of each image of each namespace, and its JSON.

Outcomes, per container image and namespace
-------------------------------------------
``rewrite``      a rule covers it; admission would replace it by ``new_image``
                 (``reason`` names the rules passed over, ``onNotGranted: next``)
``not-granted``  a rule covers it, but none of the rule's credentials is granted
                 to the namespace: admission would leave it as written (or
                 refuse the Pod in enforce, ``onNotGranted: deny``: the reason
                 says so)
``pull-never``   a rule covers it, but its container's ``imagePullPolicy`` is
                 ``Never`` (``skipPullPolicyNever``): left as written, and never
                 pulled, so not unmirrored
``unmatched``    no rule covers it
``invalid``      not a valid image reference (or its mirror name would not be)
``on-mirror``    already under a rule's mirror prefix (``reason`` is set when
                 that rule's credential is not granted to the namespace: the
                 Pod would get no pull secret for it)
``excluded``     matched by ``exclude.images``

Pods labelled ``mirrorgate.io/skip=true`` and static-Pod mirrors (owned by the
kubelet) are counted as *skipped* and their images are not examined; nor are
those of namespaces the policy excludes (``exclude.namespaces``, and always
``kube-system``). The namespace's ``mirrorgate.io/mode`` label is reported as
``none``, ``audit`` or ``enforce`` (any other value is ``none``: the webhook
ignores it), or ``unknown`` when the Namespace could not be read.
Outcomes are those of the policy, whatever the label: the report shows what
opting a namespace in would change. The namespace's labels grant as they do in
admission (``credentials.<name>.namespaceSelector``); a Namespace that could not
be read is judged as admission judges one its cache does not hold yet: only
names grant, and the reason says its labels are not known.

"Unmirrored" (``--fail-on unmirrored``, ``summary.unmirrored``) counts the
containers whose image is not already on a mirror: outcomes ``rewrite``,
``not-granted``, ``unmatched`` and ``invalid``. Excluded images, images
whose pull policy is Never, excluded namespaces and skipped Pods never count.

JSON output (``-o json``), version 1
------------------------------------
One object; every key is always present (``null`` when it does not apply),
lists are sorted, and new keys may be added within version 1::

    {
      "version": 1,
      "policy": "policy.yaml",                   # the --policy argument
      "scope": {"all_namespaces": true, "namespaces": []},   # or false and the -n list
      "fail_on": null,                           # or "unmirrored" / "rewrites"
      "failed": false,                           # whether --fail-on tripped (exit 1)
      "summary": {
        "namespaces": 3,                         # namespaces reported (below)
        "excluded_namespaces": 1,
        "pods": 2005,                            # every Pod listed, skipped included
        "skipped_pods": 1,
        "unmirrored": 2003,                      # containers, as defined above
        "containers": {"rewrite": 2000, "not-granted": 1, "unmatched": 1,
                       "invalid": 1, "on-mirror": 1, "excluded": 1},
        "images": {...same keys...}              # distinct image strings per outcome
      },
      "namespaces": [                            # by name; with -A only those with Pods
        {
          "name": "team-a",
          "mode": "enforce",                     # none | audit | enforce | unknown
          "mode_label": "enforce",               # the label's raw value, or null
          "excluded": false,                     # excluded namespaces list no images
          "pods": 2003, "skipped_pods": 1,
          "containers": {...outcome counts...},
          "images": [                            # by outcome (order above), then most
            {                                    # Pods first, then image
              "image": "nginx:1.27",             # exactly as written in the Pod (a row per
                                                 # image and pull policy Never or not)
              "outcome": "rewrite",
              "pods": 2000,                      # Pods using it (skipped ones aside)
              "containers": 2000,                # containers using it
              "new_image": "harbor.corp.example/dockerhub-proxy/library/nginx:1.27",
              "rule": "mirrors[0]",              # the deciding rule, or null
              "credential": "harbor-pull",       # that rule's credential, or null
              "reason": null,                    # why, for not-granted / invalid / on-mirror
              "health": "up"                     # rewrite only: "up" or why the mirror cannot
            }                                    # be used now (null: --no-health)
          ]
        }
      ]
    }
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

from mirrorgate import policy
from mirrorgate.policy.model import MODES

__all__ = [
    "FAIL_ON",
    "JSON_VERSION",
    "OUTCOMES",
    "UNMIRRORED",
    "AuditOutcome",
    "ImageTally",
    "NamespaceReport",
    "Report",
    "Verdict",
    "judge",
    "namespace_mode",
]

JSON_VERSION = 1

AuditOutcome = Literal[
    "rewrite", "not-granted", "unmatched", "invalid", "on-mirror", "pull-never", "excluded"
]
# Display order: what needs attention first.
OUTCOMES: tuple[AuditOutcome, ...] = (
    "rewrite",
    "not-granted",
    "unmatched",
    "invalid",
    "on-mirror",
    "pull-never",
    "excluded",
)
UNMIRRORED: frozenset[AuditOutcome] = frozenset({"rewrite", "not-granted", "unmatched", "invalid"})
FAIL_ON: dict[str, frozenset[AuditOutcome]] = {
    "unmirrored": UNMIRRORED,
    "rewrites": frozenset({"rewrite"}),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What the policy does with one image string in one namespace."""

    outcome: AuditOutcome
    new_image: str | None = None
    rule: str | None = None
    credential: str | None = None
    reason: str | None = None
    health: str | None = None
    """For ``rewrite``: ``up``, or why the mirror cannot be used now (None: not probed)."""


# Version 1 of the JSON names two of admission's outcomes as it always has.
_V1_NAMES: dict[str, AuditOutcome] = {
    "no-rule": "unmatched",
    "already-mirrored": "on-mirror",
    "pull-policy-never": "pull-never",
}


def judge(
    mirror_policy: policy.Policy,
    image: str,
    namespace: str,
    health: policy.Health | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    pull_never: bool = False,
) -> Verdict:
    """The audit outcome of ``image`` in ``namespace``: admission's own decision.

    ``health`` is what a probe of the mirrors found (None: not probed): of a rule's
    several mirrors, the verdict names the one that would serve. ``labels`` are the
    namespace's, for grants by ``namespaceSelector`` (None: not known), as admission
    reads them from its Namespace cache. ``pull_never``: the container's
    ``imagePullPolicy`` is ``Never``.
    """
    decision = policy.decide_image(
        mirror_policy.resolve(image),
        namespace=namespace,
        mirror_policy=mirror_policy,
        labels=labels,
        pull_never=pull_never,
    )
    outcome = _V1_NAMES.get(decision.outcome, cast("AuditOutcome", decision.outcome))
    rule = decision.resolution.rule
    label = rule.label if rule is not None else None
    only = rule.credentials[0] if rule is not None and len(rule.credentials) == 1 else None
    credential = decision.credential or only
    if outcome in ("excluded", "unmatched"):
        return Verdict(outcome)
    passed = "; ".join(f"passed over {r.label}: {why}" for r, why in decision.passed) or None
    if outcome == "rewrite":
        choice = policy.choose_mirror(
            decision.resolution,
            health=health or policy.HEALTHY,
            mirror_policy=mirror_policy,
            namespace=namespace,
            labels=labels,
        )
        assert choice is not None  # decide_image said rewrite: some mirror is granted
        return Verdict(
            outcome,
            new_image=choice.new_image,
            rule=choice.rule.label,
            credential=choice.credential,
            reason=passed,
            health=None if health is None else _health(choice),
        )
    # A reason only where admission would warn (the Pod would not get what it
    # needs), or where the Pod's own pull policy keeps the image as written.
    reason = decision.reason if decision.warning is not None or outcome == "pull-never" else None
    if outcome == "not-granted":
        then = "refused in enforce" if decision.denial is not None else "left as written"
        reason = f"{reason}; {then}"
    return Verdict(outcome, rule=label, credential=credential, reason=reason)


def _health(choice: policy.Choice) -> str:
    """``up``, or why the mirror cannot be used now; a later mirror serving says why the
    ones before it were passed over."""
    if choice.problem is not None:
        return choice.problem
    down = [p.reason for p in choice.passed if p.health]
    return f"up (failed over: {'; '.join(down)})" if down else "up"


@dataclasses.dataclass(slots=True)
class ImageTally:
    verdict: Verdict
    pods: int = 0
    containers: int = 0


@dataclasses.dataclass
class NamespaceReport:
    """Every image of one namespace's Pods, grouped by image string."""

    name: str
    mode: str
    mode_label: str | None
    excluded: bool
    pods: int = 0
    skipped_pods: int = 0
    images: dict[tuple[str, bool], ImageTally] = dataclasses.field(default_factory=dict)
    """By image as written and whether its pull policy is Never."""
    labels: Mapping[str, str] | None = None
    """The Namespace's labels, which grants by ``namespaceSelector`` read (None: not known)."""
    mirror_policy: policy.Policy | None = dataclasses.field(default=None, repr=False)
    """The namespace's policy, as the server composes it: what its Pods are judged with
    when :meth:`add_pod` is given none, and their rewrites again with the mirrors' health."""

    def add_pod(self, pod: Mapping[str, Any], mirror_policy: policy.Policy | None = None) -> None:
        if mirror_policy is None:
            mirror_policy = self.mirror_policy
        assert mirror_policy is not None, "a namespace's Pods are judged with some policy"
        self.pods += 1
        if self.excluded:
            return
        metadata = pod.get("metadata") or {}
        if (
            policy.exempt_pod(
                namespace=self.name,
                labels=metadata.get("labels") or {},
                annotations=metadata.get("annotations") or {},
                mirror_policy=mirror_policy,
            )
            is not None
        ):
            self.skipped_pods += 1
            return
        sites, _ = policy.find_image_sites(pod)  # malformed containers: the API rejects them
        seen: set[tuple[str, bool]] = set()
        for site in sites:
            key = (site.image, site.pull_never)
            tally = self.images.get(key)
            if tally is None:
                # Judged once per image and namespace, however many replicas use it.
                tally = self.images[key] = ImageTally(
                    judge(
                        mirror_policy,
                        site.image,
                        self.name,
                        labels=self.labels,
                        pull_never=site.pull_never,
                    )
                )
            tally.containers += 1
            if key not in seen:
                seen.add(key)
                tally.pods += 1

    def counts(self) -> dict[AuditOutcome, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for tally in self.images.values():
            counts[tally.verdict.outcome] += tally.containers
        return counts

    def rows(self) -> list[tuple[str, ImageTally]]:
        """Images by outcome, then most Pods first, then name: stable for diffs."""
        order = {outcome: i for i, outcome in enumerate(OUTCOMES)}
        return sorted(
            ((image, tally) for (image, _), tally in self.images.items()),
            key=lambda item: (order[item[1].verdict.outcome], -item[1].pods, item[0]),
        )


def namespace_mode(labels: Mapping[str, str] | None) -> tuple[str, str | None]:
    """(mode, raw label): an unreadable Namespace is ``unknown``."""
    if labels is None:
        return "unknown", None
    raw = labels.get(policy.MODE_LABEL)
    return (raw if raw in MODES else "none"), raw


@dataclasses.dataclass
class Report:
    """The whole audit: per-namespace reports plus what was asked."""

    policy_path: str
    scope: Sequence[str] | None
    """The -n namespaces, or None for all."""
    namespaces: dict[str, NamespaceReport]
    fail_on: str | None = None

    def totals(self) -> tuple[dict[AuditOutcome, int], dict[AuditOutcome, int]]:
        """(containers, distinct images) per outcome, over every namespace."""
        containers = dict.fromkeys(OUTCOMES, 0)
        images: dict[AuditOutcome, set[str]] = {o: set() for o in OUTCOMES}
        for ns in self.namespaces.values():
            for (image, _), tally in ns.images.items():
                containers[tally.verdict.outcome] += tally.containers
                images[tally.verdict.outcome].add(image)
        return containers, {o: len(s) for o, s in images.items()}

    @property
    def failed(self) -> bool:
        if self.fail_on is None:
            return False
        containers, _ = self.totals()
        return any(containers[o] for o in FAIL_ON[self.fail_on])

    def ordered(self) -> list[NamespaceReport]:
        return [self.namespaces[name] for name in sorted(self.namespaces)]

    def to_json(self) -> dict[str, Any]:
        containers, images = self.totals()
        spaces = self.ordered()
        return {
            "version": JSON_VERSION,
            "policy": self.policy_path,
            "scope": {"all_namespaces": self.scope is None, "namespaces": sorted(self.scope or ())},
            "fail_on": self.fail_on,
            "failed": self.failed,
            "summary": {
                "namespaces": len(spaces),
                "excluded_namespaces": sum(ns.excluded for ns in spaces),
                "pods": sum(ns.pods for ns in spaces),
                "skipped_pods": sum(ns.skipped_pods for ns in spaces),
                "unmirrored": sum(containers[o] for o in OUTCOMES if o in UNMIRRORED),
                "containers": containers,
                "images": images,
            },
            "namespaces": [_namespace_json(ns) for ns in spaces],
        }


def _namespace_json(ns: NamespaceReport) -> dict[str, Any]:
    return {
        "name": ns.name,
        "mode": ns.mode,
        "mode_label": ns.mode_label,
        "excluded": ns.excluded,
        "pods": ns.pods,
        "skipped_pods": ns.skipped_pods,
        "containers": ns.counts(),
        "images": [
            {
                "image": image,
                "outcome": t.verdict.outcome,
                "pods": t.pods,
                "containers": t.containers,
                "new_image": t.verdict.new_image,
                "rule": t.verdict.rule,
                "credential": t.verdict.credential,
                "reason": t.verdict.reason,
                "health": t.verdict.health,
            }
            for image, t in ns.rows()
        ],
    }
