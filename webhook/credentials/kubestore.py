"""The Kubernetes credential store: docker-registry Secrets in mirrorgate's namespace that
are labelled ``mirrorgate.io/credential=true``.

Exactly what ``kubectl create secret docker-registry NAME --docker-server=...
--docker-username=... --docker-password=...`` makes, then ``kubectl label
secret NAME mirrorgate.io/credential=true``; the credential's name is the
Secret's name. The label is what makes a Secret a central credential: a
Secret that is only of the type (mirrorgate's own imagePullSecrets, a
tenant's leftovers, anything another tool keeps there) is not one, so no
policy can hand it out. Read through an informer, so a rotation is seen
within seconds and no admission reads the API.

Migration (this minor version only): an unlabelled docker-registry Secret
still counts, with a warning in the log once per Secret, and
:attr:`KubernetesCredentialStore.unlabelled` names them
(docs/upgrading.md says how to label them).
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
    "CREDENTIAL_LABEL",
    "CREDENTIAL_LABEL_VALUE",
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
CREDENTIAL_LABEL, CREDENTIAL_LABEL_VALUE = "mirrorgate.io/credential", "true"
"""The label that makes a docker-registry Secret of mirrorgate's namespace a central credential."""
EXPIRES_ANNOTATION = "mirrorgate.io/expires"
"""RFC 3339: when a short-lived login stops working (written by the provider refresher)."""
_SHOWN = 5
"""Unlabelled Secrets /readyz names; it counts the rest."""


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
        self.unlabelled: frozenset[str] = frozenset()
        """Credentials read from Secrets without the label (migration: warned of, still used)."""
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

    def advisories(self) -> Mapping[str, str]:
        """What /readyz lists without turning unready: the unlabelled credentials (migration)."""
        unlabelled = sorted(self.unlabelled)
        if not unlabelled:
            return {}
        shown = ", ".join(unlabelled[:_SHOWN])
        more = f" and {len(unlabelled) - _SHOWN} more" if len(unlabelled) > _SHOWN else ""
        return {
            "credential-labels": f"{len(unlabelled)} credential Secret(s) without the label "
            f"{CREDENTIAL_LABEL}={CREDENTIAL_LABEL_VALUE} still count in this version, not in "
            f"the next: {shown}{more} (docs/upgrading.md)"
        }

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            credentials, invalid, unlabelled = self._read_all()
            for name in sorted(unlabelled - self.unlabelled):
                logger.warning(
                    "a credential-store Secret without the credential label; it still counts "
                    "in this version, but will not in the next (docs/upgrading.md)",
                    extra={
                        "fields": {
                            "secret": f"{self.namespace}/{name}",
                            "fix": f"kubectl -n {self.namespace} label secret {name} "
                            f"{CREDENTIAL_LABEL}={CREDENTIAL_LABEL_VALUE}",
                        }
                    },
                )
            self.unlabelled = unlabelled
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

    def _read_all(self) -> tuple[dict[str, Credential], dict[str, str], frozenset[str]]:
        credentials: dict[str, Credential] = {}
        invalid: dict[str, str] = {}
        unlabelled: set[str] = set()
        for (_, name), secret in list(self.informer.items.items()):
            if secret.get("type") != DOCKERCONFIGJSON:
                continue
            label = ((secret.get("metadata") or {}).get("labels") or {}).get(CREDENTIAL_LABEL)
            if label is not None and label != CREDENTIAL_LABEL_VALUE:
                continue  # labelled, but not as a central credential
            try:
                credentials[name] = credential_from_secret(secret, self.namespace, name)
            except StoreError as error:
                invalid[name] = str(error)
                continue
            if label is None:
                unlabelled.add(name)
        return credentials, invalid, frozenset(unlabelled)


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
