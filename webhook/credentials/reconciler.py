"""The leader's upkeep of the generated pull secrets: rotation, healing and clean-up.

The :class:`Reconciler` keeps the copies in step with the store and the policy
(rotation, clean-up) and re-asserts every copy periodically, which brings back
a deleted one; it runs in one replica at a time, the Lease holder.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping

from mirrorgate import policy
from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.optin import MODE_LABEL, OPTED_IN_MODES
from mirrorgate.webhook.credentials.pullsecrets import (
    EnsureError,
    PullSecretProvisioner,
    is_abandoned,
)
from mirrorgate.webhook.credentials.records import Record
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.logs import logger

__all__ = ["REASSERT_PER_SECOND", "Reconciler"]

REASSERT_PER_SECOND = 20.0
"""Pace of the periodic re-assertion: at most this many Secret writes a second."""


class Reconciler(Loop):
    """Rotation, healing and clean-up of every generated Secret, run by the Lease holder only."""

    def __init__(
        self,
        provisioner: PullSecretProvisioner,
        client: kube.Kube,
        *,
        mirror_policy: Callable[[], policy.Policy],
        policy_problem: Callable[[], str | None],
        is_leader: Callable[[], bool],
        interval: float = 30.0,
    ) -> None:
        super().__init__("reconciler")
        self.provisioner = provisioner
        self.client = client
        self.mirror_policy = mirror_policy
        self.policy_problem = policy_problem
        """Why ``mirror_policy`` is not the cluster's yet (None: it is)."""
        self.is_leader = is_leader
        self.interval = interval
        """Seconds between passes; every periodic pass re-asserts every copy (the heal bound)."""
        provisioner.store.subscribe(self.trigger)
        provisioner.optin.subscribe(self.trigger)

    def _ready(self) -> bool:
        # Nothing before the policy and the store are read: the policy served until the
        # objects are composed grants nothing, and a store not listed yet holds no
        # credential, so a pass would take every copy for unwanted and delete it. A
        # replica can lead before then: one that takes the Lease as it starts (an old
        # leader stopping in a rollout, a whole Deployment starting at once).
        return (
            self.is_leader()
            and self.provisioner.optin.informer.synced.is_set()
            and self.provisioner.records.informer.synced.is_set()
            and self.provisioner.store.problem() is None
            and self.policy_problem() is None
        )

    def _run(self) -> None:
        # The re-assertion is due by the clock, not by a quiet interval: triggers (a
        # provider's login refreshed more often than the interval, namespaces coming
        # and going) must not put it off for ever, or a deleted copy would never be healed.
        due = time.monotonic() + self.interval
        while not self.stopping:
            self.sleep(max(0.0, due - time.monotonic()))
            if self.stopping:
                return
            self.provisioner.record_unrecorded()  # this replica's own, leader or not
            reassert = time.monotonic() >= due
            if reassert:
                due = time.monotonic() + self.interval
            if not self._ready():
                continue
            try:
                self.reconcile_once(reassert=reassert)
            except Exception:
                logger.exception("reconcile failed", extra={"fields": {}})

    def _why_unwanted(
        self, namespace: str, credential: str, stored: Mapping[str, Credential]
    ) -> str | None:
        """None when the copy should exist, else why it should go; ``stored`` is the
        store's snapshot the caller goes on to use."""
        optin = self.provisioner.optin
        if not optin.exists(namespace):
            return "namespace is gone"
        if optin.mode(namespace) not in OPTED_IN_MODES:
            return f"namespace no longer has the {MODE_LABEL} label"
        mirror_policy = self.mirror_policy()
        if mirror_policy.is_namespace_excluded(namespace):
            return "namespace is excluded by the policy"
        if not mirror_policy.is_granted(credential, namespace, optin.labels(namespace)):
            return "the policy no longer grants the credential to the namespace"
        grant = mirror_policy.grants.get(credential)
        if grant is not None and not grant.pull_secret:
            # The kubelet's plugin fetches it now: a copy would only be a login to read.
            return "the credential's delivery is kubelet"
        if credential not in stored:
            return "the credential is no longer in the store"
        return None

    def _remove(self, record: Record, why: str) -> None:
        records = self.provisioner.records
        if why != "namespace is gone":  # deleting the namespace deletes its Secrets
            with contextlib.suppress(kube.NotFound, kube.Conflict):  # gone, or not ours
                self.client.delete(
                    kube.secrets_path(record.namespace, record.secret), uid=record.uid
                )
            self.provisioner.count("deleted")
            logger.info(
                "pull secret removed",
                extra={"fields": {"secret": f"{record.namespace}/{record.secret}", "reason": why}},
            )
        records.drop(record)

    def reconcile_once(self, *, reassert: bool = False) -> dict[str, int]:
        """Removals and rotations at once; with ``reassert``, then every copy written again.

        The re-assertion is paced, so with many copies it is long: a rotation or
        an opt-out that arrives meanwhile is handled first, not after it.
        """
        counts = {"updated": 0, "restored": 0, "deleted": 0, "failed": 0}
        self._sweep(counts)
        if not reassert:
            return counts
        for record in self.provisioner.records.all():
            if self.stopping or not self.is_leader():
                break
            if self.take_trigger():
                self._sweep(counts)
            current = self.provisioner.records.get(record.namespace, record.secret)
            if (
                current is None
                or not current.uid
                or self._why_unwanted(
                    current.namespace, current.credential, self.provisioner.store.snapshot()
                )
                is not None
            ):
                continue  # gone, claimed, or going: the sweeps deal with it
            where = f"{current.namespace}/{current.secret}"
            try:
                if self.provisioner.reassert(current) == "created":
                    counts["restored"] += 1
                    logger.info("pull secret restored", extra={"fields": {"secret": where}})
            except (kube.KubeError, EnsureError) as error:
                self._failed(counts, where, error)
            self.pause(1 / REASSERT_PER_SECOND)
        return counts

    def _sweep(self, counts: dict[str, int]) -> None:
        """Abandoned claims, copies that should go, and copies that are stale."""
        fingerprints = self.provisioner.fingerprints
        for record in self.provisioner.records.all():
            if self.stopping or not self.is_leader():
                return
            where = f"{record.namespace}/{record.secret}"
            try:
                if not record.uid:
                    if is_abandoned(record):
                        self.provisioner.records.drop(record)
                        logger.warning(
                            "abandoned pull-secret claim dropped",
                            extra={"fields": {"secret": where}},
                        )
                    continue
                # The store as it is now, once for both questions: a snapshot taken for
                # the whole pass misses a credential added meanwhile, whose copy
                # admission may already have made.
                stored = self.provisioner.store.snapshot()
                why = self._why_unwanted(record.namespace, record.credential, stored)
                if why is not None:
                    self._remove(record, why)
                    counts["deleted"] += 1
                elif record.fingerprint != fingerprints.of(stored[record.credential]):
                    self.provisioner.reassert(record)
                    counts["updated"] += 1
                    logger.info("pull secret rotated", extra={"fields": {"secret": where}})
            except (kube.KubeError, EnsureError) as error:
                self._failed(counts, where, error)

    @staticmethod
    def _failed(counts: dict[str, int], where: str, error: Exception) -> None:
        counts["failed"] += 1
        logger.warning(
            "pull secret reconcile failed", extra={"fields": {"secret": where, "error": str(error)}}
        )
