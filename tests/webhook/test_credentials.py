"""Credentials: the value type, the pull-secret payload, and the encrypted file store."""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.abuse_bench import release_together
from mirrorgate.webhook import cli
from mirrorgate.webhook.credentials import filestore
from mirrorgate.webhook.credentials.store import Credential, StoreError, from_dockerconfigjson

PASSWORD = "p@ss:w/rd-7f3a9c"  # a canary: it must never show anywhere but the payload
CREDENTIAL = Credential(
    name="harbor-pull", registry="harbor.corp.example", username="robot$pull", password=PASSWORD
)


def test_repr_and_str_hide_the_password() -> None:
    """Neither repr() nor str() of a credential shows its password."""
    for text in (repr(CREDENTIAL), str(CREDENTIAL)):
        assert PASSWORD not in text
        assert "harbor-pull" in text


def test_dockerconfigjson_holds_one_login_with_auth() -> None:
    """The payload is the kubelet's format: username, password and auth for one registry."""
    config = json.loads(CREDENTIAL.dockerconfigjson())
    assert config == {
        "auths": {
            "harbor.corp.example": {
                "username": "robot$pull",
                "password": PASSWORD,
                "auth": base64.b64encode(f"robot$pull:{PASSWORD}".encode()).decode(),
            }
        }
    }


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param(
            {"auths": {"https://harbor.corp.example/v1/": {"username": "u", "password": "p"}}},
            ("harbor.corp.example", "u", "p"),
            id="kubectl-url-key",
        ),
        pytest.param(
            {"auths": {"127.0.0.1:5002": {"auth": base64.b64encode(b"u:p:q").decode()}}},
            ("127.0.0.1:5002", "u", "p:q"),
            id="auth-only",
        ),
        pytest.param(
            {"auths": {"harbor.corp.example:8443/team-a": {"username": "u", "password": "p"}}},
            ("harbor.corp.example:8443/team-a", "u", "p"),
            id="path-scoped-key",
        ),
        pytest.param(
            {"auths": {"https://harbor.corp.example/team-a/": {"username": "u", "password": "p"}}},
            ("harbor.corp.example/team-a", "u", "p"),
            id="path-scoped-url-key",
        ),
    ],
)
def test_reads_what_kubectl_and_docker_write(
    payload: dict[str, Any], expected: tuple[str, str, str]
) -> None:
    """Keys written as URLs and logins given only as `auth` are both understood."""
    found = from_dockerconfigjson("c", json.dumps(payload).encode(), where="Secret x/c")
    assert (found.registry, found.username, found.password) == expected


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param(
            b"{not json", "Secret x/c: .dockerconfigjson is not valid JSON", id="not-json"
        ),
        pytest.param(b'{"auths": {}}', "exactly one registry under 'auths' (found 0)", id="empty"),
        pytest.param(
            json.dumps(
                {
                    "auths": {
                        "a": {"username": "u", "password": PASSWORD},
                        "b": {"username": "u", "password": PASSWORD},
                    }
                }
            ).encode(),
            "exactly one registry under 'auths' (found 2)",
            id="two",
        ),
        pytest.param(
            b'{"auths": {"a": {"username": "u"}}}', "has no username and password", id="no-password"
        ),
    ],
)
def test_bad_payloads_are_named_not_quoted(payload: bytes, message: str) -> None:
    """A malformed payload is refused with the place and the problem, never its content."""
    with pytest.raises(StoreError) as refused:
        from_dockerconfigjson("c", payload, where="Secret x/c")
    assert message in str(refused.value)
    assert str(refused.value).startswith("Secret x/c: ")
    assert PASSWORD not in str(refused.value)


@pytest.fixture
def key() -> bytes:
    return base64.b64decode(filestore.generate_key())


def _write(path: str, key: bytes, credentials: dict[str, Credential]) -> None:
    """The next generation of the store at ``path``, as `credentials add` writes it."""
    filestore.write_store(
        path, key, filestore.read_store(path, key, missing_ok=True).replaced(credentials)
    )


def test_store_round_trip_is_encrypted_and_private(tmp_path: Path, key: bytes) -> None:
    """What is written reads back; on disk there is no plaintext, and the file is 0600."""
    path = str(tmp_path / "store.json")
    _write(path, key, {CREDENTIAL.name: CREDENTIAL})
    assert filestore.read_store(path, key).credentials == {CREDENTIAL.name: CREDENTIAL}
    raw = Path(path).read_bytes()
    assert PASSWORD.encode() not in raw
    assert b"robot" not in raw
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["store.json"]  # no temporary left


def test_wrong_key_is_an_error_naming_the_file(tmp_path: Path, key: bytes) -> None:
    """Another key never reads as an empty store: it is an error that names the file."""
    path = str(tmp_path / "store.json")
    _write(path, key, {CREDENTIAL.name: CREDENTIAL})
    other = base64.b64decode(filestore.generate_key())
    with pytest.raises(StoreError) as refused:
        filestore.read_store(path, other)
    assert str(refused.value) == f"{path}: cannot decrypt: wrong key, or the file is damaged"


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda raw: raw[:-12] + b'AAAAAAAA"}', id="ciphertext-flipped"),
        pytest.param(
            lambda raw: raw.replace(b"mirrorgate-credentials/v2", b"something-else/v2"),
            id="other-format",
        ),
        pytest.param(
            lambda raw: raw.replace(b'"generation":1', b'"generation":"1"'),
            id="generation-not-a-number",
        ),
        pytest.param(lambda raw: b"garbage", id="garbage"),
        pytest.param(lambda raw: b"", id="empty"),
    ],
)
def test_damaged_file_is_an_error_naming_the_file(tmp_path: Path, key: bytes, damage: Any) -> None:
    """Any damage is detected (GCM authenticates) and reported with the file's name."""
    path = tmp_path / "store.json"
    _write(str(path), key, {CREDENTIAL.name: CREDENTIAL})
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StoreError) as refused:
        filestore.read_store(str(path), key)
    assert str(path) in str(refused.value)


@pytest.mark.parametrize(
    ("key_text", "message"),
    [
        pytest.param("not base64!!", "is not base64", id="not-base64"),
        pytest.param(
            base64.b64encode(b"short").decode(), r"must be 32 bytes \(got 5\)", id="short"
        ),
    ],
)
def test_bad_keys_are_named(tmp_path: Path, key_text: str, message: str) -> None:
    """A key that is not 32 base64 bytes is refused, naming where it came from."""
    key_file = tmp_path / "key"
    key_file.write_text(key_text)
    key_file.chmod(0o600)
    with pytest.raises(StoreError, match=message) as refused:
        filestore.load_key(key_file=str(key_file), environ={})
    assert str(key_file) in str(refused.value)
    with pytest.raises(StoreError, match=message) as from_env:
        filestore.load_key(key_file=None, environ={filestore.KEY_ENV: key_text})
    assert filestore.KEY_ENV in str(from_env.value)


def test_no_key_says_how_to_get_one() -> None:
    """Without a key file or the environment variable, the message says what to do."""
    with pytest.raises(StoreError, match="generate-key"):
        filestore.load_key(key_file=None, environ={})


def test_reload_keeps_the_last_good_contents(tmp_path: Path, key: bytes) -> None:
    """A damaged store on reload keeps serving what it had and reports the problem."""
    path = str(tmp_path / "store.json")
    _write(path, key, {CREDENTIAL.name: CREDENTIAL})
    store = filestore.FileCredentialStore(path, key)
    changes: list[int] = []
    store.subscribe(lambda: changes.append(1))
    loaded = filestore.read_store(path, key)
    Path(path).write_bytes(b"garbage")
    with pytest.raises(StoreError):
        store.reload()
    assert store.snapshot() == {CREDENTIAL.name: CREDENTIAL}
    assert store.problem() is not None
    assert changes == []
    filestore.write_store(path, key, loaded.replaced({}))
    store.reload()
    assert store.snapshot() == {}
    assert store.problem() is None
    assert changes == [1]
    assert PASSWORD not in repr(store)


def test_generations_follow_each_write_and_keep_the_identity(tmp_path: Path, key: bytes) -> None:
    """Every write is the next generation of the same store; a new store has a new identity."""
    path, other = str(tmp_path / "store.json"), str(tmp_path / "other.json")
    seen = []
    for credentials in ({}, {CREDENTIAL.name: CREDENTIAL}, {}):
        _write(path, key, credentials)
        contents = filestore.read_store(path, key)
        seen.append((contents.store_id, contents.generation))
    _write(other, key, {})
    assert [generation for _, generation in seen] == [1, 2, 3]
    assert len({store_id for store_id, _ in seen}) == 1
    assert filestore.read_store(other, key).store_id != seen[0][0]
    assert PASSWORD not in repr(filestore.read_store(path, key))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param(b'"generation":2', b'"generation":3', id="generation-raised"),
        pytest.param(b'"generation":2', b'"generation":1', id="generation-lowered"),
        pytest.param(b'"store":"', b'"store":"0', id="identity-changed"),
    ],
)
def test_identity_and_generation_are_authenticated(
    tmp_path: Path, key: bytes, field: bytes, value: bytes
) -> None:
    """The envelope's identity and generation are the AEAD's associated data: no edit passes."""
    path = tmp_path / "store.json"
    _write(str(path), key, {})
    _write(str(path), key, {CREDENTIAL.name: CREDENTIAL})
    raw = path.read_bytes()
    assert field in raw
    path.write_bytes(raw.replace(field, value, 1))
    with pytest.raises(StoreError, match="cannot decrypt"):
        filestore.read_store(str(path), key)


def test_reload_refuses_an_older_generation_put_back(tmp_path: Path, key: bytes) -> None:
    """Putting back an earlier copy of the file (a rollback) is refused, not served."""
    path = tmp_path / "store.json"
    old = Credential(
        name="harbor-pull",
        registry="harbor.corp.example",
        username="robot$pull",
        password="revoked-password",
    )
    _write(str(path), key, {old.name: old})
    earlier = path.read_bytes()
    _write(str(path), key, {CREDENTIAL.name: CREDENTIAL})
    store = filestore.FileCredentialStore(str(path), key)
    path.write_bytes(earlier)
    with pytest.raises(StoreError, match="generation 1 is older than the loaded generation 2"):
        store.reload()
    assert store.snapshot() == {CREDENTIAL.name: CREDENTIAL}
    assert "earlier copy" in (store.problem() or "")
    _write(str(path), key, {})  # the real next generation is taken again
    store.reload()
    assert store.snapshot() == {}
    assert store.problem() is None


def test_reload_refuses_another_store_under_the_same_key(tmp_path: Path, key: bytes) -> None:
    """A different store encrypted with the same key is not taken for this one."""
    path, other = tmp_path / "store.json", tmp_path / "other.json"
    _write(str(path), key, {CREDENTIAL.name: CREDENTIAL})
    for _ in range(3):  # a higher generation does not make it this store
        _write(str(other), key, {})
    store = filestore.FileCredentialStore(str(path), key)
    path.write_bytes(other.read_bytes())
    with pytest.raises(StoreError, match="another credential store"):
        store.reload()
    assert store.snapshot() == {CREDENTIAL.name: CREDENTIAL}


def test_the_directory_is_synced_after_the_rename(
    tmp_path: Path, key: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename is made durable: the directory is fsynced after os.replace."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(source: str, target: str) -> None:
        events.append("replace")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    _write(str(tmp_path / "store.json"), key, {CREDENTIAL.name: CREDENTIAL})
    assert events == ["fsync file", "replace", "fsync dir"]


@pytest.mark.parametrize(
    ("mode", "accepted"),
    [
        (0o600, True),
        (0o400, True),
        (0o640, False),
        (0o644, False),
        (0o604, False),
        (0o620, False),
        (0o660, False),
    ],
)
def test_a_key_file_others_may_read_is_refused(tmp_path: Path, mode: int, accepted: bool) -> None:
    """As ssh does with private keys: a store key that group or others can access is refused."""
    key_file = tmp_path / "store.key"
    key_file.write_text(filestore.generate_key())
    key_file.chmod(mode)
    if accepted:
        assert len(filestore.load_key(key_file=str(key_file), environ={})) == 32
        return
    with pytest.raises(StoreError) as refused:
        filestore.load_key(key_file=str(key_file), environ={})
    assert str(refused.value).startswith(
        f"{key_file}: the store key may be read or written by group or others (mode {mode:04o})"
    )
    assert "chmod 600" in str(refused.value)


def _run(args: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    real_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        status = cli.main(args, out=out, err=err)
    finally:
        sys.stdin = real_stdin
    return status, out.getvalue(), err.getvalue()


def test_credentials_commands(tmp_path: Path) -> None:
    """add, list and remove work on the store; list never prints a password."""
    key_file, store = str(tmp_path / "key"), str(tmp_path / "store.json")
    assert _run(["credentials", "generate-key", "--out", key_file])[0] == 0
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    common = ["--store", store, "--key-file", key_file]
    status, _, err = _run(
        [
            "credentials",
            "add",
            "harbor-pull",
            "--registry",
            "harbor.corp.example",
            "--username",
            "robot",
            "--password-stdin",
            *common,
        ],
        stdin=PASSWORD + "\n",
    )
    assert (status, "added credential 'harbor-pull'" in err) == (0, True)
    status, out, _ = _run(["credentials", "list", *common])
    assert status == 0
    assert "harbor-pull" in out
    assert "robot" in out
    assert PASSWORD not in out
    assert _run(["credentials", "remove", "harbor-pull", *common])[0] == 0
    assert _run(["credentials", "remove", "harbor-pull", *common])[0] == 1
    assert "harbor-pull" not in _run(["credentials", "list", *common])[1]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        pytest.param(
            ["add", "Bad_Name", "--registry", "h.example", "--username", "u", "--password-stdin"],
            "x\n",
            "must be lower-case letters",
            id="bad-name",
        ),
        pytest.param(
            ["add", "ok", "--registry", "h.example", "--username", "u"],
            "",
            "--password-stdin",
            id="password-as-argument",
        ),
        pytest.param(
            ["add", "ok", "--registry", "h.example", "--username", "u", "--password-stdin"],
            "",
            "no password on standard input",
            id="empty-stdin",
        ),
        pytest.param(["list"], "", "no such credential store", id="missing-store"),
        pytest.param(
            [
                "add",
                "ok",
                "--registry",
                "https://harbor.corp.example",
                "--username",
                "u",
                "--password-stdin",
            ],
            "x\n",
            '--registry: "https://harbor.corp.example" is not a valid registry host: '
            "write it without a scheme such as https://",
            id="registry-with-scheme",
        ),
        pytest.param(
            ["add", "ok", "--registry", "not a host!!", "--username", "u", "--password-stdin"],
            "x\n",
            '--registry: "not a host!!" is not a valid registry host: the host must be '
            "letters, digits, '-' and '.', then an optional :port",
            id="registry-not-a-host",
        ),
        pytest.param(
            [
                "add",
                "ok",
                "--registry",
                "Harbor.corp.example",
                "--username",
                "u",
                "--password-stdin",
            ],
            "x\n",
            "upper-case letters",
            id="registry-upper-case",
        ),
        pytest.param(
            ["add", "ok", "--registry", "docker.io", "--username", "u", "--password-stdin"],
            "x\n",
            "is Docker Hub itself, not a mirror",
            id="registry-docker-hub",
        ),
    ],
)
def test_credentials_command_errors(
    tmp_path: Path, args: list[str], stdin: str, message: str
) -> None:
    """Mistakes exit 2 with one line saying what is wrong."""
    key_file = tmp_path / "key"
    key_file.write_text(filestore.generate_key())
    key_file.chmod(0o600)
    status, _, err = _run(
        [
            "credentials",
            *args,
            "--store",
            str(tmp_path / "store.json"),
            "--key-file",
            str(key_file),
        ],
        stdin=stdin,
    )
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert not (tmp_path / "store.json").exists()


def _credentials_process(args: list[str], key_text: str) -> subprocess.Popen[bytes]:
    """`mirrorgate credentials ...` as a process of its own, as people run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "mirrorgate.webhook.cli", "credentials", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, filestore.KEY_ENV: key_text},
    )


def test_concurrent_adds_and_removes_all_take_effect(tmp_path: Path) -> None:
    """20 `credentials add` and 5 `remove` processes at once: every one of them lands."""
    key_text, store = filestore.generate_key(), str(tmp_path / "store.json")
    key = base64.b64decode(key_text)
    kept = [
        CREDENTIAL,
        *(
            Credential(name=f"old-{i}", registry="old.example", username="u", password=PASSWORD)
            for i in range(5)
        ),
    ]
    _write(store, key, {c.name: c for c in kept})
    processes = [
        _credentials_process(
            [
                "add",
                f"new-{i}",
                "--registry",
                "new.example",
                "--username",
                f"robot-{i}",
                "--password-stdin",
                "--store",
                store,
            ],
            key_text,
        )
        for i in range(20)
    ]
    processes += [
        _credentials_process(["remove", f"old-{i}", "--store", store], key_text) for i in range(5)
    ]
    errors = release_together(processes, [f"pw-{i}\n".encode() for i in range(20)] + [b""] * 5)
    assert [p.returncode for p in processes] == [0] * 25, errors
    contents = filestore.read_store(store, key)
    assert sorted(contents.credentials) == sorted(
        [CREDENTIAL.name, *(f"new-{i}" for i in range(20))]
    )
    assert contents.credentials["new-7"].password == "pw-7"
    assert contents.generation == 1 + 25


def test_a_writer_waits_for_the_lock_then_gives_up_writing_nothing(
    tmp_path: Path, key: bytes
) -> None:
    """A store whose lock stays held is not written: a clear error, the store unchanged."""
    store = tmp_path / "store.json"
    _write(str(store), key, {CREDENTIAL.name: CREDENTIAL})
    before = store.read_bytes()
    fd = os.open(tmp_path / ".store.json.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(StoreError) as refused:
            filestore.update_store(str(store), key, lambda contents: {}, lock_timeout=0.3)
    finally:
        os.close(fd)
    assert str(refused.value) == (
        f"{store}: another writer has held the store's lock ({tmp_path}/.store.json.lock) for "
        "0.3 s; nothing was written, try again"
    )
    assert store.read_bytes() == before
    filestore.update_store(str(store), key, lambda contents: {})  # released: it goes ahead
    assert filestore.read_store(str(store), key).credentials == {}


def test_a_change_by_a_writer_without_the_lock_is_never_overwritten(
    tmp_path: Path, key: bytes
) -> None:
    """If the file changes between the locked read and the write, nothing is written."""
    store = str(tmp_path / "store.json")
    _write(store, key, {})
    other = Credential(name="other", registry="o.example", username="u", password=PASSWORD)

    def meanwhile(contents: filestore.StoreContents) -> dict[str, Credential]:
        _write(store, key, {other.name: other})  # e.g. an older mirrorgate: no lock taken
        return {CREDENTIAL.name: CREDENTIAL}

    with pytest.raises(
        StoreError,
        match=r"changed by another writer while this one held the "
        r"lock .*; nothing was written, try again",
    ):
        filestore.update_store(store, key, meanwhile)
    assert filestore.read_store(store, key).credentials == {other.name: other}
