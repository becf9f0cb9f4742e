"""Plugins run by `mirrorgate plugin-host`, a real process, through its socket, and what they see.

The real Go test plugin mints real logins from the test issuer; with
``--report`` it writes the names of its environment to stderr, which is how
these tests see what a plugin is given.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirrorgate.webhook.credentials import pluginhost, providerconfig
from mirrorgate.webhook.credentials.pluginrunner import LocalRunner, ProviderError, plugin_env
from mirrorgate.webhook.credentials.provider import ProviderSource
from tests.commands import MIRRORGATE
from tests.e2e.harness.plugins import plugin_host
from tests.e2e.harness.procs import ManagedProcess, wait_until
from tests.e2e.harness.providers import RobotIssuer

IMAGE = "a.example/team-a/app:1"
# What mirrorgate's container holds that no plugin may see: the API server's
# address, the store key, and a setting of the operator's for mirrorgate alone.
PRIVATE = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
    "MIRRORGATE_STORE_KEY": "c3RvcmUta2V5LW5vdC1mb3ItcGx1Z2lucw==",
    "MIRRORGATE_SOMETHING": "x",
}
CLOUD = {"AWS_ROLE_ARN": "arn:aws:iam::1:role/r", "HTTPS_PROXY": "http://proxy.example:3128"}


def _reported(stderr: bytes) -> tuple[set[str], str]:
    match = re.search(rb"report: env=(\S*) token=(\S+)", stderr)
    assert match, stderr
    return set(match.group(1).decode().split(",")), match.group(2).decode()


@pytest.fixture
def config(issuer: RobotIssuer, tmp_path: Path) -> Path:
    return issuer.write_config(
        tmp_path / "config.json",
        issuer.provider("test-provider", "robot-a", args=["--report"]),
        issuer.provider("other-provider", "robot-a", match_images=["b.example"]),
    )


@pytest.fixture
def host(
    config: Path, issuer: RobotIssuer, tmp_path: Path
) -> Iterator[tuple[ManagedProcess, Path]]:
    with plugin_host(tmp_path, config, issuer.bin_dir, env={**PRIVATE, **CLOUD}) as running:
        yield running


def test_a_plugin_in_the_host_mints_a_login_and_sees_only_the_allowed_environment(
    host: tuple[ManagedProcess, Path], config: Path, issuer: RobotIssuer
) -> None:
    process, socket_path = host
    loaded = providerconfig.load(config)
    client = pluginhost.HostClient(socket_path, timeout=5)
    source = ProviderSource(loaded, client)
    login = source.login("team-a", "test-provider", IMAGE)
    assert issuer.server.passwords.valid("robot-a", login.password)
    finished = client.run(loaded.providers["test-provider"], IMAGE)
    names, _ = _reported(finished.stderr)
    assert not names & set(PRIVATE), names
    assert not [n for n in names if n.startswith("KUBERNETES_")]
    # The cloud's identity and proxy pass, and so does the provider's own env.
    assert {*CLOUD, "TOKEN_URL", "ROBOT", "ROBOT_SECRET", "CA_FILE"} <= names
    # The host logs that it ran, and nothing the plugin wrote.
    wait_until(
        lambda: None if process.log_text().count("plugin host: ran a plugin") >= 2 else "not yet",
        timeout=10,
        what="the host's run lines",
    )
    log = process.log_text()
    assert login.password not in log
    assert "report:" not in log


def test_a_plugin_run_here_gets_the_same_allow_list(
    config: Path, issuer: RobotIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**PRIVATE, **CLOUD}.items():
        monkeypatch.setenv(name, value)
    provider = providerconfig.load(config).providers["test-provider"]
    finished = LocalRunner(issuer.bin_dir, timeout=10).run(provider, IMAGE)
    names, _ = _reported(finished.stderr)
    assert not names & set(PRIVATE), names
    assert set(CLOUD) <= names
    assert set(plugin_env(os.environ, provider)) == names - {"MIRRORGATE_PLUGIN_RUN"}


def test_the_host_runs_only_what_its_own_config_names(
    host: tuple[ManagedProcess, Path], config: Path
) -> None:
    _, socket_path = host
    client = pluginhost.HostClient(socket_path, timeout=5)
    loaded = providerconfig.load(config)
    stranger = dataclasses.replace(loaded.providers["test-provider"], name="stranger")
    with pytest.raises(ProviderError, match=r"provider 'stranger' is not in the plugin host's"):
        client.run(stranger, IMAGE)
    with pytest.raises(ProviderError, match=r"does not match provider 'other-provider'"):
        client.run(loaded.providers["other-provider"], IMAGE)


def test_a_missing_socket_says_what_to_start(tmp_path: Path, config: Path) -> None:
    provider = providerconfig.load(config).providers["test-provider"]
    client = pluginhost.HostClient(tmp_path / "none.sock", timeout=1)
    with pytest.raises(ProviderError, match=r"does not exist: is the plugin-host container"):
        client.run(provider, IMAGE)


def test_an_oversized_or_cut_request_is_dropped_and_the_next_is_served(
    host: tuple[ManagedProcess, Path], config: Path
) -> None:
    process, socket_path = host
    for sent in (struct.pack(">I", pluginhost.REQUEST_LIMIT + 1), struct.pack(">I", 100) + b"{"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(socket_path))
            raw.sendall(sent)
            raw.shutdown(socket.SHUT_WR)
            raw.settimeout(10)
            assert raw.recv(10) == b""  # closed without an answer
    assert process.log_text().count("plugin host: request dropped") == 2
    provider = providerconfig.load(config).providers["test-provider"]
    assert pluginhost.HostClient(socket_path, timeout=5).run(provider, IMAGE).returncode == 0


def test_an_answer_over_the_limit_is_refused(tmp_path: Path, config: Path) -> None:
    # A fault the real host cannot make: a peer that claims a huge answer.
    path = tmp_path / "h.sock"
    listener = pluginhost.listen(path)

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 << 16)  # the request
            conn.sendall(struct.pack(">I", 3 << 20))

    peer = threading.Thread(target=answer)
    peer.start()
    provider = providerconfig.load(config).providers["test-provider"]
    try:
        with pytest.raises(ProviderError, match=r"answer is 3145728 bytes, over the limit"):
            pluginhost.HostClient(path, timeout=1).run(provider, IMAGE)
    finally:
        peer.join()
        listener.close()


def test_sigterm_stops_the_host_and_removes_its_socket(
    config: Path, issuer: RobotIssuer, tmp_path: Path
) -> None:
    with plugin_host(tmp_path, config, issuer.bin_dir) as (process, socket_path):
        os.kill(process.pid, signal.SIGTERM)
        wait_until(
            lambda: None if process.exited() else "running", timeout=10, what="plugin-host to exit"
        )
        assert process.exited() == "plugin-host exited with status 0"
        assert not socket_path.exists()


def test_the_host_refuses_a_path_that_is_not_a_socket(
    config: Path, issuer: RobotIssuer, tmp_path: Path
) -> None:
    taken = tmp_path / "file"
    taken.write_text("mine")
    result = subprocess.run(
        [
            *MIRRORGATE,
            "plugin-host",
            "--socket",
            str(taken),
            "--credential-provider-config",
            str(config),
            "--credential-provider-bin-dir",
            str(issuer.bin_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        result.stderr == f"mirrorgate: error: --socket {str(taken)!r}: exists and is not a socket\n"
    )
    assert taken.read_text() == "mine"


def test_credentials_check_runs_the_plugin_in_the_host(
    host: tuple[ManagedProcess, Path], config: Path, tmp_path: Path
) -> None:
    _, socket_path = host
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "mirrors: [{source: src.example, mirror: a.example/team-a, credential: team-a}]\n"
        "credentials: {team-a: {namespaces: ['*'], provider: test-provider}}\n"
    )
    result = subprocess.run(
        [
            *MIRRORGATE,
            "credentials",
            "check",
            "team-a",
            "--image",
            IMAGE,
            "--policy",
            str(policy),
            "--credential-provider-config",
            str(config),
            "--credential-provider-socket",
            str(socket_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert (answer["source"], answer["registry"], answer["username"]) == (
        "provider",
        "a.example",
        "robot-a",
    )
