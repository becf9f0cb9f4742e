"""The admission cache: the one owner of what admission keeps between requests.

The replicas of a workload reach admission as Pods of one shape
(:func:`policy.shape_key`), and Pods repeat the same few images. For the
policy in force, this cache keeps

* by (health, shape): the plan, and what admission derives from it alone (the
  encoded patch, audit mode's report), made once for every Pod of the shape;
* by image string: what the policy resolves it to (:meth:`policy.Policy.resolve`),
  for the Pods it plans.

Everything in it is charged against one budget: :data:`MAX_ENTRIES` entries
and an estimate of the bytes they hold, :data:`MAX_BYTES`. Passing either
empties the whole cache rather than growing it (a stream of unique images or
shapes costs a refill, never memory), and one entry costing more than a
sixteenth of the bytes is not kept at all: it would evict everything else for
one caller's benefit. A new policy empties it too: a cache never answers for
a policy other than the one it was filled under.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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


class AdmissionCache:
    """Plans by shape and resolutions by image, for one policy at a time (see the module)."""

    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.held = 0
        """Bytes charged for what is kept now."""
        self._policy: policy.Policy | None = None
        self._admitted: dict[tuple[policy.ShapeKey, frozenset[str] | None], Admitted] = {}
        self._resolutions: dict[str, policy.Resolution] = {}

    def __len__(self) -> int:
        return len(self._admitted) + len(self._resolutions)

    @property
    def shapes(self) -> int:
        """Shapes whose plan is kept."""
        return len(self._admitted)

    def resolved(self, image: str) -> bool:
        """Whether what ``image`` resolves to is kept."""
        return image in self._resolutions

    def clear(self) -> None:
        self._admitted.clear()
        self._resolutions.clear()
        self.held = 0

    def _make_room(self, cost: int) -> bool:
        """Make room for an entry of ``cost`` bytes and charge it; False if it is not kept."""
        if cost * 16 > self.max_bytes:
            return False
        if len(self) >= self.max_entries or self.held + cost > self.max_bytes:
            self.clear()
        self.held += cost
        return True

    def _for(self, mirror_policy: policy.Policy) -> None:
        if mirror_policy is not self._policy:
            self.clear()
            self._policy = mirror_policy

    def resolver(self, mirror_policy: policy.Policy) -> Callable[[str], policy.Resolution]:
        """:meth:`policy.Policy.resolve` for ``mirror_policy``, answered from the cache."""
        self._for(mirror_policy)
        kept = self._resolutions

        def resolve(image: str) -> policy.Resolution:
            found = kept.get(image)
            if found is None:
                found = mirror_policy.resolve(image)
                # Kept at the cost of three copies of the image: as written,
                # rewritten, and in the parsed parts. A longer one cannot be valid.
                if (
                    len(image) <= policy.REFERENCE_LENGTH_MAX
                    and self._policy is mirror_policy
                    and self._make_room(3 * len(image) + 3 * ENTRY_OVERHEAD)
                ):
                    kept[image] = found
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
        self._for(mirror_policy)
        shape = policy.shape_key(pod, namespace, health)
        key = (
            None
            if shape is None
            else (shape, mirror_policy.label_grants(namespace_labels))
            if mirror_policy.has_selectors
            else (shape, None)
        )
        if key is not None:
            found = self._admitted.get(key)
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
            if cost is not None and self._make_room(cost):
                self._admitted[key] = made
        return made
