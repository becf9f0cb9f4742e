"""The file credential store: credentials encrypted at rest with AES-256-GCM.

For running outside a cluster and for the embedded default. The key (32
random bytes, base64) comes from a key file or the ``MIRRORGATE_STORE_KEY``
environment variable and is never written into the store. GCM authenticates
as well as encrypts, so a wrong key and a damaged file are both detected and
reported as such, naming the file; they never read as an empty store.

On disk::

    {"format": "mirrorgate-credentials/v2", "store": "<hex>", "generation": N,
     "nonce": "<b64>", "ciphertext": "<b64>"}

The associated data of the AEAD is the format, the store's identity (random,
made when the store is first written) and its generation (one more at every
write), so none of them can be changed without the key. A running server
pins the identity and the generation it loaded and refuses a reload that
brings another store or an older generation: an earlier copy of the file,
put back, is reported instead of silently undoing a rotation. (Across a
restart only the key protects the file: no state outside it is kept.)

Writers (``credentials add`` and ``remove``) go through :func:`update_store`:
read, change and write under an exclusive lock (``flock`` on ``.<name>.lock``
beside the store, never removed, since unlinking a lock file lets two writers
hold "the" lock at once), and the write goes ahead only if the file is still
the generation that was read, so an entry added meanwhile by a writer that
took no lock is reported, never silently dropped.

The key file must be private, as ssh demands of a private key: a key file
that group or others may read is refused.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import errno
import fcntl
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mirrorgate import certs
from mirrorgate.webhook.credentials.store import Credential, StoreError

__all__ = [
    "KEY_ENV",
    "FileCredentialStore",
    "StoreContents",
    "credentials_of",
    "generate_key",
    "load_key",
    "locked",
    "read_store",
    "update_store",
    "write_store",
]

FORMAT = "mirrorgate-credentials/v2"
KEY_ENV = "MIRRORGATE_STORE_KEY"
LOCK_TIMEOUT = 30.0
"""Seconds a writer waits for another one to finish before it gives up, writing nothing."""


@dataclasses.dataclass(frozen=True)
class StoreContents:
    """What one version of the store file holds, with where it stands in the store's history."""

    credentials: Mapping[str, Credential]
    store_id: str = ""
    """Random hex made at the first write; "" for a store not written yet."""
    generation: int = 0
    """0 for a store not written yet; every write adds one."""

    def __repr__(self) -> str:  # credentials repr without passwords anyway, but keep it short
        return (
            f"StoreContents({len(self.credentials)} credentials, store={self.store_id!r}, "
            f"generation={self.generation})"
        )

    def replaced(self, credentials: Mapping[str, Credential]) -> StoreContents:
        """The next generation of this store, holding ``credentials``."""
        return StoreContents(
            credentials=dict(credentials),
            store_id=self.store_id or secrets.token_hex(16),
            generation=self.generation + 1,
        )


def _associated_data(store_id: str, generation: int) -> bytes:
    return orjson.dumps(
        {"format": FORMAT, "generation": generation, "store": store_id}, option=orjson.OPT_SORT_KEYS
    )


def generate_key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def load_key(*, key_file: str | None, environ: Mapping[str, str]) -> bytes:
    """The store key from ``key_file``, else from ``$MIRRORGATE_STORE_KEY``."""
    if key_file is not None:
        try:
            with open(key_file, encoding="ascii") as handle:
                _refuse_if_shared(key_file, os.fstat(handle.fileno()))
                text, source = handle.read().strip(), key_file
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not ASCII"
            raise StoreError(f"{key_file}: cannot read the store key: {reason}") from None
    elif environ.get(KEY_ENV):
        text, source = environ[KEY_ENV].strip(), f"${KEY_ENV}"
    else:
        raise StoreError(
            f"no store key: pass --key-file FILE or set {KEY_ENV} "
            "(make one with `mirrorgate credentials generate-key`)"
        )
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise StoreError(f"{source}: the store key is not base64") from None
    if len(key) != 32:
        raise StoreError(f"{source}: the store key must be 32 bytes (got {len(key)})")
    return key


def _refuse_if_shared(key_file: str, status: os.stat_result) -> None:
    # As ssh refuses a private key that others may read: the key opens every
    # credential of the store, so a readable key file is a leak already.
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077 and not _read_through_own_group(status):
        raise StoreError(
            f"{key_file}: the store key may be read or written by group or others "
            f"(mode {mode:04o}); make it private: chmod 600 {key_file} (from a "
            "Kubernetes Secret volume: defaultMode: 0440 and the Pod's "
            "securityContext.fsGroup)"
        )


def _read_through_own_group(status: os.stat_result) -> bool:
    """A Secret volume with the Pod's fsGroup: root's file, readable by that group alone.

    The kubelet gives a Secret's files to root and, with ``fsGroup``, to that group
    with group read added (a ``defaultMode: 0400`` becomes 0440). A process that is
    not the owner reads it only as a member of the group, which the Pod's containers
    alone have. A file of our own, or one the group may write, stays refused.
    """
    mode = stat.S_IMODE(status.st_mode)
    return (
        mode & 0o037 == 0
        and status.st_uid != os.geteuid()
        and status.st_gid in {os.getegid(), *os.getgroups()}
    )


def _decode(path: str, raw: bytes, key: bytes) -> StoreContents:
    try:
        envelope = orjson.loads(raw)
        if not isinstance(envelope, dict) or not isinstance(envelope.get("format"), str):
            raise ValueError
        if envelope["format"] != FORMAT:
            raise StoreError(
                f"{path}: store format {envelope['format'][:40]!r} is not "
                f"{FORMAT!r}; a v1 store becomes v2 with `mirrorgate credentials "
                "migrate`"
            )
        store_id, generation = envelope["store"], envelope["generation"]
        if not isinstance(store_id, str) or type(generation) is not int or generation < 1:
            raise ValueError
        nonce = base64.b64decode(envelope["nonce"], validate=True)
        ciphertext = base64.b64decode(envelope["ciphertext"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise StoreError(
            f"{path}: not a mirrorgate credential store (damaged or another file)"
        ) from None
    try:
        plaintext = AESGCM(key).decrypt(nonce, ciphertext, _associated_data(store_id, generation))
    except (InvalidTag, ValueError):
        raise StoreError(f"{path}: cannot decrypt: wrong key, or the file is damaged") from None
    try:
        credentials = credentials_of(plaintext)
    except ValueError:
        raise StoreError(f"{path}: decrypted, but the contents are malformed") from None
    return StoreContents(credentials=credentials, store_id=store_id, generation=generation)


def credentials_of(plaintext: bytes) -> dict[str, Credential]:
    """The credentials of a decrypted store, v1 or v2 (they share it); ValueError if malformed.

    ``{"credentials": {NAME: {"registry", "username", "password"}}}``.
    """
    try:
        entries = orjson.loads(plaintext)["credentials"]
        return {
            name: Credential(
                name=name, registry=e["registry"], username=e["username"], password=e["password"]
            )
            for name, e in entries.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError("malformed credential store contents") from None


def read_store(path: str, key: bytes, *, missing_ok: bool = False) -> StoreContents:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        if missing_ok:
            return StoreContents(credentials={})
        raise StoreError(f"{path}: no such credential store") from None
    except OSError as error:
        raise StoreError(f"{path}: cannot read: {error.strerror}") from None
    return _decode(path, raw, key)


def write_store(path: str, key: bytes, contents: StoreContents) -> None:
    """Encrypt ``contents`` and atomically replace ``path`` (created 0600), durably.

    ``contents`` comes from :meth:`StoreContents.replaced`, so it carries the
    store's identity and its next generation.
    """
    if not contents.store_id or contents.generation < 1:
        raise ValueError("write_store needs the next generation: use StoreContents.replaced()")
    plaintext = orjson.dumps(
        {
            "credentials": {
                c.name: {"registry": c.registry, "username": c.username, "password": c.password}
                for c in contents.credentials.values()
            }
        },
        option=orjson.OPT_SORT_KEYS,
    )
    nonce = secrets.token_bytes(12)
    sealed = AESGCM(key).encrypt(
        nonce, plaintext, _associated_data(contents.store_id, contents.generation)
    )
    envelope = orjson.dumps(
        {
            "format": FORMAT,
            "store": contents.store_id,
            "generation": contents.generation,
            "nonce": base64.b64encode(nonce).decode(),
            "ciphertext": base64.b64encode(sealed).decode(),
        }
    )
    try:
        certs.atomic_write(Path(path), envelope, mode=0o600)
        certs.fsync_directory(Path(path).absolute().parent)
    except OSError as error:
        raise StoreError(f"{path}: cannot write: {error.strerror}") from None


def _generation_on_disk(path: str) -> tuple[str, int]:
    """(store, generation) of the file as it is now, from its envelope; ("", 0) if missing."""
    try:
        with open(path, "rb") as handle:
            envelope = orjson.loads(handle.read())
        return str(envelope["store"]), int(envelope["generation"])
    except FileNotFoundError:
        return "", 0
    except (OSError, ValueError, KeyError, TypeError):
        return "?", -1  # unreadable now: certainly not what was read


@contextlib.contextmanager
def locked(path: str, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """The store's writer lock, held for the block (also `credentials migrate`'s)."""
    lock_path = Path(path).absolute()
    lock_path = lock_path.with_name(f".{lock_path.name}.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise StoreError(f"{path}: cannot lock the store ({lock_path}): {error.strerror}") from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise StoreError(
                        f"{path}: cannot lock the store ({lock_path}): {error.strerror}"
                    ) from None
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"{path}: another writer has held the store's lock "
                    f"({lock_path}) for {timeout:g} s; nothing was written, "
                    "try again"
                )
            time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def update_store(
    path: str,
    key: bytes,
    change: Callable[[StoreContents], Mapping[str, Credential] | None],
    *,
    missing_ok: bool = False,
    lock_timeout: float = LOCK_TIMEOUT,
) -> StoreContents:
    """Read the store, apply ``change`` and write the result, as one step among writers.

    ``change`` gets the current contents and returns the new credentials, or
    None to write nothing. Returns the contents written (or read, for None).
    StoreError when the lock is not had within ``lock_timeout`` seconds, or
    when the file changed under the lock (a writer that took none): nothing
    is written then.
    """
    with locked(path, lock_timeout):
        contents = read_store(path, key, missing_ok=missing_ok)
        credentials = change(contents)
        if credentials is None:
            return contents
        if _generation_on_disk(path) != (contents.store_id, contents.generation):
            raise StoreError(
                f"{path}: changed by another writer while this one held the "
                "lock (something writes it without locking); nothing was "
                "written, try again"
            )
        written = contents.replaced(credentials)
        write_store(path, key, written)
        return written


class FileCredentialStore:
    """A :class:`~webhook.credentials.store.CredentialStore` over an encrypted file.

    ``reload()`` (called by the server's file watcher) swaps in the new
    contents, or keeps the last good ones and reports the problem.
    """

    def __init__(self, path: str, key: bytes) -> None:
        self.path = path
        self._key = key
        self._contents = read_store(path, key)
        self._credentials = self._contents.credentials
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
                contents = read_store(self.path, self._key)
                self._check_succession(contents)
                self._contents, self._credentials = contents, contents.credentials
                self._problem = None
            except StoreError as error:
                self._problem = f"{error}; serving the last good contents"
                raise
        for callback in self._subscribers:
            callback()

    def _check_succession(self, contents: StoreContents) -> None:
        """Refuse another store, or an older generation of this one (a rollback)."""
        pinned = self._contents
        if contents.store_id != pinned.store_id:
            raise StoreError(
                f"{self.path}: this is another credential store (not the one "
                "loaded at start-up); restart mirrorgate to switch stores"
            )
        if contents.generation < pinned.generation:
            raise StoreError(
                f"{self.path}: generation {contents.generation} is older than "
                f"the loaded generation {pinned.generation}: an earlier copy of "
                "the file was put back"
            )
