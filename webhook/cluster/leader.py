"""One replica at a time: a coordination.k8s.io Lease held by whoever renews it.

Rotation and clean-up touch every namespace; with two replicas doing it at
once they would race and double the API traffic. Admission itself needs no
leader: its create-then-compare writes are safe from any replica.
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
from typing import Any

from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.logs import logger

__all__ = ["LeaderElector"]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _format(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # MicroTime


def _parse(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return datetime.datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    except ValueError:
        try:
            return datetime.datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z")
        except ValueError:
            return None


class LeaderElector(Loop):
    def __init__(
        self,
        client: kube.Kube,
        *,
        namespace: str,
        name: str = "mirrorgate-reconciler",
        lease_seconds: int = 15,
        renew_every: float = 5.0,
        identity: str | None = None,
    ) -> None:
        # Stopping hands the Lease back, so another replica takes over at once:
        # waited for, a few seconds at most.
        super().__init__("leader", stop_timeout=3.0)
        self.client, self.namespace, self.name = client, namespace, name
        self.lease_seconds, self.renew_every = lease_seconds, renew_every
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.leading = False

    def is_leader(self) -> bool:
        return self.leading

    def _spec(self, acquired: str | None, transitions: int) -> dict[str, Any]:
        now = _format(_now())
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "acquireTime": acquired or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def try_acquire(self) -> bool:
        path = kube.leases_path(self.namespace, self.name)
        try:
            lease = self.client.get(path)
        except kube.NotFound:
            try:
                self.client.create(
                    kube.leases_path(self.namespace),
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": self._spec(None, 0),
                    },
                )
                return True
            except kube.AlreadyExists:
                return False
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime"))
        duration = spec.get("leaseDurationSeconds") or self.lease_seconds
        expired = renewed is None or (_now() - renewed).total_seconds() > duration
        if holder not in (None, "", self.identity) and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        acquired = spec.get("acquireTime") if holder == self.identity else None
        lease["spec"] = self._spec(acquired, transitions)
        try:
            self.client.replace(path, lease)  # carries resourceVersion: one winner
        except kube.Conflict:
            return False
        return True

    def _run(self) -> None:
        while not self.stopping:
            try:
                leading = self.try_acquire()
            except kube.KubeError as error:
                leading = False
                logger.warning("lease renewal failed", extra={"fields": {"error": str(error)}})
            except Exception:
                leading = False
                logger.exception("lease renewal crashed", extra={"fields": {}})
            if leading != self.leading:
                logger.info(
                    "leadership changed",
                    extra={"fields": {"leading": leading, "identity": self.identity}},
                )
            self.leading = leading
            self.pause(self.renew_every)
        if self.leading:
            self._release()

    def _release(self) -> None:
        try:
            path = kube.leases_path(self.namespace, self.name)
            lease = self.client.get(path)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                self.client.replace(path, lease)
        except kube.KubeError:
            pass  # the lease expires by itself
        self.leading = False
