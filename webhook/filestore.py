"""The file credential store: credentials encrypted at rest with AES-256-GCM.

For running outside a cluster and for the embedded default. The key (32
random bytes, base64) comes from a key file or the ``MIRRORGATE_STORE_KEY``
environment variable and is never written into the store. GCM authenticates
as well as encrypts, so a wrong key and a damaged file are both detected and
reported as such, naming the file; they never read as an empty store.

On disk::

    {"format": "mirrorgate-credentials/v1", "nonce": "<b64>", "ciphertext": "<b64>"}
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from webhook.credentials import Credential, StoreError

__all__ = ["KEY_ENV", "FileCredentialStore", "generate_key", "load_key", "read_store",
           "write_store"]

FORMAT = "mirrorgate-credentials/v1"
KEY_ENV = "MIRRORGATE_STORE_KEY"
_AAD = FORMAT.encode()  # binds the ciphertext to this format version


def generate_key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def load_key(*, key_file: str | None, environ: Mapping[str, str]) -> bytes:
    """The store key from ``key_file``, else from ``$MIRRORGATE_STORE_KEY``."""
    if key_file is not None:
        try:
            with open(key_file, encoding="ascii") as handle:
                text, source = handle.read().strip(), key_file
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not ASCII"
            raise StoreError(f"{key_file}: cannot read the store key: {reason}") from None
    elif environ.get(KEY_ENV):
        text, source = environ[KEY_ENV].strip(), f"${KEY_ENV}"
    else:
        raise StoreError(f"no store key: pass --key-file FILE or set {KEY_ENV} "
                         "(make one with `mirrorgate credentials generate-key`)")
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise StoreError(f"{source}: the store key is not base64") from None
    if len(key) != 32:
        raise StoreError(f"{source}: the store key must be 32 bytes (got {len(key)})")
    return key


def _decode(path: str, raw: bytes, key: bytes) -> dict[str, Credential]:
    try:
        envelope = orjson.loads(raw)
        if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
            raise ValueError
        nonce = base64.b64decode(envelope["nonce"], validate=True)
        ciphertext = base64.b64decode(envelope["ciphertext"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise StoreError(f"{path}: not a mirrorgate credential store (damaged or another "
                         "file)") from None
    try:
        plaintext = AESGCM(key).decrypt(nonce, ciphertext, _AAD)
    except (InvalidTag, ValueError):
        raise StoreError(f"{path}: cannot decrypt: wrong key, or the file is damaged") from None
    try:
        entries = orjson.loads(plaintext)["credentials"]
        return {name: Credential(name=name, registry=e["registry"], username=e["username"],
                                 password=e["password"]) for name, e in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StoreError(f"{path}: decrypted, but the contents are malformed") from None


def read_store(path: str, key: bytes, *, missing_ok: bool = False) -> dict[str, Credential]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise StoreError(f"{path}: no such credential store") from None
    except OSError as error:
        raise StoreError(f"{path}: cannot read: {error.strerror}") from None
    return _decode(path, raw, key)


def write_store(path: str, key: bytes, credentials: Mapping[str, Credential]) -> None:
    """Encrypt and atomically replace ``path`` (created 0600)."""
    plaintext = orjson.dumps({"credentials": {
        c.name: {"registry": c.registry, "username": c.username, "password": c.password}
        for c in credentials.values()}}, option=orjson.OPT_SORT_KEYS)
    nonce = secrets.token_bytes(12)
    envelope = orjson.dumps({
        "format": FORMAT, "nonce": base64.b64encode(nonce).decode(),
        "ciphertext": base64.b64encode(AESGCM(key).encrypt(nonce, plaintext, _AAD)).decode()})
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".mirrorgate-store-", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(envelope)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise StoreError(f"{path}: cannot write: {error.strerror}") from None


class FileCredentialStore:
    """A :class:`~webhook.credentials.CredentialStore` over an encrypted file.

    ``reload()`` (called by the server's file watcher) swaps in the new
    contents, or keeps the last good ones and reports the problem.
    """

    def __init__(self, path: str, key: bytes) -> None:
        self.path = path
        self._key = key
        self._credentials = read_store(path, key)
        self._problem: str | None = None
        self._subscribers: list[Callable[[], Any]] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FileCredentialStore({self.path!r}, {len(self._credentials)} credentials)"

    def snapshot(self) -> Mapping[str, Credential]:
        return self._credentials

    def problem(self) -> str | None:
        return self._problem

    def subscribe(self, callback: Callable[[], Any]) -> None:
        self._subscribers.append(callback)

    def reload(self) -> None:
        with self._lock:
            try:
                self._credentials = read_store(self.path, self._key)
                self._problem = None
            except StoreError as error:
                self._problem = f"{error}; serving the last good contents"
                raise
        for callback in self._subscribers:
            callback()
