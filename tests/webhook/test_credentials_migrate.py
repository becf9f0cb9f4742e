"""`mirrorgate credentials migrate`: a v1 file store (0.1.0) becomes v2 with nothing lost.

golden/credentials-v1/ holds a store written by the v1 code itself: the file
store of commit 869d12a (the parent of 4ce5fac, which introduced v2), run as
it was (`git archive 869d12a webhook`, then ``filestore.write_store`` with the
two credentials below and a key from its ``generate_key``). Its key sits
beside it; both are test data, never a real login.
"""

from __future__ import annotations

import base64
import re
import secrets
import shutil
import stat
import subprocess
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mirrorgate.webhook.credentials import filestore, migrate
from mirrorgate.webhook.credentials.store import Credential, StoreError
from tests.commands import MIRRORGATE

V1 = Path(__file__).parent / "golden" / "credentials-v1"
V1_CREDENTIALS = {
    "harbor-pull": Credential(
        name="harbor-pull",
        registry="harbor.corp.example",
        username="robot$pull",
        password="v1-fixture-password-1",
    ),
    "nexus": Credential(
        name="nexus",
        registry="nexus.corp.example:8443",
        username="svc-mirror",
        password="v1-fixture-password-2",
    ),
}


@pytest.fixture
def v1_store(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the v1 store, and its key file (mode 0600, as the key must be)."""
    store, key_file = tmp_path / "store.json", tmp_path / "store.key"
    shutil.copyfile(V1 / "store.json", store)
    shutil.copyfile(V1 / "store.key", key_file)
    key_file.chmod(0o600)
    return store, key_file


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MIRRORGATE, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def test_v1_is_refused_with_the_way_out(v1_store: tuple[Path, Path]) -> None:
    """Before migrating, the v1 store is refused, and the message names the command."""
    store, key_file = v1_store
    listed = _cli("credentials", "list", "--store", str(store), "--key-file", str(key_file))
    assert listed.returncode == 2
    assert listed.stderr == (
        f"mirrorgate: error: {store}: store format 'mirrorgate-credentials/v1' is not "
        "'mirrorgate-credentials/v2'; a v1 store becomes v2 with `mirrorgate credentials "
        "migrate`\n"
    )


def test_migrate_turns_v1_into_v2_and_keeps_the_v1_file(v1_store: tuple[Path, Path]) -> None:
    """The command rewrites the store as v2 generation 1 with the same credentials and key,
    keeps the v1 bytes at FILE.v1 (0600), and a second run changes nothing."""
    store, key_file = v1_store
    original = store.read_bytes()
    done = _cli("credentials", "migrate", "--store", str(store), "--key-file", str(key_file))
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"migrated {store} to v2 (2 credentials); the v1 store is kept at "
        f"{store}.v1: delete it once the server runs on v2\n"
    )
    assert done.stdout == ""
    kept = Path(f"{store}.v1")
    assert kept.read_bytes() == original
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    key = base64.b64decode(key_file.read_text())
    contents = filestore.read_store(str(store), key)
    assert contents.credentials == V1_CREDENTIALS
    assert contents.generation == 1
    assert contents.store_id
    for credential in V1_CREDENTIALS.values():  # encrypted, as before
        assert credential.password.encode() not in store.read_bytes()
    listed = _cli("credentials", "list", "--store", str(store), "--key-file", str(key_file))
    assert listed.returncode == 0, listed.stderr
    assert [line.split() for line in listed.stdout.splitlines()[1:]] == [
        ["harbor-pull", "harbor.corp.example", "robot$pull"],
        ["nexus", "nexus.corp.example:8443", "svc-mirror"],
    ]
    migrated = store.read_bytes()
    again = _cli("credentials", "migrate", "--store", str(store), "--key-file", str(key_file))
    assert (again.returncode, again.stderr) == (0, f"{store}: v2 already, nothing to do\n")
    assert store.read_bytes() == migrated
    assert kept.read_bytes() == original


def test_a_wrong_key_migrates_nothing(v1_store: tuple[Path, Path], tmp_path: Path) -> None:
    """Another key is a one-line error naming the file; the v1 store stays as it was."""
    store, _ = v1_store
    original = store.read_bytes()
    other = tmp_path / "other.key"
    other.write_text(filestore.generate_key())
    other.chmod(0o600)
    done = _cli("credentials", "migrate", "--store", str(store), "--key-file", str(other))
    assert done.returncode == 2
    assert done.stderr == (
        f"mirrorgate: error: {store}: cannot decrypt the v1 store: wrong "
        "key, or the file is damaged\n"
    )
    assert store.read_bytes() == original
    assert not Path(f"{store}.v1").exists()


def test_migrate_waits_for_the_store_lock(v1_store: tuple[Path, Path]) -> None:
    """While another writer holds the store's lock, migrate writes nothing and says so."""
    store, key_file = v1_store
    original = store.read_bytes()
    key = base64.b64decode(key_file.read_text())
    with (
        filestore.locked(str(store)),
        pytest.raises(StoreError, match="another writer has held the store's lock"),
    ):
        migrate.migrate(str(store), key, lock_timeout=0.2)
    assert store.read_bytes() == original
    assert not Path(f"{store}.v1").exists()
    assert migrate.migrate(str(store), key).credentials == 2  # once the lock is free


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            b'{"format":"mirrorgate-credentials/v1","nonce":"%%"}',
            "a damaged v1 credential store",
            id="damaged-v1",
        ),
        pytest.param(b"garbage", "not a mirrorgate credential store", id="not-a-store"),
    ],
)
def test_what_is_not_a_v1_store_is_named(tmp_path: Path, content: bytes, message: str) -> None:
    """A damaged v1 envelope and a file that is no store are errors naming the file."""
    store = tmp_path / "store.json"
    store.write_bytes(content)
    key = base64.b64decode(filestore.generate_key())
    with pytest.raises(StoreError) as refused:
        migrate.migrate(str(store), key)
    assert str(refused.value).startswith(f"{store}: {message}")
    assert store.read_bytes() == content


def test_a_missing_store_is_named(tmp_path: Path) -> None:
    """Migrating a file that is not there says so, and creates nothing."""
    with pytest.raises(StoreError, match="no such credential store"):
        migrate.migrate(str(tmp_path / "absent.json"), b"k" * 32)
    assert list(tmp_path.iterdir()) == []


def test_the_upgrading_guide_shows_what_the_cli_prints(tmp_path: Path) -> None:
    """docs/upgrading.md's refusal and migrate lines are what the commands print, word for word."""
    guide = (Path(__file__).parents[2] / "docs" / "upgrading.md").read_text()
    refusal = re.search(r"```text\n(mirrorgate: error: store\.json: .*?)\n```", guide, re.S)
    migrated = re.search(r"^# (migrated store\.json .*)$", guide, re.M)
    assert refusal is not None
    assert migrated is not None
    shutil.copyfile(V1 / "store.json", tmp_path / "store.json")
    shutil.copyfile(V1 / "store.key", tmp_path / "store.key")
    (tmp_path / "store.key").chmod(0o600)
    common = ("--store", "store.json", "--key-file", "store.key")
    listed = _cli("credentials", "list", *common, cwd=tmp_path)
    assert listed.stderr == refusal[1] + "\n"
    done = _cli("credentials", "migrate", *common, cwd=tmp_path)
    assert done.stderr == migrated[1] + "\n"


@pytest.mark.parametrize(
    "plaintext",
    [
        b"not json",
        b"[]",
        b'{"other": {}}',
        b'{"credentials": []}',
        b'{"credentials": {"x": {"registry": "r.example", "username": "u"}}}',
    ],
)
def test_malformed_contents_under_a_good_key_are_named_and_migrate_nothing(
    tmp_path: Path, plaintext: bytes
) -> None:
    """A v1 store decrypted to the wrong layout is refused by the check the v2 reader uses."""
    key = secrets.token_bytes(32)
    nonce = secrets.token_bytes(12)
    sealed = AESGCM(key).encrypt(nonce, plaintext, migrate.V1_FORMAT.encode())
    store = tmp_path / "store.json"
    store.write_bytes(
        orjson.dumps(
            {
                "format": migrate.V1_FORMAT,
                "nonce": base64.b64encode(nonce).decode(),
                "ciphertext": base64.b64encode(sealed).decode(),
            }
        )
    )
    with pytest.raises(StoreError) as refused:
        migrate.migrate(str(store), key)
    assert str(refused.value) == (
        f"{store}: decrypted the v1 store, but its contents are malformed"
    )
    assert not Path(f"{store}.v1").exists()
    with pytest.raises(ValueError, match="malformed"):
        filestore.credentials_of(plaintext)
