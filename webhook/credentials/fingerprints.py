"""Keyed fingerprints of pull-secret contents: is a generated copy current?

A copy is current when its recorded fingerprint equals the fingerprint of the
credential the store holds now. An unkeyed hash of a ``.dockerconfigjson``
would let anyone who reads the fingerprint test password guesses offline, so
the fingerprint is an HMAC-SHA256 under a key only mirrorgate holds: 32
random bytes in the Secret ``mirrorgate-fingerprint-key`` of its own
namespace, made by the first replica that finds none (the others read it).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import secrets
from typing import Any

from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.credentials.kubestore import MANAGED_BY_LABEL
from mirrorgate.webhook.credentials.store import Credential

__all__ = ["KEY_SECRET", "Fingerprints", "load_or_create_key"]

KEY_SECRET = "mirrorgate-fingerprint-key"  # noqa: S105 (a Secret's name, not a password)
_KEY_FIELD = "key"
_CACHE_LIMIT = 1024


class Fingerprints:
    """HMAC-SHA256 of a credential's ``.dockerconfigjson``, memoised per credential."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        # Admission compares fingerprints on every Pod that needs a credential.
        self._memo: dict[Credential, str] = {}

    def __repr__(self) -> str:
        return "Fingerprints(<key hidden>)"

    def of(self, credential: Credential) -> str:
        found = self._memo.get(credential)
        if found is None:
            if len(self._memo) >= _CACHE_LIMIT:  # rotations only: never reached in practice
                self._memo.clear()
            found = hmac.new(self._key, credential.dockerconfigjson(), hashlib.sha256).hexdigest()
            self._memo[credential] = found
        return found


def _key_secret(namespace: str, key: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": KEY_SECRET,
            "namespace": namespace,
            # Labelled as ours, so the credential store never reads it.
            "labels": {MANAGED_BY_LABEL: "mirrorgate"},
        },
        "data": {_KEY_FIELD: base64.b64encode(key).decode()},
    }


def _decode(secret: dict[str, Any], namespace: str) -> bytes:
    try:
        key = base64.b64decode((secret.get("data") or {}).get(_KEY_FIELD, ""), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise kube.KubeError(
            0,
            "Invalid",
            f"Secret {namespace}/{KEY_SECRET}: '{_KEY_FIELD}' "
            "is not 32 bytes of base64; delete it to have a new key made",
        )
    return key


def load_or_create_key(client: kube.Kube, namespace: str) -> bytes:
    """The fingerprint key from mirrorgate's namespace, made there when absent."""
    path = kube.secrets_path(namespace, KEY_SECRET)
    try:
        return _decode(client.get(path), namespace)
    except kube.NotFound:
        pass
    # When another replica made it first, both use that one.
    with contextlib.suppress(kube.AlreadyExists):
        client.create(kube.secrets_path(namespace), _key_secret(namespace, secrets.token_bytes(32)))
    return _decode(client.get(path), namespace)
