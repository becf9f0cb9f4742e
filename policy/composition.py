"""Composing ClusterMirrorPolicies and MirrorPolicies into the policy admission uses.

Values in, values out: the objects and the namespaces' labels in, a
:class:`Composition` out, which holds the effective :class:`Policy` of each
namespace and a :class:`Verdict` per object (the controller's ``Accepted``
condition; the policy webhook's answer at apply time).

The rules, each stated once here:

* Every ClusterMirrorPolicy's ``spec`` is a policy file. Their rules and
  credentials are merged, and their ``exclude`` lists joined. The same
  source, credential name, credential registry or mirror path in two objects
  is a conflict; so is ``onCredentialError`` or ``health`` set in two
  objects (at most one object sets each). Of two objects in conflict the
  older (``creationTimestamp``, then name) keeps its place; the newer is
  refused as a whole, naming the other. A rule may name a credential another
  ClusterMirrorPolicy defines.
* A MirrorPolicy's rules apply only to Pods in its namespace. Each names
  only credentials granted to that namespace (by name or by
  ``namespaceSelector``: hence the labels), never takes images from a rule
  the cluster marks ``fixed``, and replaces the cluster's rule for the same
  source there. Otherwise the usual precedence holds: the most specific
  source wins, whichever object it comes from.
* An object is accepted or refused whole: a refused object's rules apply nowhere.

Composed again after a change, with the composition before it as ``previous``, every
effective policy whose value did not change is the previous one itself: the cluster's
when its objects say the same, and a namespace's when the cluster's is unchanged and its
rules are equal. Admission keeps its plans by the policy's identity
(webhook/admissioncache.py), so a change in one namespace replans that namespace only.
Namespaces without a MirrorPolicy all share the cluster's one policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from mirrorgate.policy.clusterpolicies import compose_cluster
from mirrorgate.policy.model import Policy
from mirrorgate.policy.objects import CLUSTER_KIND, ObjectKey, PolicyObject
from mirrorgate.policy.rules import MirrorRule
from mirrorgate.policy.teams import Fixed, effective, judge_namespaced
from mirrorgate.policy.verdicts import Reason, Verdict

__all__ = ["Composition", "Reason", "Verdict", "compose", "from_policy", "judge"]


@dataclasses.dataclass(frozen=True, eq=False)
class Composition:
    """The effective policy of every namespace, and the verdict on every object."""

    cluster: Policy
    """The accepted ClusterMirrorPolicies merged: every namespace's policy without a
    MirrorPolicy of its own."""
    namespaced: Mapping[str, Policy]
    """Namespaces with an accepted MirrorPolicy: their rules ahead of the cluster's."""
    verdicts: Mapping[ObjectKey, Verdict]

    def policy_for(self, namespace: str) -> Policy:
        """The policy admission plans ``namespace``'s Pods with."""
        return self.namespaced.get(namespace, self.cluster)

    @property
    def policies(self) -> tuple[Policy, ...]:
        """Every policy admission can plan with under this composition: the cluster's,
        then each namespace's own."""
        return (self.cluster, *self.namespaced.values())

    @property
    def team_rules(self) -> dict[str, tuple[MirrorRule, ...]]:
        """Each namespace's own rules (its MirrorPolicies'), the cluster's left out."""
        cluster = {id(r) for r in self.cluster.rules}
        return {
            namespace: tuple(r for r in p.rules if id(r) not in cluster)
            for namespace, p in self.namespaced.items()
        }

    @property
    def refused(self) -> dict[ObjectKey, Verdict]:
        return {k: v for k, v in self.verdicts.items() if not v.accepted}


def from_policy(mirror_policy: Policy) -> Composition:
    """A policy file as a composition: one cluster policy, no objects."""
    return Composition(cluster=mirror_policy, namespaced={}, verdicts={})


def _order(objects: Iterable[PolicyObject], last: ObjectKey | None) -> list[PolicyObject]:
    # Not yet stored (no creationTimestamp) counts as newest; the object being
    # judged at apply time is newest of all, so that it, not a stored one, is refused.
    return sorted(objects, key=lambda o: (o.key == last, o.created or "\uffff", o.name))


def compose(
    objects: Iterable[PolicyObject],
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
    *,
    last: ObjectKey | None = None,
    previous: Composition | None = None,
) -> Composition:
    """Judge ``objects`` (distinct keys) together; ``namespace_labels`` are the labels of
    the namespaces known (a namespace missing is one whose labels are not known: only
    names grant there). ``last`` is judged as the newest object whatever its age (the
    one being applied). Each effective policy equal to ``previous``'s is ``previous``'s
    own object (see the module)."""
    ordered = _order(objects, last)
    verdicts: dict[ObjectKey, Verdict] = {}
    cluster = compose_cluster([o for o in ordered if o.kind == CLUSTER_KIND], verdicts)
    before: Mapping[str, Policy] = {}
    if previous is not None and _same(cluster, previous.cluster):
        cluster, before = previous.cluster, previous.namespaced
    teams = [o for o in ordered if o.kind != CLUSTER_KIND]
    namespaced = _teams(cluster, teams, namespace_labels or {}, verdicts, before)
    return Composition(cluster=cluster, namespaced=namespaced, verdicts=verdicts)


_WRITTEN = tuple(f.name for f in dataclasses.fields(Policy) if f.init)
"""What a policy is made of; the rest is derived from it."""


def _same(one: Policy, other: Policy) -> bool:
    """Whether two policies are equal in value (a :class:`Policy` compares by identity)."""
    return one is other or all(getattr(one, f) == getattr(other, f) for f in _WRITTEN)


def _teams(
    cluster: Policy,
    ordered: Iterable[PolicyObject],
    labels: Mapping[str, Mapping[str, str]],
    verdicts: dict[ObjectKey, Verdict],
    before: Mapping[str, Policy] | None = None,
) -> dict[str, Policy]:
    """Each namespace's policy from its MirrorPolicies (``ordered``, oldest first); a
    verdict for each into ``verdicts``. ``before``: the namespaces' policies of the last
    composition, made beside this same ``cluster``: one with equal rules is kept."""
    fixed = Fixed(cluster.rules)
    teams: dict[str, list[PolicyObject]] = {}
    for obj in ordered:
        teams.setdefault(obj.namespace or "", []).append(obj)
    namespaced: dict[str, Policy] = {}
    hosts: dict[str, MirrorRule] = {}
    for rule in cluster.rules:
        hosts.setdefault(rule.mirror.host, rule)
    for namespace, team in teams.items():
        own: list[MirrorRule] = []
        for obj in team:
            verdict, rules = judge_namespaced(
                obj, cluster, fixed, labels.get(namespace), own, hosts
            )
            verdicts[obj.key] = verdict
            own.extend(rules)
            for rule in rules:
                hosts.setdefault(rule.mirror.host, rule)
        if own:
            rules = effective(own, cluster)
            kept = (before or {}).get(namespace)
            namespaced[namespace] = (
                kept if kept is not None and kept.rules == rules else cluster.with_rules(rules)
            )
    return namespaced


def judge(
    candidate: PolicyObject,
    others: Iterable[PolicyObject],
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Verdict:
    """The verdict on ``candidate`` applied beside the stored ``others`` (its own stored
    version among them is replaced): what the policy webhook answers. It is judged as
    the newest object, so a conflict refuses it rather than a stored one."""
    relevant = [
        o
        for o in others
        if o.kind == CLUSTER_KIND
        or (candidate.kind != CLUSTER_KIND and o.namespace == candidate.namespace)
    ]
    # Judged against what stands now, its own stored version included: an object
    # that is refused blocks nothing.
    if candidate.kind == CLUSTER_KIND:
        standing = compose(relevant, namespace_labels).verdicts
        kept = [o for o in relevant if o.key != candidate.key and standing[o.key].accepted]
        return compose([*kept, candidate], namespace_labels, last=candidate.key).verdicts[
            candidate.key
        ]
    # A MirrorPolicy: the cluster's part is composed once, for both. (Its mirror hosts
    # are compared with the cluster's here, with other namespaces' in the controller's
    # composition, whose status says so.)
    labels = namespace_labels or {}
    verdicts: dict[ObjectKey, Verdict] = {}
    cluster = compose_cluster(
        _order((o for o in relevant if o.kind == CLUSTER_KIND), None), verdicts
    )
    mine = [o for o in relevant if o.kind != CLUSTER_KIND]
    _teams(cluster, _order(mine, None), labels, verdicts)
    kept = [o for o in mine if o.key != candidate.key and verdicts[o.key].accepted]
    _teams(cluster, _order([*kept, candidate], candidate.key), labels, verdicts)
    return verdicts[candidate.key]
