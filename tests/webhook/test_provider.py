"""Logins from a real credential-provider plugin (Go, built by the suite) and a real issuer."""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import orjson
import pytest

from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.credentials import providerconfig
from mirrorgate.webhook.credentials.kubestore import KubernetesCredentialStore
from mirrorgate.webhook.credentials.pluginrunner import LocalRunner
from mirrorgate.webhook.credentials.provider import ProviderError, ProviderSource
from mirrorgate.webhook.credentials.refresher import ProviderRefresher
from mirrorgate.webhook.logs import JsonFormatter
from tests.e2e.harness.providers import RobotIssuer

IMAGE = "a.example/team-a/app:1"


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


class Recorder(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def said(records: list[logging.LogRecord]) -> list[str]:
    """The stderr lines logged from plugins."""
    return [
        getattr(r, "fields", {})["stderr"]
        for r in records
        if r.getMessage() == "credential provider said"
    ]


@pytest.fixture
def logged() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = Recorder(records)
    log = logging.getLogger("mirrorgate")
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    yield records
    log.removeHandler(handler)
    log.setLevel(level)


def _source(
    issuer: RobotIssuer,
    tmp_path: Path,
    *,
    args: list[str] | None = None,
    timeout: float = 30.0,
    clock: Clock | None = None,
    **provider: Any,
) -> ProviderSource:
    config = issuer.write_config(
        tmp_path / "config.json", issuer.provider("test-provider", "robot-a", args=args, **provider)
    )
    return ProviderSource(
        providerconfig.load(config),
        LocalRunner(issuer.bin_dir, timeout=timeout),
        clock=clock or Clock(),
    )


def test_a_login_is_minted_with_its_lifetime(issuer: RobotIssuer, tmp_path: Path) -> None:
    clock = Clock()
    source = _source(issuer, tmp_path, args=["--cache-duration", "90s"], clock=clock)
    login = source.login("team-a", "test-provider", IMAGE)
    assert (login.name, login.registry, login.username) == ("team-a", "a.example", "robot-a")
    assert issuer.server.passwords.valid("robot-a", login.password)
    assert login.expires == datetime.datetime.fromtimestamp(clock.now + 90, datetime.UTC)
    assert login.password not in repr(login)
    assert login.password not in str(login)


def test_the_default_cache_duration_applies_without_one_in_the_response(
    issuer: RobotIssuer, tmp_path: Path
) -> None:
    clock = Clock()
    source = _source(issuer, tmp_path, clock=clock, default_cache_duration="2m")
    login = source.login("team-a", "test-provider", IMAGE)
    assert login.expires == datetime.datetime.fromtimestamp(clock.now + 120, datetime.UTC)


@pytest.mark.parametrize(
    ("key_type", "other_image", "reused"),
    [
        ("Image", IMAGE, True),
        ("Image", "a.example/team-a/other:1", False),
        ("Registry", "a.example/team-a/other:1", True),
        ("Registry", "b.example/team-a/app:1", False),
        ("Global", "b.example/team-a/app:1", True),
    ],
)
def test_responses_are_cached_by_their_cache_key_type(
    issuer: RobotIssuer, tmp_path: Path, key_type: str, other_image: str, reused: bool
) -> None:
    source = _source(
        issuer, tmp_path, args=["--cache-key-type", key_type, "--auth-key", "*.example"]
    )
    first = source.login("team-a", "test-provider", IMAGE)
    minted = issuer.server.minted
    second = source.login("team-a", "test-provider", other_image)
    assert (second.password == first.password) is reused
    assert issuer.server.minted == minted + (0 if reused else 1)


def test_a_cached_login_is_asked_for_again_after_80_percent_of_its_life(
    issuer: RobotIssuer, tmp_path: Path
) -> None:
    clock = Clock()
    source = _source(issuer, tmp_path, clock=clock)  # 60 s
    first = source.login("a", "test-provider", IMAGE)
    clock.now += 47
    assert source.login("a", "test-provider", IMAGE).password == first.password
    clock.now += 1  # 48 s: 80 %
    renewed = source.login("a", "test-provider", IMAGE)
    assert renewed.password != first.password
    assert renewed.expires is not None
    assert first.expires is not None
    assert renewed.expires > first.expires


def test_the_most_specific_auth_key_covering_the_image_is_used(
    issuer: RobotIssuer, tmp_path: Path
) -> None:
    source = _source(issuer, tmp_path, args=["--auth-key", "a.example/team-a"])
    assert source.login("a", "test-provider", IMAGE).registry == "a.example/team-a"
    with pytest.raises(ProviderError, match="no auth key covers image"):
        source.login("a", "test-provider", "a.example/team-b/app:1")


def test_the_request_carries_the_configured_api_version(
    issuer: RobotIssuer, tmp_path: Path
) -> None:
    """The plugin answers in the apiVersion it was asked in (v1beta1 here)."""
    source = _source(issuer, tmp_path, api_version="credentialprovider.kubelet.k8s.io/v1beta1")
    assert source.login("a", "test-provider", IMAGE).username == "robot-a"


@pytest.mark.parametrize(
    ("args", "provider", "message"),
    [
        (
            ["--api-version", "credentialprovider.kubelet.k8s.io/v1beta1"],
            {},
            "plugin 'test-provider': apiVersion 'credentialprovider.kubelet.k8s.io/v1beta1' "
            "does not match the configured credentialprovider.kubelet.k8s.io/v1",
        ),
        (["--fault", "exit"], {}, "plugin 'test-provider' failed with exit status 1"),
        (["--fault", "malformed"], {}, "plugin 'test-provider' did not answer with JSON"),
        ([], {"default_cache_duration": "0s"}, "the login has no lifetime"),
        (["--cache-key-type", "Forever"], {}, "cacheKeyType 'Forever' is not one of"),
        (
            ["--cache-duration", "soon"],
            {},
            "cacheDuration 'soon' is not a duration from 0 to 2562047h (such as 12h)",
        ),
        # Past Go's range: it was an OverflowError out of the expiry's datetime.
        (["--cache-duration", "100000000h"], {}, "cacheDuration '100000000h' is not a duration"),
        (["--cache-duration", "9" * 400 + "h"], {}, "cacheDuration '9999999999"),
    ],
)
def test_plugin_failures_are_one_line_reasons(
    issuer: RobotIssuer, tmp_path: Path, args: list[str], provider: dict[str, Any], message: str
) -> None:
    source = _source(issuer, tmp_path, args=args, **provider)
    with pytest.raises(ProviderError) as caught:
        source.login("a", "test-provider", IMAGE)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_hanging_plugin_is_killed_at_the_timeout(
    issuer: RobotIssuer, tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    source = _source(issuer, tmp_path, args=["--fault", "hang"], timeout=1.0)
    with pytest.raises(ProviderError, match="did not answer within 1 s and was killed"):
        source.login("a", "test-provider", IMAGE)
    assert said(logged) == ["test-credential-provider: hanging on purpose"]


def test_a_plugin_writing_without_end_is_killed_at_the_output_limit(
    issuer: RobotIssuer, tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    source = _source(issuer, tmp_path, args=["--fault", "flood"])
    with pytest.raises(ProviderError, match="wrote more than 1048576 bytes and was killed"):
        source.login("a", "test-provider", IMAGE)
    [stderr] = said(logged)
    assert 0 < len(stderr) <= 8 << 10  # only the tail is kept


def test_images_outside_match_images_and_unknown_providers(
    issuer: RobotIssuer, tmp_path: Path
) -> None:
    source = _source(issuer, tmp_path)
    with pytest.raises(ProviderError, match="does not match provider 'test-provider'"):
        source.login("a", "test-provider", "quay.io/team-a/app:1")
    with pytest.raises(
        ProviderError,
        match=r"provider 'ecr' is not in the credential-provider "
        r"config \(it has: test-provider\)",
    ):
        source.login("a", "ecr", IMAGE)


def test_echoed_secrets_are_redacted_from_the_logged_stderr(
    issuer: RobotIssuer, tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    source = _source(issuer, tmp_path, args=["--fault", "echo"])
    login = source.login("a", "test-provider", IMAGE)
    # The provider's env values are redacted too (they may be secrets; here
    # the robot's name is one of them).
    assert said(logged) == ["debug: minted password [redacted] for [redacted]"]
    for record in logged:
        assert login.password not in record.getMessage() + repr(getattr(record, "fields", ""))


@pytest.fixture
def minted(issuer: RobotIssuer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The passwords the issuer mints, as it mints them."""
    passwords: list[str] = []
    mint = issuer.server.passwords.mint

    def recording(robot: str, ttl: int) -> str:
        passwords.append(mint(robot, ttl))
        return passwords[-1]

    monkeypatch.setattr(issuer.server.passwords, "mint", recording)
    return passwords


def _assert_no_form_of(minted: list[str], texts: list[str]) -> None:
    """No form of the one password the plugin was given (suffixed) is in any of ``texts``."""
    [password] = [m + _ESCAPED for m in minted]
    forms = {
        "raw": password,
        "log-escaped": orjson.dumps(password).decode()[1:-1],
        "ascii-escaped": json.dumps(password)[1:-1],
        "go-escaped": orjson.dumps(password)
        .decode()[1:-1]
        .replace("<", "\\u003c")
        .replace("&", "\\u0026"),
        "auth": base64.b64encode(f"robot-a:{password}".encode()).decode(),
        "minted": minted[0],
    }
    for text in texts:
        for name, form in forms.items():
            assert form not in text, f"the {name} form of the password is in {text!r}"


# JSON escapes each of these, and not all in the same way: Go writes < and &
# as \u003c and \u0026, a log line writes " and \ as \" and \\, ASCII JSON é as \u00e9.
_ESCAPED = '"<&\\é'


# Each way an answer that echoed its password fails, and the reason it fails with.
_ECHOING_FAILURES = [
    pytest.param(["--exit-status", "3"], 30.0, "failed with exit status 3", id="exit-3"),
    pytest.param(
        ["--kind", "CredentialProviderRequest"],
        30.0,
        "kind is 'CredentialProviderRequest', not CredentialProviderResponse",
        id="wrong-kind",
    ),
    pytest.param(
        ["--cache-duration", "0s"], 30.0, "the login has no lifetime", id="cache-duration-0"
    ),
    pytest.param(
        ["--cache-duration", "-1h"],
        30.0,
        "cacheDuration '-1h' is not a duration",
        id="cache-duration-negative",
    ),
    pytest.param(["--after", "flood"], 30.0, "wrote more than 1048576 bytes", id="too-much"),
    pytest.param(["--after", "hang"], 1.0, "did not answer within 1 s", id="timeout"),
    pytest.param(["--after", "garbage"], 30.0, "did not answer with JSON", id="bad-json"),
    pytest.param(["--after", "deep"], 30.0, "did not answer with JSON", id="deep-json"),
    pytest.param(
        ["--decoys", "40", "--exit-status", "3"], 30.0, "failed with exit status 3", id="huge-auth"
    ),
    pytest.param(
        ["--decoys", "40", "--after", "flood"],
        30.0,
        "wrote more than 1048576 bytes",
        id="huge-auth-flood",
    ),
]


def _refresh(source: ProviderSource, logged: list[logging.LogRecord]) -> str:
    """One refresh by the refresher serve's leader runs; the reason it logged the failure with."""
    # Never started: a failed refresh reads the store's (empty) snapshot and writes nothing.
    client = kube.Kube(kubernetes.client.ApiClient())
    refresher = ProviderRefresher(
        source,
        client,
        store=KubernetesCredentialStore(client, "mirrorgate"),
        mirror_policy=lambda: pytest.fail("not asked"),
        is_leader=lambda: True,
    )
    refresher.refresh("a", "test-provider", IMAGE)
    [failed] = [r for r in logged if r.getMessage() == "credential refresh failed"]
    return str(getattr(failed, "fields", {})["reason"])


@pytest.mark.parametrize("path", ["credentials-check", "serve"])
@pytest.mark.parametrize(("args", "timeout", "message"), _ECHOING_FAILURES)
def test_a_refused_answer_leaks_no_form_of_its_password(
    issuer: RobotIssuer,
    tmp_path: Path,
    logged: list[logging.LogRecord],
    minted: list[str],
    args: list[str],
    timeout: float,
    message: str,
    path: str,
) -> None:
    """The plugin echoes its password, then fails: no form of it in any line or reason,
    whether `credentials check` asked (the reason is its message) or serve's refresher did
    (the reason is in its warning; every line formatted as serve writes it)."""
    source = _source(
        issuer,
        tmp_path,
        args=["--echo-secret", "--password-suffix", _ESCAPED, *args],
        timeout=timeout,
    )
    if path == "serve":
        reason = _refresh(source, logged)
        assert re.search(re.escape(message), reason), reason
    else:
        with pytest.raises(ProviderError, match=re.escape(message)) as caught:
            source.login("a", "test-provider", IMAGE)
        reason = str(caught.value)
    [stderr] = said(logged)
    # What was echoed is there, less the password in every form.
    assert stderr.startswith(
        'debug: password [redacted]\ndebug: auth [redacted]\ndebug: response {"apiVersion":'
    )
    assert '"password":"[redacted]"' in stderr
    _assert_no_form_of(minted, [*map(JsonFormatter().format, logged), reason])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper has stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def test_a_child_in_its_own_session_neither_delays_the_answer_nor_survives(
    issuer: RobotIssuer, tmp_path: Path
) -> None:
    """The plugin answers and exits; a setsid child holding its pipes is killed, not waited on."""
    pid_file = tmp_path / "child.pid"
    source = _source(issuer, tmp_path, args=["--spawn-setsid", str(pid_file)], timeout=20.0)
    started = time.monotonic()
    try:
        login = source.login("a", "test-provider", IMAGE)
        took = time.monotonic() - started
        child = int(pid_file.read_text())
        assert login.username == "robot-a"
        assert took < 10.0, f"waited {took:.1f} s for the child's pipes"
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:  # what a failure would leave behind
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
