"""`mirrorgate credentials add NAME --registry HOST --from-docker-config FILE`: the login
docker wrote, imported into the encrypted store; helpers named, secrets never printed."""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from mirrorgate.webhook import cli
from mirrorgate.webhook.credentials import dockerconfig, filestore

SECRET = "s3cr3t-Pa55"
HOST = "cache.dev.example:5443"


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _run(
    tmp_path: Path, config: dict[str, Any] | str, *extra: str, registry: str = HOST
) -> tuple[int, str, str, Path]:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    key_file = tmp_path / "key"
    if not key_file.exists():
        key_file.write_text(filestore.generate_key())
        key_file.chmod(0o600)
    store = tmp_path / "store.json"
    out, err = io.StringIO(), io.StringIO()
    real_stdin, sys.stdin = sys.stdin, io.StringIO("")
    try:
        status = cli.main(
            [
                "credentials",
                "add",
                "dev-cache",
                "--registry",
                registry,
                "--from-docker-config",
                str(path),
                *extra,
                "--store",
                str(store),
                "--key-file",
                str(key_file),
            ],
            out=out,
            err=err,
        )
    finally:
        sys.stdin = real_stdin
    return status, out.getvalue(), err.getvalue(), store


def _stored(tmp_path: Path) -> tuple[str, str, str]:
    key = filestore.load_key(key_file=str(tmp_path / "key"), environ={})
    credential = filestore.read_store(str(tmp_path / "store.json"), key).credentials["dev-cache"]
    return credential.registry, credential.username, credential.password


@pytest.mark.parametrize(
    ("entry", "login"),
    [
        pytest.param({"auth": _auth("robot", SECRET)}, ("robot", SECRET), id="auth"),
        pytest.param(
            {"username": "robot", "password": SECRET}, ("robot", SECRET), id="username-password"
        ),
        pytest.param(
            {"auth": _auth("robot", SECRET), "username": "robot", "password": SECRET},
            ("robot", SECRET),
            id="both-as-docker-writes",
        ),
        pytest.param({"identitytoken": SECRET}, ("<token>", SECRET), id="identitytoken"),
        pytest.param(
            {"auth": _auth("00000000-0000-0000-0000-000000000000", ""), "identitytoken": SECRET},
            ("00000000-0000-0000-0000-000000000000", SECRET),
            id="identitytoken-with-user",
        ),
    ],
)
def test_auths_entries_are_imported_and_the_secret_never_printed(
    tmp_path: Path, entry: dict[str, str], login: tuple[str, str]
) -> None:
    status, out, err, _ = _run(
        tmp_path, {"auths": {"other.example": {"auth": _auth("x", "y")}, HOST: entry}}
    )
    assert status == 0, err
    assert _stored(tmp_path) == (HOST, *login)
    assert f"added credential 'dev-cache' for {HOST}" in err
    assert SECRET not in out + err
    assert _auth("robot", SECRET) not in out + err


@pytest.mark.parametrize("key", [f"https://{HOST}", f"https://{HOST}/", f"http://{HOST}/v1/"])
def test_url_keys_are_read_as_docker_reads_them(tmp_path: Path, key: str) -> None:
    status, _, err, _ = _run(tmp_path, {"auths": {key: {"auth": _auth("robot", SECRET)}}})
    assert status == 0, err
    assert _stored(tmp_path)[1:] == ("robot", SECRET)


def test_a_registry_with_a_path_uses_its_own_entry_before_the_hosts(tmp_path: Path) -> None:
    status, _, err, _ = _run(
        tmp_path,
        {
            "auths": {
                HOST: {"auth": _auth("host-robot", "a")},
                f"{HOST}/quay": {"auth": _auth("quay-robot", SECRET)},
            }
        },
        registry=f"{HOST}/quay",
    )
    assert status == 0, err
    assert _stored(tmp_path) == (f"{HOST}/quay", "quay-robot", SECRET)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param(
            {"auths": {HOST: {}}, "credsStore": "desktop"},
            f"the login for {HOST} is kept by the credential helper docker-credential-"
            "desktop (credsStore), not in the file",
            id="creds-store",
        ),
        pytest.param(
            {"auths": {HOST: {"auth": _auth("robot", SECRET)}}, "credHelpers": {HOST: "ecr-login"}},
            f"the login for {HOST} is kept by the credential helper docker-credential-"
            f"ecr-login (credHelpers['{HOST}']), not in the file",
            id="cred-helper-wins",
        ),
        pytest.param(
            {"auths": {"other.example": {"auth": _auth("x", SECRET)}}},
            f"no login for {HOST} in auths (entries: 'other.example')",
            id="no-entry",
        ),
        pytest.param({"auths": {HOST: {}}}, f"auths['{HOST}'] holds no login", id="empty-entry"),
        pytest.param(
            {"auths": {HOST: {"auth": "not base64!" + SECRET}}},
            f"auths['{HOST}'].auth is not base64 of user:password",
            id="bad-base64",
        ),
        pytest.param(
            {"auths": {HOST: {"auth": base64.b64encode(SECRET.encode()).decode()}}},
            "is not base64 of user:password (no ':')",
            id="auth-without-colon",
        ),
        pytest.param(
            {"auths": {HOST: {"password": SECRET}}},
            "has a password but no user name",
            id="password-without-user",
        ),
        pytest.param(
            {"auths": {HOST: {"password": 5}}},
            f"auths['{HOST}'].password must be a string",
            id="password-not-a-string",
        ),
        pytest.param(
            '{"auths": {"' + HOST + '": {"auth": "' + SECRET + '"',
            "not valid JSON at line 1",
            id="truncated-json",
        ),
        pytest.param([], "not a docker config", id="not-an-object"),
    ],
)
def test_unusable_configs_get_a_clear_error_without_the_secret(
    tmp_path: Path, config: Any, message: str
) -> None:
    status, out, err, store = _run(tmp_path, config)
    assert status == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert SECRET not in out + err
    assert "Traceback" not in err
    assert not store.exists()


def test_the_login_comes_from_the_file_only(tmp_path: Path) -> None:
    status, _, err, store = _run(
        tmp_path, {"auths": {HOST: {"auth": _auth("robot", SECRET)}}}, "--username", "someone"
    )
    assert status == 2
    assert "leave out --username and --password-stdin" in err
    assert not store.exists()


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        dockerconfig.DockerConfigError, match=r"missing\.json: cannot read: No such file"
    ):
        dockerconfig.read_login(str(tmp_path / "missing.json"), HOST)


def test_the_login_repr_hides_the_password() -> None:
    assert SECRET not in repr(dockerconfig.Login("robot", SECRET))
