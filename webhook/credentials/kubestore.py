"""The Kubernetes credential store: ordinary docker-registry Secrets in mirrorgate's namespace.

Exactly what ``kubectl create secret docker-registry NAME --docker-server=...
--docker-username=... --docker-password=...`` makes; the credential's name is
the Secret's name. Read through an informer, so a rotation is seen within
seconds and no admission reads the API.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import threading
from collections.abc import Callable, Mapping
from typing import Any

from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.informer import Informer
from mirrorgate.webhook.credentials.store import Credential, StoreError, from_dockerconfigjson
from mirrorgate.webhook.logs import logger

__all__ = [
    "EXPIRES_ANNOTATION",
    "MANAGED_BY_SELECTOR",
    "KubernetesCredentialStore",
    "credential_from_secret",
    "parse_expiry",
    "secret_from_credential",
]

DOCKERCONFIGJSON = "kubernetes.io/dockerconfigjson"
MANAGED_BY_LABEL = kube.MANAGED_BY_LABEL
MANAGED_BY_SELECTOR = f"{MANAGED_BY_LABEL}=mirrorgate"
EXPIRES_ANNOTATION = "mirrorgate.io/expires"
"""RFC 3339: when a short-lived login stops working (written by the provider refresher)."""


def parse_expiry(text: str, *, where: str) -> datetime.datetime:
    """An RFC 3339 time with its offset; StoreError naming ``where`` otherwise."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise StoreError(f"{where}: {text[:40]!r} is not an RFC 3339 time with an offset")
    return moment


class KubernetesCredentialStore:
    def __init__(self, client: kube.Kube, namespace: str) -> None:
        self.namespace = namespace
        self._credentials: dict[str, Credential] = {}
        self._invalid: dict[str, str] = {}
        self._subscribers: list[Callable[[], Any]] = []
        self._lock = threading.Lock()
        # Our own generated copies never count as central credentials.
        self.informer = Informer(
            client,
            kube.secrets_path(namespace),
            name="credential-store",
            label_selector=f"{MANAGED_BY_LABEL}!=mirrorgate",
            on_change=self._changed,
        )

    def __repr__(self) -> str:
        return f"KubernetesCredentialStore(namespace={self.namespace!r})"

    def start(self) -> None:
        self.informer.start()

    def snapshot(self) -> Mapping[str, Credential]:
        return self._credentials

    def problem(self) -> str | None:
        return self.informer.problem()

    def subscribe(self, callback: Callable[[], Any]) -> None:
        self._subscribers.append(callback)

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            credentials, invalid = self._read_all()
            changed = credentials != self._credentials
            self._credentials = credentials
            for name, why in invalid.items():
                if self._invalid.get(name) != why:
                    logger.warning(
                        "ignoring a Secret of the credential store",
                        extra={"fields": {"secret": f"{self.namespace}/{name}", "reason": why}},
                    )
            self._invalid = invalid
        if changed:
            for callback in self._subscribers:
                callback()

    def _read_all(self) -> tuple[dict[str, Credential], dict[str, str]]:
        credentials: dict[str, Credential] = {}
        invalid: dict[str, str] = {}
        for (_, name), secret in list(self.informer.items.items()):
            if secret.get("type") != DOCKERCONFIGJSON:
                continue
            try:
                credentials[name] = credential_from_secret(secret, self.namespace, name)
            except StoreError as error:
                invalid[name] = str(error)
        return credentials, invalid


def secret_from_credential(
    credential: Credential,
    namespace: str,
    name: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The docker-registry Secret ``namespace/name`` holding ``credential``'s login only."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": DOCKERCONFIGJSON,
        "metadata": metadata,
        "data": {".dockerconfigjson": base64.b64encode(credential.dockerconfigjson()).decode()},
    }


def credential_from_secret(secret: dict[str, Any], namespace: str, name: str) -> Credential:
    """The login of one credential-store Secret; StoreError names the Secret and the problem."""
    where = f"Secret {namespace}/{name}"
    if secret.get("type") != DOCKERCONFIGJSON:
        raise StoreError(f"{where} is not of type {DOCKERCONFIGJSON}")
    try:
        payload = base64.b64decode(
            (secret.get("data") or {}).get(".dockerconfigjson", ""), validate=True
        )
    except (binascii.Error, ValueError):
        raise StoreError(f"{where}: .dockerconfigjson is not base64") from None
    credential = from_dockerconfigjson(name, payload, where=where)
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    expires = annotations.get(EXPIRES_ANNOTATION)
    if isinstance(expires, str):
        credential = dataclasses.replace(
            credential,
            expires=parse_expiry(expires, where=f"{where}: annotation {EXPIRES_ANNOTATION}"),
        )
    return credential
