"""mirrorgate's own record of the pull secrets it made, kept in its own namespace.

mirrorgate may not read Secrets outside its namespace (see the RBAC in
``manifests/base/rbac.yaml``), so it cannot look at a copy to tell whether it
made it, or whether it is current. It remembers instead: one ConfigMap per
copy, ``copy.<namespace>.<secret>``, holding the copy's uid (the proof that
the object there is the one mirrorgate created: every update and delete
carries it as a precondition) and the keyed fingerprint of the contents it
wrote (no credential material). An informer keeps them all in memory.

A record is made *before* its Secret, as a claim: creating the ConfigMap is
what decides, between replicas, who creates the Secret. A claim without a
uid is a creation in progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.informer import Informer
from mirrorgate.webhook.credentials.kubestore import MANAGED_BY_LABEL

__all__ = ["RECORD_LABEL", "Record", "Records"]

RECORD_LABEL = "mirrorgate.io/record"
_KIND = "pull-secret"


@dataclasses.dataclass(frozen=True)
class Record:
    namespace: str
    secret: str
    credential: str
    uid: str
    """The uid of the Secret mirrorgate created; "" while the claim is in progress."""
    fingerprint: str
    """The keyed fingerprint of the contents last written; "" while claimed."""
    created: str
    """The record's creationTimestamp (RFC 3339), to find claims abandoned by a crash."""
    object_uid: str
    resource_version: str

    @property
    def name(self) -> str:
        return record_name(self.namespace, self.secret)


def record_name(namespace: str, secret: str) -> str:
    # Namespace names are DNS labels (no dots), so the name is unambiguous.
    return f"copy.{namespace}.{secret}"


def _record(obj: dict[str, Any]) -> Record | None:
    data = obj.get("data") or {}
    metadata = obj.get("metadata") or {}
    fields = [data.get(k) for k in ("namespace", "secret", "credential", "uid", "fingerprint")]
    namespace, secret, credential, uid, fingerprint = (
        f if isinstance(f, str) else "" for f in fields
    )
    if not (namespace and secret and credential):
        return None  # not a record mirrorgate wrote: ignored
    return Record(
        namespace=namespace,
        secret=secret,
        credential=credential,
        uid=uid,
        fingerprint=fingerprint,
        created=str(metadata.get("creationTimestamp", "")),
        object_uid=str(metadata.get("uid", "")),
        resource_version=str(metadata.get("resourceVersion", "")),
    )


class Records:
    def __init__(self, client: kube.Kube, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.informer = Informer(
            client,
            kube.configmaps_path(namespace),
            name="pull-secret-records",
            label_selector=f"{RECORD_LABEL}={_KIND}",
        )

    def get(self, namespace: str, secret: str) -> Record | None:
        """Memory only."""
        found = self.informer.items.get((self.namespace, record_name(namespace, secret)))
        return _record(found) if found is not None else None

    def holds(self, namespace: str, secret: str, fingerprint: str) -> bool:
        """Whether the copy was made and last written with ``fingerprint`` (memory only).

        On every admission that needs a pull secret: reads the cached object as is.
        """
        found = self.informer.items.get((self.namespace, record_name(namespace, secret)))
        data = (found or {}).get("data") or {}
        return bool(data.get("uid")) and data.get("fingerprint") == fingerprint

    def all(self) -> list[Record]:
        return [r for r in map(_record, list(self.informer.items.values())) if r is not None]

    def _body(self, record: Record) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": record.name,
            "namespace": self.namespace,
            "labels": {MANAGED_BY_LABEL: "mirrorgate", RECORD_LABEL: _KIND},
        }
        if record.resource_version:
            metadata |= {"resourceVersion": record.resource_version, "uid": record.object_uid}
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {
                "namespace": record.namespace,
                "secret": record.secret,
                "credential": record.credential,
                "uid": record.uid,
                "fingerprint": record.fingerprint,
            },
        }

    def _keep(self, obj: dict[str, Any]) -> Record:
        """Remember what the API answered at once, not only when the watch brings it."""
        self.informer.items[(self.namespace, obj["metadata"]["name"])] = obj
        record = _record(obj)
        assert record is not None  # we wrote it
        return record

    def claim(self, namespace: str, secret: str, credential: str, *, timeout: float) -> Record:
        """Create the record of a copy about to be made; AlreadyExists when someone else has."""
        blank = Record(namespace, secret, credential, "", "", "", "", "")
        return self._keep(
            self.client.create(
                kube.configmaps_path(self.namespace), self._body(blank), timeout=timeout
            )
        )

    def fetch(self, namespace: str, secret: str, *, timeout: float) -> Record | None:
        """Read one record from the API (a claim another replica may be completing)."""
        try:
            obj = self.client.get(
                kube.configmaps_path(self.namespace, record_name(namespace, secret)),
                timeout=timeout,
            )
        except kube.NotFound:
            return None
        return self._keep(obj)

    def complete(
        self, record: Record, *, uid: str, fingerprint: str, timeout: float | None = None
    ) -> Record:
        """Record what was written; Conflict when the record changed since it was read."""
        done = dataclasses.replace(record, uid=uid, fingerprint=fingerprint)
        return self._keep(
            self.client.replace(
                kube.configmaps_path(self.namespace, record.name), self._body(done), timeout=timeout
            )
        )

    def drop(self, record: Record, *, timeout: float | None = None) -> None:
        """Forget a copy (or release a claim): only this very record, by its uid."""
        # Already gone, or replaced by a newer claim that is not ours to drop.
        with contextlib.suppress(kube.NotFound, kube.Conflict):
            self.client.delete(
                kube.configmaps_path(self.namespace, record.name),
                uid=record.object_uid,
                timeout=timeout,
            )
        self.informer.items.pop((self.namespace, record.name), None)
