"""`mirrorgate credentials migrate`: a v1 file store rewritten as v2, nothing lost.

v1 (mirrorgate before the store had an identity and generations) wrote::

    {"format": "mirrorgate-credentials/v1", "nonce": "<b64>", "ciphertext": "<b64>"}

sealed with AES-256-GCM under the same key, the format name as the only
associated data, and the same plaintext (``{"credentials": {NAME: {registry,
username, password}}}``). Migration opens it with the key, writes the same
credentials as the first generation of a new v2 store in its place, and keeps
the v1 file beside it (``FILE.v1``, mode 0600) until the operator deletes it:
the new file is read back before the command reports success. A store that is
v2 already is left untouched, so running it twice is harmless. It all happens
under the store's writer lock, which `credentials add` and `remove` take too.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from pathlib import Path

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mirrorgate import certs
from mirrorgate.webhook.credentials import filestore
from mirrorgate.webhook.credentials.store import Credential, StoreError

__all__ = ["V1_FORMAT", "Migrated", "migrate"]

V1_FORMAT = "mirrorgate-credentials/v1"


@dataclasses.dataclass(frozen=True)
class Migrated:
    """What `migrate` did: ``kept`` is the v1 copy, None when the store was v2 already."""

    path: str
    credentials: int
    kept: str | None


def migrate(path: str, key: bytes, *, lock_timeout: float = filestore.LOCK_TIMEOUT) -> Migrated:
    """Rewrite the v1 store at ``path`` as v2 (keeping ``path.v1``); a v2 store is left as is.

    Under the store's writer lock, as `credentials add` and `remove` write.
    """
    if not Path(path).exists():  # no lock file left beside a store that is not there
        raise StoreError(f"{path}: no such credential store")
    with filestore.locked(path, lock_timeout):
        return _migrate(path, key)


def _migrate(path: str, key: bytes) -> Migrated:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise StoreError(f"{path}: no such credential store") from None
    except OSError as error:
        raise StoreError(f"{path}: cannot read: {error.strerror}") from None
    if _format(raw) != V1_FORMAT:
        # v2, or not a store at all: the v2 reader says which, and checks the key.
        current = filestore.read_store(path, key)
        return Migrated(path=path, credentials=len(current.credentials), kept=None)
    credentials = _decode_v1(path, raw, key)
    kept = f"{path}.v1"
    try:
        certs.atomic_write(Path(kept), raw, mode=0o600)
    except OSError as error:
        raise StoreError(f"{kept}: cannot keep the v1 store: {error.strerror}") from None
    filestore.write_store(path, key, filestore.StoreContents(credentials={}).replaced(credentials))
    written = filestore.read_store(path, key).credentials
    if written != credentials:  # never report success over a store that lost something
        raise StoreError(
            f"{path}: the v2 store does not read back as written; the v1 store is kept at {kept}"
        )
    return Migrated(path=path, credentials=len(credentials), kept=kept)


def _format(raw: bytes) -> object:
    try:
        envelope = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return envelope.get("format") if isinstance(envelope, dict) else None


def _decode_v1(path: str, raw: bytes, key: bytes) -> dict[str, Credential]:
    try:
        envelope = orjson.loads(raw)
        nonce = base64.b64decode(envelope["nonce"], validate=True)
        ciphertext = base64.b64decode(envelope["ciphertext"], validate=True)
    except (KeyError, TypeError, binascii.Error, ValueError):
        raise StoreError(f"{path}: a damaged v1 credential store") from None
    try:
        plaintext = AESGCM(key).decrypt(nonce, ciphertext, V1_FORMAT.encode())
    except (InvalidTag, ValueError):
        raise StoreError(
            f"{path}: cannot decrypt the v1 store: wrong key, or the file is damaged"
        ) from None
    try:
        return filestore.credentials_of(plaintext)
    except ValueError:
        raise StoreError(
            f"{path}: decrypted the v1 store, but its contents are malformed"
        ) from None
