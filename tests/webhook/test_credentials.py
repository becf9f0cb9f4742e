"""Credentials: the value type, the pull-secret payload, and the encrypted file store."""

from __future__ import annotations

import base64
import io
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from webhook import cli, filestore
from webhook.credentials import Credential, StoreError, from_dockerconfigjson

PASSWORD = "p@ss:w/rd-7f3a9c"  # a canary: it must never show anywhere but the payload
CREDENTIAL = Credential(name="harbor-pull", registry="harbor.corp.example",
                        username="robot$pull", password=PASSWORD)


def test_repr_and_str_hide_the_password() -> None:
    """Neither repr() nor str() of a credential shows its password."""
    for text in (repr(CREDENTIAL), str(CREDENTIAL)):
        assert PASSWORD not in text
        assert "harbor-pull" in text


def test_dockerconfigjson_holds_one_login_with_auth() -> None:
    """The payload is the kubelet's format: username, password and auth for one registry."""
    config = json.loads(CREDENTIAL.dockerconfigjson())
    assert config == {"auths": {"harbor.corp.example": {
        "username": "robot$pull", "password": PASSWORD,
        "auth": base64.b64encode(f"robot$pull:{PASSWORD}".encode()).decode()}}}


def test_content_hash_follows_the_content() -> None:
    """The hash changes with any field of the login and is stable otherwise."""
    same = Credential(name="harbor-pull", registry="harbor.corp.example",
                      username="robot$pull", password=PASSWORD)
    other = Credential(name="harbor-pull", registry="harbor.corp.example",
                       username="robot$pull", password=PASSWORD + "x")
    assert same.content_hash() == CREDENTIAL.content_hash()
    assert other.content_hash() != CREDENTIAL.content_hash()
    assert PASSWORD not in CREDENTIAL.content_hash()


@pytest.mark.parametrize(("payload", "expected"), [
    pytest.param({"auths": {"https://harbor.corp.example/v1/": {
        "username": "u", "password": "p"}}}, ("harbor.corp.example", "u", "p"),
        id="kubectl-url-key"),
    pytest.param({"auths": {"127.0.0.1:5002": {"auth": base64.b64encode(b"u:p:q").decode()}}},
                 ("127.0.0.1:5002", "u", "p:q"), id="auth-only"),
])
def test_reads_what_kubectl_and_docker_write(payload: dict[str, Any],
                                              expected: tuple[str, str, str]) -> None:
    """Keys written as URLs and logins given only as `auth` are both understood."""
    found = from_dockerconfigjson("c", json.dumps(payload).encode(), where="Secret x/c")
    assert (found.registry, found.username, found.password) == expected


@pytest.mark.parametrize(("payload", "message"), [
    pytest.param(b"{not json", "Secret x/c: .dockerconfigjson is not valid JSON", id="not-json"),
    pytest.param(b'{"auths": {}}', "exactly one registry under 'auths' (found 0)", id="empty"),
    pytest.param(json.dumps({"auths": {"a": {"username": "u", "password": PASSWORD},
                                       "b": {"username": "u", "password": PASSWORD}}}).encode(),
                 "exactly one registry under 'auths' (found 2)", id="two"),
    pytest.param(b'{"auths": {"a": {"username": "u"}}}', "has no username and password",
                 id="no-password"),
])
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


def test_store_round_trip_is_encrypted_and_private(tmp_path: Path, key: bytes) -> None:
    """What is written reads back; on disk there is no plaintext, and the file is 0600."""
    path = str(tmp_path / "store.json")
    filestore.write_store(path, key, {CREDENTIAL.name: CREDENTIAL})
    assert filestore.read_store(path, key) == {CREDENTIAL.name: CREDENTIAL}
    raw = Path(path).read_bytes()
    assert PASSWORD.encode() not in raw
    assert b"robot" not in raw
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["store.json"]  # no temporary left


def test_wrong_key_is_an_error_naming_the_file(tmp_path: Path, key: bytes) -> None:
    """Another key never reads as an empty store: it is an error that names the file."""
    path = str(tmp_path / "store.json")
    filestore.write_store(path, key, {CREDENTIAL.name: CREDENTIAL})
    other = base64.b64decode(filestore.generate_key())
    with pytest.raises(StoreError) as refused:
        filestore.read_store(path, other)
    assert str(refused.value) == f"{path}: cannot decrypt: wrong key, or the file is damaged"


@pytest.mark.parametrize("damage", [
    pytest.param(lambda raw: raw[:-12] + b'AAAAAAAA"}', id="ciphertext-flipped"),
    pytest.param(lambda raw: raw.replace(b"mirrorgate-credentials/v1", b"something-else/v1"),
                 id="other-format"),
    pytest.param(lambda raw: b"garbage", id="garbage"),
    pytest.param(lambda raw: b"", id="empty"),
])
def test_damaged_file_is_an_error_naming_the_file(tmp_path: Path, key: bytes,
                                                  damage: Any) -> None:
    """Any damage is detected (GCM authenticates) and reported with the file's name."""
    path = tmp_path / "store.json"
    filestore.write_store(str(path), key, {CREDENTIAL.name: CREDENTIAL})
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StoreError) as refused:
        filestore.read_store(str(path), key)
    assert str(path) in str(refused.value)


@pytest.mark.parametrize(("key_text", "message"), [
    pytest.param("not base64!!", "is not base64", id="not-base64"),
    pytest.param(base64.b64encode(b"short").decode(), r"must be 32 bytes \(got 5\)", id="short"),
])
def test_bad_keys_are_named(tmp_path: Path, key_text: str, message: str) -> None:
    """A key that is not 32 base64 bytes is refused, naming where it came from."""
    key_file = tmp_path / "key"
    key_file.write_text(key_text)
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
    filestore.write_store(path, key, {CREDENTIAL.name: CREDENTIAL})
    store = filestore.FileCredentialStore(path, key)
    changes: list[int] = []
    store.subscribe(lambda: changes.append(1))
    Path(path).write_bytes(b"garbage")
    with pytest.raises(StoreError):
        store.reload()
    assert store.snapshot() == {CREDENTIAL.name: CREDENTIAL}
    assert store.problem() is not None
    assert changes == []
    filestore.write_store(path, key, {})
    store.reload()
    assert store.snapshot() == {}
    assert store.problem() is None
    assert changes == [1]
    assert PASSWORD not in repr(store)


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
    status, _, err = _run(["credentials", "add", "harbor-pull", "--registry",
                           "harbor.corp.example", "--username", "robot", "--password-stdin",
                           *common], stdin=PASSWORD + "\n")
    assert (status, "added credential 'harbor-pull'" in err) == (0, True)
    status, out, _ = _run(["credentials", "list", *common])
    assert status == 0
    assert "harbor-pull" in out
    assert "robot" in out
    assert PASSWORD not in out
    assert _run(["credentials", "remove", "harbor-pull", *common])[0] == 0
    assert _run(["credentials", "remove", "harbor-pull", *common])[0] == 1
    assert "harbor-pull" not in _run(["credentials", "list", *common])[1]


@pytest.mark.parametrize(("args", "stdin", "message"), [
    pytest.param(["add", "Bad_Name", "--registry", "h.example", "--username", "u",
                  "--password-stdin"], "x\n", "must be lower-case letters", id="bad-name"),
    pytest.param(["add", "ok", "--registry", "h.example", "--username", "u"], "",
                 "--password-stdin", id="password-as-argument"),
    pytest.param(["add", "ok", "--registry", "h.example", "--username", "u",
                  "--password-stdin"], "", "no password on standard input", id="empty-stdin"),
    pytest.param(["list"], "", "no such credential store", id="missing-store"),
    pytest.param(["add", "ok", "--registry", "https://harbor.corp.example", "--username", "u",
                  "--password-stdin"], "x\n",
                 '--registry: "https://harbor.corp.example" is not a valid registry host: '
                 "write it without a scheme such as https://", id="registry-with-scheme"),
    pytest.param(["add", "ok", "--registry", "not a host!!", "--username", "u",
                  "--password-stdin"], "x\n",
                 '--registry: "not a host!!" is not a valid registry host: the host must be '
                 "letters, digits, '-' and '.', then an optional :port", id="registry-not-a-host"),
    pytest.param(["add", "ok", "--registry", "Harbor.corp.example", "--username", "u",
                  "--password-stdin"], "x\n", "upper-case letters", id="registry-upper-case"),
    pytest.param(["add", "ok", "--registry", "docker.io", "--username", "u",
                  "--password-stdin"], "x\n", "is Docker Hub itself, not a mirror",
                 id="registry-docker-hub"),
])
def test_credentials_command_errors(tmp_path: Path, args: list[str], stdin: str,
                                    message: str) -> None:
    """Mistakes exit 2 with one line saying what is wrong."""
    key_file = tmp_path / "key"
    key_file.write_text(filestore.generate_key())
    status, _, err = _run(["credentials", *args, "--store", str(tmp_path / "store.json"),
                           "--key-file", str(key_file)], stdin=stdin)
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert not (tmp_path / "store.json").exists()
