"""Generated pull secrets: made before the Pod is admitted, rotated, and cleaned up.

For a Pod that needs credential C in namespace N, the Secret ``mirrorgate-C``
in N holds only C's registry login. Admission asks :meth:`missing` (memory
only: an informer over every generated Secret) and calls :meth:`ensure` only
for the few that are absent or stale. ``ensure`` creates first and compares on
"already exists" (no check-then-create race between replicas), updates with
the resourceVersion it read (no lost updates), and never touches a Secret of
that name that mirrorgate did not create.

The :class:`Reconciler` keeps the copies in step with the store and the policy
(rotation, clean-up); it runs in one replica at a time, the Lease holder.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import policy
from webhook import kube
from webhook.credentials import Credential, CredentialStore
from webhook.informer import Informer, Key
from webhook.kubestore import MANAGED_BY_LABEL, MANAGED_BY_SELECTOR
from webhook.logs import logger

__all__ = ["CREDENTIAL_LABEL", "HASH_ANNOTATION", "MODE_LABEL", "PullSecretProvisioner",
           "Reconciler"]

CREDENTIAL_LABEL = "mirrorgate.io/credential"
HASH_ANNOTATION = "mirrorgate.io/content-hash"
MODE_LABEL = "mirrorgate.io/mode"
OPTED_IN_MODES = frozenset({"enforce", "audit"})


class EnsureError(Exception):
    """One pull secret could not be made current; the message says why (no data)."""


def secret_body(namespace: str, credential: Credential) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {
            "name": policy.pull_secret_name(credential.name), "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: "mirrorgate", CREDENTIAL_LABEL: credential.name},
            "annotations": {HASH_ANNOTATION: credential.content_hash()},
        },
        "data": {".dockerconfigjson": base64.b64encode(credential.dockerconfigjson()).decode()},
    }


def _metadata_of(secret: Mapping[str, Any]) -> dict[str, Any]:
    """What the cache keeps of a Secret we wrote: its metadata, as the informer does."""
    return {"metadata": secret.get("metadata") or {}}


def _is_ours(secret: Mapping[str, Any]) -> bool:
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) == "mirrorgate"


def _hash_of(secret: Mapping[str, Any]) -> str | None:
    value = ((secret.get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION)
    return value if isinstance(value, str) else None


def _describe(error: kube.KubeError) -> str:
    if isinstance(error, kube.Forbidden):
        return f"forbidden by RBAC: {error.message}"
    if isinstance(error, kube.Unavailable):
        return f"Kubernetes API unavailable: {error.message}"
    return str(error)


class PullSecretProvisioner:
    """The :class:`webhook.admission.PullSecrets` implementation against the real API."""

    def __init__(self, client: kube.Kube, store: CredentialStore, *,
                 deadline: float = 2.0, counter: Callable[[str], Any] | None = None) -> None:
        self.client = client
        self.store = store
        self.deadline = deadline
        """Seconds ensure() may take in all: well inside the webhook's timeoutSeconds."""
        self.count = counter or (lambda action: None)
        # Metadata only: the content hash annotation says whether a copy is
        # current, so the data of every generated Secret never needs to be here.
        self.generated = Informer(client, kube.secrets_path(), name="generated-secrets",
                                  label_selector=MANAGED_BY_SELECTOR, metadata_only=True)

    def start(self) -> None:
        self.generated.start()

    def problem(self) -> str | None:
        return self.generated.problem() or self.store.problem()

    def _current(self, namespace: str, credential: str) -> bool:
        wanted = self.store.snapshot().get(credential)
        found = self.generated.items.get((namespace, policy.pull_secret_name(credential)))
        return wanted is not None and found is not None \
            and _hash_of(found) == wanted.content_hash()

    def missing(self, namespace: str, credentials: Sequence[str]) -> list[str]:
        return [c for c in credentials if not self._current(namespace, c)]

    async def ensure(self, namespace: str, credentials: Sequence[str]) -> dict[str, str]:
        done: set[str] = set()
        failures: dict[str, str] = {}
        started = time.monotonic()

        def work() -> None:
            for credential in credentials:
                remaining = self.deadline - (time.monotonic() - started)
                if remaining <= 0:
                    return
                try:
                    self.ensure_one(namespace, credential, timeout=remaining)
                except EnsureError as error:
                    failures[credential] = str(error)
                # Only after the outcome is recorded: a credential the deadline
                # catches half-way counts as failed, never as done.
                done.add(credential)

        # On timeout the thread finishes its current call in the background.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(work), timeout=self.deadline)
        timed_out = f"no answer from the Kubernetes API within {self.deadline:g}s"
        failures = {**failures, **{c: timed_out for c in credentials if c not in done}}
        for _ in failures:
            self.count("failed")
        return failures

    def ensure_one(self, namespace: str, name: str, *, timeout: float | None = None) -> None:
        """Create or update ``mirrorgate-<name>`` in ``namespace``; EnsureError says why not."""
        credential = self.store.snapshot().get(name)
        if credential is None:
            raise EnsureError(f"credential {name!r} is not in the credential store")
        body = secret_body(namespace, credential)
        secret_name = body["metadata"]["name"]
        path = kube.secrets_path(namespace)
        try:
            try:
                created = self.client.create(path, body, timeout=timeout)
                self.generated.items[(namespace, secret_name)] = _metadata_of(created)
                self.count("created")
                return
            except kube.AlreadyExists:
                pass
            for _ in range(3):  # another replica may be updating it at the same moment
                existing = self.client.get(kube.secrets_path(namespace, secret_name))
                if not _is_ours(existing):
                    raise EnsureError(f"Secret {namespace}/{secret_name} exists and was not "
                                      "created by mirrorgate; it is left alone")
                if _hash_of(existing) == credential.content_hash():
                    self.generated.items[(namespace, secret_name)] = _metadata_of(existing)
                    return
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                try:
                    updated = self.client.replace(kube.secrets_path(namespace, secret_name),
                                                  body, timeout=timeout)
                except kube.Conflict:
                    continue
                self.generated.items[(namespace, secret_name)] = _metadata_of(updated)
                self.count("updated")
                return
            raise EnsureError(f"Secret {namespace}/{secret_name} kept changing under us")
        except kube.KubeError as error:
            raise EnsureError(_describe(error)) from None


class Reconciler:
    """Rotation and clean-up of every generated Secret, run by the Lease holder only."""

    def __init__(self, provisioner: PullSecretProvisioner, client: kube.Kube, *,
                 rules: Callable[[], policy.Policy], is_leader: Callable[[], bool],
                 interval: float = 30.0) -> None:
        self.provisioner = provisioner
        self.client = client
        self.rules = rules
        self.is_leader = is_leader
        self.interval = interval
        self.namespaces = Informer(client, kube.namespaces_path(), name="namespaces",
                                   on_change=lambda kind, obj: self.trigger())
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        provisioner.store.subscribe(self.trigger)

    def start(self) -> None:
        self.namespaces.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.namespaces.stop()

    def trigger(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if not self.is_leader() or not self.namespaces.synced.is_set() \
                    or not self.provisioner.generated.synced.is_set():
                continue
            try:
                self.reconcile_once()
            except Exception:
                logger.exception("reconcile failed", extra={"fields": {}})

    def _wanted(self, namespace: str, credential: str) -> str | None:
        """None when the copy should exist, else why it should go."""
        ns = self.namespaces.items.get(("", namespace))
        if ns is None:
            return "namespace is gone"
        labels = (ns.get("metadata") or {}).get("labels") or {}
        if labels.get(MODE_LABEL) not in OPTED_IN_MODES:
            return f"namespace no longer has the {MODE_LABEL} label"
        rules = self.rules()
        if rules.is_namespace_excluded(namespace):
            return "namespace is excluded by the policy"
        if not rules.is_granted(credential, namespace):
            return "the policy no longer grants the credential to the namespace"
        if credential not in self.provisioner.store.snapshot():
            return "the credential is no longer in the store"
        return None

    def reconcile_once(self) -> dict[str, int]:
        counts = {"updated": 0, "deleted": 0, "failed": 0}
        store = self.provisioner.store.snapshot()
        items: list[tuple[Key, dict[str, Any]]] = list(self.provisioner.generated.items.items())
        for (namespace, name), secret in items:
            metadata = secret.get("metadata") or {}
            credential = (metadata.get("labels") or {}).get(CREDENTIAL_LABEL, "")
            why = self._wanted(namespace, credential)
            try:
                if why is not None:
                    if why == "namespace is gone":
                        continue  # deleting the namespace deletes its Secrets
                    self.client.delete(kube.secrets_path(namespace, name),
                                       uid=metadata.get("uid"))
                    self.provisioner.generated.items.pop((namespace, name), None)
                    counts["deleted"] += 1
                    self.provisioner.count("deleted")
                    logger.info("pull secret removed", extra={"fields": {
                        "secret": f"{namespace}/{name}", "reason": why}})
                elif _hash_of(secret) != store[credential].content_hash():
                    self.provisioner.ensure_one(namespace, credential)
                    counts["updated"] += 1
                    logger.info("pull secret rotated", extra={"fields": {
                        "secret": f"{namespace}/{name}"}})
            except kube.NotFound:
                self.provisioner.generated.items.pop((namespace, name), None)
            except (kube.KubeError, EnsureError) as error:
                counts["failed"] += 1
                logger.warning("pull secret reconcile failed", extra={"fields": {
                    "secret": f"{namespace}/{name}", "error": str(error)}})
        return counts
