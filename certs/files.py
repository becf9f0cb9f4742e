"""Reading and writing a certificate bundle directory.

Layout (the names of a ``kubernetes.io/tls`` Secret plus the CA)::

    ca.crt   CA certificate (PEM)          0644
    ca.key   CA private key (optional)     0600
    tls.crt  serving certificate (PEM)     0644
    tls.key  serving private key (PEM)     0600

Each file is replaced atomically: written to a temporary file in the same
directory, fsynced, then ``os.replace``d over the old one, so a reader (the
webhook's reload loop) never sees a half-written file. Keys are created with
mode 0600 by ``os.open`` itself: a ``chmod`` afterwards would leave a window in
which the key is readable under the default umask.

The set of files is not replaced atomically as a whole: a reader polling
between two renames can see a new ``tls.crt`` with the old ``tls.key``.
``read_bundle`` detects that pair mismatch, so a reader should retry.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path
from typing import Final

from mirrorgate.certs.pem import (
    load_certificate,
    load_certificates,
    load_private_key,
    public_keys_match,
)

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "TLS_CERT",
    "TLS_KEY",
    "atomic_write",
    "fsync_directory",
    "read_bundle",
    "write_bundle",
]

CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
TLS_CERT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"

_PUBLIC_MODE: Final = 0o644
_PRIVATE_MODE: Final = 0o600


def write_bundle(
    directory: Path,
    *,
    ca_pem: bytes,
    cert_pem: bytes,
    key_pem: bytes,
    ca_key_pem: bytes | None = None,
) -> None:
    """Write ``ca.crt``, ``tls.crt``, ``tls.key`` (and ``ca.key`` if given) into ``directory``.

    The directory is created (mode 0700) if missing. Contents are not
    validated here; use ``read_bundle`` to check what was written.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Keys before certificates: a reader that sees a new certificate then
    # finds its key already in place (the reverse order widens the mismatch).
    if ca_key_pem is not None:
        atomic_write(directory / CA_KEY, ca_key_pem, mode=_PRIVATE_MODE)
    atomic_write(directory / CA_CERT, ca_pem, mode=_PUBLIC_MODE)
    atomic_write(directory / TLS_KEY, key_pem, mode=_PRIVATE_MODE)
    atomic_write(directory / TLS_CERT, cert_pem, mode=_PUBLIC_MODE)
    fsync_directory(directory)


def read_bundle(directory: Path) -> tuple[bytes, bytes, bytes]:
    """Return ``(ca_pem, cert_pem, key_pem)`` read from ``directory``.

    Each file is checked to parse as what it should be, and ``tls.key`` to
    belong to ``tls.crt``.

    Raises:
        FileNotFoundError: naming the missing file.
        ValueError: naming the file whose contents are bad.
    """
    ca_path, cert_path, key_path = directory / CA_CERT, directory / TLS_CERT, directory / TLS_KEY
    ca_pem, cert_pem, key_pem = (_read(path) for path in (ca_path, cert_path, key_path))
    load_certificates(ca_pem, what=str(ca_path))
    cert = load_certificate(cert_pem, what=str(cert_path))
    key = load_private_key(key_pem, what=str(key_path))
    if not public_keys_match(cert.public_key(), key.public_key()):
        raise ValueError(f"{key_path} does not hold the private key for {cert_path}")
    return ca_pem, cert_pem, key_pem


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, "certificate bundle file is missing", str(path)
        ) from None


def atomic_write(path: Path, data: bytes, *, mode: int) -> None:
    """Replace ``path`` with ``data`` in one rename, created with ``mode``; fsynced.

    Follow with :func:`fsync_directory` to make the rename itself durable.
    """
    # Dot-prefixed so globbing readers (and kubelet-style watchers) skip it;
    # random so concurrent writers cannot collide on O_EXCL.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def fsync_directory(directory: Path) -> None:
    """Make the renames into ``directory`` durable: until it is synced, a crash may undo them."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
