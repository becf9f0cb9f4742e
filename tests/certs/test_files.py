"""Writing and reading bundle directories: modes, atomic replacement, clear errors."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair, read_bundle, write_bundle

ALL_FILES = {"ca.crt", "ca.key", "tls.crt", "tls.key"}


@pytest.fixture(scope="module")
def leaf(ca: CertificateAuthority) -> KeyPair:
    """A serving leaf to write."""
    return ca.issue_serving(dns_names=["a.x"])


@pytest.fixture
def umask() -> Iterator[int]:
    """The process umask, pinned to 022 for the test so expected modes are fixed."""
    old = os.umask(0o022)
    try:
        yield 0o022
    finally:
        os.umask(old)


def _write(directory: Path, ca: CertificateAuthority, leaf: KeyPair) -> None:
    write_bundle(
        directory,
        ca_pem=ca.cert_pem,
        cert_pem=leaf.cert_pem,
        key_pem=leaf.key_pem,
        ca_key_pem=ca.key_pem,
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_then_read_round_trip(
    tmp_path: Path, ca: CertificateAuthority, leaf: KeyPair
) -> None:
    """read_bundle returns exactly what write_bundle wrote."""
    write_bundle(tmp_path, ca_pem=ca.cert_pem, cert_pem=leaf.cert_pem, key_pem=leaf.key_pem)
    assert read_bundle(tmp_path) == (ca.cert_pem, leaf.cert_pem, leaf.key_pem)
    assert {p.name for p in tmp_path.iterdir()} == {"ca.crt", "tls.crt", "tls.key"}


def test_modes(tmp_path: Path, ca: CertificateAuthority, leaf: KeyPair, umask: int) -> None:
    """Keys are 0600 and certificates 0644; a missing directory is created 0700."""
    directory = tmp_path / "new" / "bundle"
    _write(directory, ca, leaf)
    assert _mode(directory / "ca.key") == 0o600
    assert _mode(directory / "tls.key") == 0o600
    assert _mode(directory / "ca.crt") == 0o644
    assert _mode(directory / "tls.crt") == 0o644
    assert _mode(directory) == 0o700


def test_keys_are_created_0600_not_chmodded(
    tmp_path: Path, ca: CertificateAuthority, leaf: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Key files are born 0600 by os.open with O_EXCL; nothing chmods them afterwards."""
    opened: list[tuple[str, int, int]] = []
    real_open: Callable[..., int] = os.open

    def spy_open(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        opened.append((os.fspath(path), flags, mode))
        return real_open(path, flags, mode, **kwargs)

    def no_chmod(*args: object, **kwargs: object) -> None:
        raise AssertionError("chmod must not be needed")

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(os, "fchmod", no_chmod)
    _write(tmp_path, ca, leaf)
    key_opens = [(p, f, m) for p, f, m in opened if ".key." in Path(p).name]
    assert len(key_opens) == 2
    for path, flags, mode in key_opens:
        assert Path(path).parent == tmp_path
        assert flags & os.O_CREAT
        assert flags & os.O_EXCL
        assert mode == 0o600


def test_rewrite_replaces_files_atomically(
    tmp_path: Path, ca: CertificateAuthority, leaf: KeyPair
) -> None:
    """A rewrite swaps in new inodes: an open reader keeps the old content, no temp files remain."""
    _write(tmp_path, ca, leaf)
    key_path = tmp_path / "tls.key"
    old_inode = key_path.stat().st_ino
    new_leaf = ca.issue_serving(dns_names=["b.x"])
    with key_path.open("rb") as reader:
        _write(tmp_path, ca, new_leaf)
        assert reader.read() == leaf.key_pem
    assert key_path.stat().st_ino != old_inode
    assert key_path.read_bytes() == new_leaf.key_pem
    assert {p.name for p in tmp_path.iterdir()} == ALL_FILES


def test_rewrite_tightens_loose_key_mode(
    tmp_path: Path, ca: CertificateAuthority, leaf: KeyPair
) -> None:
    """An existing world-readable tls.key is replaced by a 0600 one."""
    loose = tmp_path / "tls.key"
    loose.write_bytes(b"old")
    loose.chmod(0o644)
    _write(tmp_path, ca, leaf)
    assert _mode(loose) == 0o600


def test_failed_write_leaves_old_file_and_no_temp(
    tmp_path: Path, ca: CertificateAuthority, leaf: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the rename fails the old file is untouched and the temp file is removed."""
    _write(tmp_path, ca, leaf)

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        _write(tmp_path, ca, ca.issue_serving(dns_names=["b.x"]))
    monkeypatch.undo()
    assert read_bundle(tmp_path) == (ca.cert_pem, leaf.cert_pem, leaf.key_pem)
    assert {p.name for p in tmp_path.iterdir()} == ALL_FILES


@pytest.mark.parametrize("missing", ["ca.crt", "tls.crt", "tls.key"])
def test_read_bundle_names_missing_file(
    tmp_path: Path, ca: CertificateAuthority, leaf: KeyPair, missing: str
) -> None:
    """A missing file raises FileNotFoundError naming it."""
    _write(tmp_path, ca, leaf)
    (tmp_path / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing) as info:
        read_bundle(tmp_path)
    assert info.value.filename == str(tmp_path / missing)


@pytest.mark.parametrize(
    ("bad", "content", "message"),
    [
        ("ca.crt", b"junk", "ca.crt: no PEM certificate found"),
        ("tls.crt", b"junk", "tls.crt: no PEM certificate found"),
        ("tls.key", b"junk", "tls.key: not a valid unencrypted PEM private key"),
    ],
)
def test_read_bundle_names_bad_file(
    tmp_path: Path,
    ca: CertificateAuthority,
    leaf: KeyPair,
    bad: str,
    content: bytes,
    message: str,
) -> None:
    """A file with bad contents raises ValueError naming it."""
    _write(tmp_path, ca, leaf)
    (tmp_path / bad).write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_bundle(tmp_path)


def test_read_bundle_detects_key_from_another_cert(
    tmp_path: Path, ca: CertificateAuthority, leaf: KeyPair
) -> None:
    """A tls.key that does not belong to tls.crt is reported, naming both files."""
    other = ca.issue_serving(dns_names=["b.x"])
    write_bundle(tmp_path, ca_pem=ca.cert_pem, cert_pem=leaf.cert_pem, key_pem=other.key_pem)
    with pytest.raises(ValueError, match=r"tls\.key does not hold the private key for .*tls\.crt"):
        read_bundle(tmp_path)
