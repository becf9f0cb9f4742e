"""Which namespaces opted in, as mirrorgate itself sees them (not as a review claims).

A review names its namespace, and anything that reaches the webhook's port
can send one. Pull secrets are therefore made only in namespaces whose
``mirrorgate.io/mode=enforce`` label mirrorgate sees in its own Namespace
cache: an informer, so the check is a memory lookup. The same cache gives
the labels that ``credentials.<name>.namespaceSelector`` grants by: the
AdmissionReview of a Pod does not carry its namespace's labels.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from mirrorgate.policy import ENFORCE, MODE_LABEL, MODES
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.informer import Informer

__all__ = ["ENFORCE", "MODE_LABEL", "OPTED_IN_MODES", "NamespaceOptIn", "labels_of"]

OPTED_IN_MODES = frozenset(MODES)
_FIRST_POLL, _LONGEST_POLL = 0.001, 0.02


def labels_of(namespace: Mapping[str, Any]) -> dict[str, str]:
    """A Namespace object's labels, strings only: what ``namespaceSelector`` grants read,
    here and in `mirrorgate audit`, which reads the same objects from the API."""
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


class NamespaceOptIn:
    def __init__(self, client: kube.Kube) -> None:
        self._subscribers: list[Callable[[], Any]] = []
        self.informer = Informer(
            client,
            kube.namespaces_path(),
            name="namespaces",
            on_change=lambda kind, obj: self._changed(),
        )

    def subscribe(self, callback: Callable[[], Any]) -> None:
        """Call ``callback`` after every change of a namespace (opt-out clean-up)."""
        self._subscribers.append(callback)

    def _changed(self) -> None:
        for callback in self._subscribers:
            callback()

    def mode(self, namespace: str) -> str | None:
        """The namespace's mirrorgate.io/mode label; None when unlabelled or unknown."""
        found = self.informer.items.get(("", namespace))
        labels = ((found or {}).get("metadata") or {}).get("labels") or {}
        mode = labels.get(MODE_LABEL)
        return mode if isinstance(mode, str) else None

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels as the cache holds them; None before it has synced or for a
        namespace it does not hold (a review may name one that does not exist)."""
        if not self.informer.synced.is_set():
            return None
        found = self.informer.items.get(("", namespace))
        return None if found is None else labels_of(found)

    def all_labels(self) -> dict[str, Mapping[str, str]]:
        """Every namespace's labels as the cache holds them (what a composition of the
        policy objects grants MirrorPolicies by)."""
        return {name: labels_of(obj) for (_, name), obj in list(self.informer.items.items())}

    def exists(self, namespace: str) -> bool:
        return ("", namespace) in self.informer.items

    def enforced(self, namespace: str) -> bool:
        return self.mode(namespace) == ENFORCE

    async def wait_enforced(self, namespace: str, *, until: float) -> bool:
        """Whether the namespace is enforced, waiting until ``until`` (monotonic) for the cache.

        The API server calls the webhook once *its* cache shows the label; ours
        follows the same watch a moment later. Waiting reads memory only.
        """
        pause = _FIRST_POLL  # the watch event is usually about to arrive: look soon, then back off
        while not self.enforced(namespace):
            if time.monotonic() + pause >= until:
                return False
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LONGEST_POLL)
        return True
