"""Pull secrets' names held by Secrets mirrorgate did not make, reported where people look.

The prefix ``mirrorgate-`` is reserved: the ValidatingAdmissionPolicy
``mirrorgate-reserved-prefix`` refuses anyone else's create. A Secret made
before that policy was installed keeps its name all the same, and mirrorgate
never touches a Secret it did not make, so a Pod that needs that copy gets no
login from mirrorgate (``onCredentialError`` decides: skip leaves the image as
written, deny refuses the Pod). Each time a copy's name is found taken,
``mirrorgate_squatted_copies_total`` counts it, and a Warning Event (reason
:data:`REASON`) in that namespace, on that Secret, says so, at most once per
:data:`REPORT_EVERY` seconds for one name in one replica. The Pod does not
exist yet when this is found, so the Event cannot be on it. Events are written
in the background: admission never waits for them.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable

from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.logs import logger

__all__ = ["REASON", "SquatReporter"]

REASON = "PullSecretNameSquatted"
"""The Event's reason (one of the two that the ValidatingAdmissionPolicy
mirrorgate-writes lets mirrorgate create)."""
REPORT_EVERY = 600.0
PENDING_MAX = 256
"""Events waiting to be written, at most (more are counted, not reported)."""


def message(namespace: str, secret: str, credential: str) -> str:
    return (
        f"Secret {namespace}/{secret} was not made by mirrorgate, but holds the name of "
        f"credential {credential!r}'s pull secret (the prefix mirrorgate- is reserved): "
        "Pods here that need it get no login from mirrorgate. Delete or rename it."
    )


class SquatReporter(Loop):
    def __init__(
        self,
        client: kube.Kube,
        *,
        count: Callable[[], object],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__("squat-reporter")
        self.client, self.count, self.clock = client, count, clock
        self._lock = threading.Lock()
        self._reported: dict[tuple[str, str], float] = {}
        self._pending: list[tuple[str, str, str]] = []

    def squatted(self, namespace: str, secret: str, credential: str) -> None:
        """Count a copy's name found taken, and report it soon unless it was lately."""
        self.count()
        now = self.clock()
        with self._lock:
            last = self._reported.get((namespace, secret))
            if last is not None and now - last < REPORT_EVERY:
                return
            if len(self._pending) >= PENDING_MAX:
                return
            # Forget names not seen for a while: the map stays as small as the squatting.
            self._reported = {k: t for k, t in self._reported.items() if now - t < REPORT_EVERY}
            self._reported[(namespace, secret)] = now
            self._pending.append((namespace, secret, credential))
        self.trigger()

    def _run(self) -> None:
        while not self.stopping:
            with self._lock:
                pending, self._pending = self._pending, []
            for namespace, secret, credential in pending:
                try:
                    self._report(namespace, secret, credential)
                except kube.KubeError as error:
                    logger.warning(
                        "cannot report a squatted pull secret name",
                        extra={"fields": {"secret": f"{namespace}/{secret}", "error": str(error)}},
                    )
            self.sleep(3600.0)

    def _report(self, namespace: str, secret: str, credential: str) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.client.create(
            kube.events_path(namespace),
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{secret}.", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "name": secret,
                    "namespace": namespace,
                },
                "type": "Warning",
                "reason": REASON,
                "message": message(namespace, secret, credential),
                "source": {"component": "mirrorgate"},
                "reportingComponent": "mirrorgate",
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )
        logger.warning(
            "pull secret name squatted",
            extra={"fields": {"secret": f"{namespace}/{secret}", "credential": credential}},
        )
