"""The admission cache: the one owner of what admission keeps between requests.

The replicas of a workload reach admission as Pods of one shape
(:func:`policy.shape_key`), and Pods repeat the same few images. For each
policy in force (in a cluster, the cluster's and each namespace's with a
MirrorPolicy: :meth:`policy.Composition.policy_for`), this cache keeps

* by (health, shape): the plan, and what admission derives from it alone (the
  encoded patch, audit mode's report), made once for every Pod of the shape;
* by image string: what the policy resolves it to (:meth:`policy.Policy.resolve`),
  for the Pods it plans.

Each entry is kept under the policy it was made with, by that policy's identity: an
answer is never given for another policy, and Pods of a thousand namespaces, each
with a policy of its own, hit as Pods of one policy do (a shape names its namespace
anyway). Everything in it is charged against one budget: :data:`MAX_ENTRIES` entries
and an estimate of the bytes they hold, :data:`MAX_BYTES`. Passing either empties
the whole cache rather than growing it (a stream of unique images or shapes costs a
refill, never memory), and one entry costing more than a sixteenth of the bytes is
not kept at all: it would evict everything else for one caller's benefit. When a
new composition is served, :meth:`AdmissionCache.retain` drops what was made under
policies no longer in force and keeps the rest: a composition keeps every policy
that did not change as the same object (:func:`policy.compose`), so a change in one
namespace costs that namespace's plans only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from mirrorgate import policy

__all__ = ["ENTRY_OVERHEAD", "MAX_BYTES", "MAX_ENTRIES", "AdmissionCache", "Admitted"]

MAX_ENTRIES = 8192
MAX_BYTES = 24 << 20
ENTRY_OVERHEAD = 200
"""Bytes charged per entry beyond its strings: the dict slot, tuples, small objects."""

_NOT_YET: object = object()

AuditReport = tuple[tuple[str, ...], dict[str, str]]
"""Audit mode's warnings and audit annotations for a plan."""


class Admitted:
    """A plan, and what admission derives from it alone, made once each on first use.

    Shared by every Pod of one shape (treat it as read-only): the patch is the
    same for all of them because the shape decides where it attaches.
    """

    __slots__ = ("_patch", "plan", "report")

    def __init__(self, plan: policy.RewritePlan) -> None:
        self.plan = plan
        self._patch: object = _NOT_YET
        self.report: AuditReport | None = None

    def patch(self, make: Callable[[], str | None]) -> str | None:
        """The encoded patch, made by ``make`` the first time it is asked for."""
        if self._patch is _NOT_YET:
            self._patch = make()
        return self._patch  # type: ignore[return-value]

    def audit_report(self, make: Callable[[], AuditReport]) -> AuditReport:
        """Audit mode's report, made by ``make`` the first time it is asked for."""
        if self.report is None:
            self.report = make()
        return self.report


def _cost(key: policy.ShapeKey, plan: policy.RewritePlan) -> int | None:
    """The bytes an entry for ``key`` holds, or None when its Pod cannot be valid.

    Computed only for a new shape. A name longer than a DNS label or an image
    longer than any reference cannot be valid: such Pods are planned, never
    kept. The plan's sites and originals share the key's strings; its warnings
    quote bounded prefixes. The encoded patch and the audit report quote each
    name and image a few times over, and the originals once more: charged as
    four more copies of each name and image, and one of the originals.
    """
    size = len(key.namespace) + 2 * len(key.originals or "") + ENTRY_OVERHEAD
    size += sum(len(s or "") for s in key.pull_secrets or ())
    volumes = tuple((name, image) for _, name, image in key.image_volumes)
    for pairs in (key.containers, key.init_containers, key.ephemeral_containers, volumes):
        for name, image in pairs or ():
            if (
                len(name) > policy.CONTAINER_NAME_LENGTH_MAX
                or len(image) > policy.REFERENCE_LENGTH_MAX
            ):
                return None
            size += 5 * (len(name) + len(image)) + ENTRY_OVERHEAD
    return size + sum(map(len, plan.warnings))


class _Kept:
    """What is kept for one policy, and the bytes charged for it."""

    __slots__ = ("admitted", "held", "resolutions")

    def __init__(self) -> None:
        self.admitted: dict[tuple[policy.ShapeKey, frozenset[str] | None], Admitted] = {}
        self.resolutions: dict[str, policy.Resolution] = {}
        self.held = 0


class AdmissionCache:
    """Plans by shape and resolutions by image, for each policy in force (see the module)."""

    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.held = 0
        """Bytes charged for what is kept now."""
        self._entries = 0
        self._kept: dict[policy.Policy, _Kept] = {}
        """By the policy's identity (a :class:`policy.Policy` compares by identity)."""
        self._live: frozenset[policy.Policy] | None = None
        """The policies in force (:meth:`retain`); None: any policy may be kept."""

    def __len__(self) -> int:
        return self._entries

    @property
    def shapes(self) -> int:
        """Shapes whose plan is kept, under every policy."""
        return sum(len(kept.admitted) for kept in self._kept.values())

    @property
    def policies(self) -> int:
        """Policies something is kept for."""
        return len(self._kept)

    def resolved(self, image: str) -> bool:
        """Whether what ``image`` resolves to is kept (under any policy)."""
        return any(image in kept.resolutions for kept in self._kept.values())

    def clear(self) -> None:
        self._kept.clear()
        self._entries = self.held = 0

    def retain(self, policies: Iterable[policy.Policy]) -> None:
        """Keep only what was made under ``policies`` (the ones in force now), and from now
        on keep nothing for any other: a review still planned under the composition before
        is answered, not remembered."""
        self._live = live = frozenset(policies)
        for gone in [p for p in self._kept if p not in live]:
            kept = self._kept.pop(gone)
            self._entries -= len(kept.admitted) + len(kept.resolutions)
            self.held -= kept.held

    def _room(self, mirror_policy: policy.Policy, cost: int) -> _Kept | None:
        """Where an entry of ``cost`` bytes under ``mirror_policy`` goes, room made and the
        entry charged; None: it is not kept."""
        if cost * 16 > self.max_bytes:
            return None
        live = self._live
        if live is not None and mirror_policy not in live:
            return None
        if self._entries >= self.max_entries or self.held + cost > self.max_bytes:
            self.clear()
        kept = self._kept.get(mirror_policy)
        if kept is None:
            kept = self._kept[mirror_policy] = _Kept()
        self.held += cost
        kept.held += cost
        self._entries += 1
        return kept

    def resolver(self, mirror_policy: policy.Policy) -> Callable[[str], policy.Resolution]:
        """:meth:`policy.Policy.resolve` for ``mirror_policy``, answered from the cache."""
        kept_for = self._kept

        def resolve(image: str) -> policy.Resolution:
            kept = kept_for.get(mirror_policy)
            found = kept.resolutions.get(image) if kept is not None else None
            if found is None:
                found = mirror_policy.resolve(image)
                # Kept at the cost of three copies of the image: as written,
                # rewritten, and in the parsed parts. A longer one cannot be valid.
                if len(image) <= policy.REFERENCE_LENGTH_MAX:
                    room = self._room(mirror_policy, 3 * len(image) + 3 * ENTRY_OVERHEAD)
                    if room is not None:
                        room.resolutions[image] = found
            return found

        return resolve

    def admitted(
        self,
        pod: Mapping[str, object],
        *,
        namespace: str,
        mirror_policy: policy.Policy,
        health: policy.Health,
        namespace_labels: Mapping[str, str] | None = None,
    ) -> Admitted:
        """The CREATE plan for ``pod``: kept by its shape, or planned (and kept if it may be).

        ``namespace_labels`` count only through the credentials their
        ``namespaceSelector`` grants: the key holds those, not the labels.
        """
        shape = policy.shape_key(pod, namespace, health)
        key = (
            None
            if shape is None
            else (shape, mirror_policy.label_grants(namespace_labels))
            if mirror_policy.has_selectors
            else (shape, None)
        )
        if key is not None:
            kept = self._kept.get(mirror_policy)
            found = kept.admitted.get(key) if kept is not None else None
            if found is not None:
                return found
        made = Admitted(
            policy.plan(
                pod,
                namespace=namespace,
                mirror_policy=mirror_policy,
                health=health,
                resolve=self.resolver(mirror_policy),
                namespace_labels=namespace_labels,
            )
        )
        if key is not None and shape is not None:
            cost = _cost(shape, made.plan)
            room = None if cost is None else self._room(mirror_policy, cost)
            if room is not None:
                room.admitted[key] = made
        return made
