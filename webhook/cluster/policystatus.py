"""Each policy object's status, written by the leader: whether the replicas serve it, and why not.

Every replica composes the same objects (:mod:`.policyobjects`); only the leader writes
what came of it, so that replicas never race on a status. For each ClusterMirrorPolicy
and MirrorPolicy it sets ``status.observedGeneration`` and one condition, ``Accepted``:
``True`` (reason ``Accepted``) while its rules apply, ``False`` with the reason and every
problem, one per line with its field path, while none of them do (a conflict, a
credential not granted to the namespace, a fixed rule, an invalid spec). A verdict can
change without the object changing: a grant revoked in a ClusterMirrorPolicy turns a
MirrorPolicy ``Accepted=False``, and its rules stop applying with the composition that
says so.

A status is written only when it differs from the stored one (the informers hold it),
through the status subresource (a merge patch: mirrorgate's RBAC has ``patch`` on
``*/status`` and nothing on the objects themselves). A leader that takes over, or a
write that failed, writes on its next pass: every :attr:`PolicyStatus.INTERVAL` seconds
at the latest.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from mirrorgate import policy
from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.policyobjects import FILE_KEY, Composed
from mirrorgate.webhook.logs import logger

__all__ = ["CONDITION", "MESSAGE_MAX", "PolicyStatus", "status_of", "status_path"]

CONDITION = "Accepted"
MESSAGE_MAX = 32768
"""Characters of a condition's message (metav1.Condition's own limit)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_path(key: policy.ObjectKey) -> str:
    base = f"/apis/{policy.API_VERSION}"
    if key.namespace is None:
        return f"{base}/clustermirrorpolicies/{quote(key.name)}/status"
    return f"{base}/namespaces/{quote(key.namespace)}/mirrorpolicies/{quote(key.name)}/status"


def _condition(status: dict[str, Any]) -> dict[str, Any]:
    found = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    return next((c for c in found if c.get("type") == CONDITION), {})


def status_of(verdict: policy.Verdict, stored: dict[str, Any]) -> dict[str, Any] | None:
    """The status ``stored`` should have for ``verdict``; None when it has it already."""
    found = stored.get("status")
    current: dict[str, Any] = found if isinstance(found, dict) else {}
    generation = verdict.observed_generation
    if (stored.get("metadata") or {}).get("generation", generation) != generation:
        return None  # changed since it was judged: the next composition judges it
    message = verdict.message[:MESSAGE_MAX] if not verdict.accepted else "served by mirrorgate"
    wanted = {
        "type": CONDITION,
        "status": "True" if verdict.accepted else "False",
        "reason": verdict.reason,
        "message": message,
        "observedGeneration": generation,
    }
    condition = _condition(current)
    if current.get("observedGeneration") == generation and all(
        condition.get(k) == v for k, v in wanted.items()
    ):
        return None
    same = condition.get("status") == wanted["status"] and condition.get("lastTransitionTime")
    wanted["lastTransitionTime"] = condition["lastTransitionTime"] if same else _now()
    return {"observedGeneration": generation, "conditions": [wanted]}


class PolicyStatus(Loop):
    INTERVAL = 30.0
    """Seconds between passes without news (a new leader's first pass comes within it)."""

    def __init__(
        self,
        client: kube.Kube,
        *,
        is_leader: Callable[[], bool],
        stored: Callable[[policy.ObjectKey], dict[str, Any] | None],
    ) -> None:
        super().__init__("policy-status", stop_timeout=5.0)
        self.client, self.is_leader, self._stored = client, is_leader, stored
        """``stored`` looks an object up as the informers hold it now (status included)."""
        self._composed: Composed | None = None

    def composed(self, composed: Composed) -> None:
        """PolicyObjects' subscriber: a new composition to report."""
        self._composed = composed
        self.trigger()

    def write(self, composed: Composed) -> int:
        """Write every status that differs; how many were written."""
        written = 0
        for key, verdict in composed.verdicts.items():
            stored = None if key == FILE_KEY else self._stored(key)
            if stored is None:
                continue
            status = status_of(verdict, stored)
            if status is None:
                continue
            try:
                self.client.patch(status_path(key), {"status": status})
            except kube.NotFound:
                continue  # deleted meanwhile
            written += 1
            if not verdict.accepted:
                logger.warning(
                    "policy object refused",
                    extra={
                        "fields": {
                            "object": str(key),
                            "reason": verdict.reason,
                            "message": verdict.message,
                        }
                    },
                )
        return written

    def _run(self) -> None:
        while not self.stopping:
            self.sleep(self.INTERVAL)
            composed = self._composed
            if self.stopping or composed is None or not self.is_leader():
                continue
            try:
                self.write(composed)
            except kube.KubeError as error:
                logger.warning(
                    "cannot write the policy objects' status",
                    extra={"fields": {"error": str(error)}},
                )
