"""The policy's state where operators look, and the last policy this deployment accepted.

Every replica that loads a policy keeps a copy of it in ConfigMap
:data:`ACCEPTED` of its namespace (written only when it changed). A replica
that (re)starts on a policy it must refuse (one written while the webhook
``policy.mirrorgate.io`` was not in the way) serves that copy instead of
exiting, so a drain or a rollout never turns a refused policy into a crash
loop. A refused policy is also reported as a Warning Event on the policy
object (the ConfigMap labelled ``mirrorgate.io/policy=true``), naming its
errors, besides /readyz and the logs.

The writes run on a :class:`~webhook.background.Loop`: policy reloads happen
on the event loop, which must not wait for the API server.
"""

from __future__ import annotations

import datetime
import functools
import threading
from collections.abc import Callable
from typing import Any

from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.logs import logger
from mirrorgate.webhook.policyreview import POLICY_KEY, POLICY_LABEL

__all__ = ["ACCEPTED", "DEPRECATED", "DEPRECATION", "REJECTED", "PolicyState"]

ACCEPTED = "mirrorgate-policy-accepted"
REJECTED = "PolicyRejected"
DEPRECATED = "PolicyConfigMapDeprecated"
"""The reasons of the Warning Events on the policy ConfigMap (mirrorgate-writes allows
these and no others there)."""
DEPRECATION = (
    "the ConfigMap policy is deprecated and served for one minor version more; "
    "`mirrorgate policy migrate` prints it as a ClusterMirrorPolicy (docs/upgrading.md)"
)
ACCEPTED_LABEL_VALUE = "accepted"
"""The copy's :data:`POLICY_LABEL` value ("true" marks the policy itself, whose
refusals are reported on it)."""
VERSION_ANNOTATION = "mirrorgate.io/policy-version"
EVENT_MESSAGE_MAX = 1024
"""Characters of an Event's message (the API server's own limit for events.k8s.io notes)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PolicyState(Loop):
    RETRY = 10.0
    """Seconds before a failed write of the accepted policy is tried again."""
    REFUSALS_KEPT = 8
    """Refusals waiting to be reported, at most (the newest are kept)."""

    def __init__(self, client: kube.Kube, namespace: str) -> None:
        super().__init__("policy-state")
        self.client, self.namespace = client, namespace
        self._lock = threading.Lock()
        self._accepted: tuple[bytes, str] | None = None
        self._refusals: list[tuple[str, str]] = []  # (reason, message) of Events to write

    def load_accepted(self) -> bytes | None:
        """The last accepted policy's bytes; None when there is none (or it cannot be read)."""
        try:
            found = self.client.get(kube.configmaps_path(self.namespace, ACCEPTED))
        except kube.KubeError as error:
            if not isinstance(error, kube.NotFound):
                logger.warning(
                    "cannot read the last accepted policy",
                    extra={
                        "fields": {"configmap": f"{self.namespace}/{ACCEPTED}", "error": str(error)}
                    },
                )
            return None
        text = (found.get("data") or {}).get(POLICY_KEY)
        return text.encode() if isinstance(text, str) else None

    def accepted(self, data: bytes, version: str) -> None:
        """Keep ``data`` as the last accepted policy (in the background)."""
        with self._lock:
            self._accepted = (data, version)
        self.trigger()

    def rejected(self, error: str, *, serving: str) -> None:
        """Report a refused policy as an Event on the policy object (in the background)."""
        self._event(REJECTED, f"serving policy {serving}; refused {error}")

    def deprecated(self, path: str) -> None:
        """Report that the policy is served from a ConfigMap, as a Warning Event on it (in
        the background): the ConfigMap policy is served for one minor version more."""
        self._event(DEPRECATED, f"{path}: {DEPRECATION}")

    def _event(self, reason: str, message: str) -> None:
        with self._lock:
            self._refusals = [*self._refusals, (reason, message)][-self.REFUSALS_KEPT :]
        self.trigger()

    def _run(self) -> None:
        while not self.stopping:
            with self._lock:
                accepted, self._accepted = self._accepted, None
                refusals, self._refusals = self._refusals, []
            wait = 3600.0
            for reason, message in refusals:  # reported once, at best
                self._attempt(functools.partial(self._report, reason, message))
            if accepted is not None and not self._attempt(functools.partial(self._save, *accepted)):
                with self._lock:  # unless a newer one came meanwhile, try it again
                    self._accepted = self._accepted or accepted
                wait = self.RETRY
            self.sleep(wait)

    @staticmethod
    def _attempt(write: Callable[[], None]) -> bool:
        try:
            write()
        except (kube.KubeError, UnicodeDecodeError) as error:
            logger.warning(
                "cannot record the policy's state in the cluster",
                extra={"fields": {"error": str(error)}},
            )
            return False
        return True

    def _save(self, data: bytes, version: str) -> None:
        path = kube.configmaps_path(self.namespace, ACCEPTED)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": ACCEPTED,
                "namespace": self.namespace,
                "labels": {
                    kube.MANAGED_BY_LABEL: "mirrorgate",
                    "app.kubernetes.io/name": "mirrorgate",
                    # So that the webhook policy.mirrorgate.io judges it as it judges
                    # the policy (a copy a stolen token writes must load too), and the
                    # ValidatingAdmissionPolicy mirrorgate-writes requires it.
                    POLICY_LABEL: ACCEPTED_LABEL_VALUE,
                },
                "annotations": {VERSION_ANNOTATION: version},
            },
            "data": {POLICY_KEY: data.decode()},
        }
        try:
            current = self.client.get(path)
        except kube.NotFound:
            self.client.create(kube.configmaps_path(self.namespace), body)
        else:
            labels = (current.get("metadata") or {}).get("labels") or {}
            if (current.get("data") or {}).get(POLICY_KEY) == body["data"][POLICY_KEY] and (
                labels.get(POLICY_LABEL) == ACCEPTED_LABEL_VALUE  # an earlier version's lacks it
            ):
                return
            # No resourceVersion: whichever replica accepted a policy last is right.
            self.client.replace(path, body)
        logger.info(
            "accepted policy kept",
            extra={"fields": {"configmap": f"{self.namespace}/{ACCEPTED}", "version": version}},
        )

    def _report(self, reason: str, message: str) -> None:
        objects, _ = self.client.list(
            kube.configmaps_path(self.namespace), label_selector=f"{POLICY_LABEL}=true"
        )
        message = message[:EVENT_MESSAGE_MAX]
        for obj in objects:
            metadata = obj["metadata"]
            now = _now()
            self.client.create(
                kube.events_path(self.namespace),
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {
                        "generateName": f"{metadata['name']}.",
                        "namespace": self.namespace,
                    },
                    "involvedObject": {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": metadata["name"],
                        "namespace": self.namespace,
                        "uid": metadata.get("uid"),
                    },
                    "type": "Warning",
                    "reason": reason,
                    "message": message,
                    "source": {"component": "mirrorgate"},
                    "reportingComponent": "mirrorgate",
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "count": 1,
                },
            )
