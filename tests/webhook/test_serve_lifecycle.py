"""`mirrorgate serve` as a process: bind before "serving", a busy port, a graceful SIGTERM;
and its composition root: each component made once, started in order, stopped in reverse."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson
import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair
from mirrorgate.webhook import background
from mirrorgate.webhook.commands.serve import settings, wiring
from mirrorgate.webhook.credentials import filestore
from mirrorgate.webhook.version import VERSION
from tests.commands import MIRRORGATE
from tests.webhook import policies
from tests.webhook.reviews import PROM_IMAGE, patch_ops, pod, review
from tests.webhook.serving import client_context, read_response, write_atomically, write_pair
from tests.webhook.testclient import TestClient

TIMEOUT = 60


def serve_command(
    directory: Path, pair: KeyPair, port: int, *, policy_text: str = policies.POLICY
) -> list[str]:
    cert, key = write_pair(directory, pair)
    policy = directory / "policy.yaml"
    policy.write_text(policy_text)
    return [
        *MIRRORGATE,
        "serve",
        "--policy",
        str(policy),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # The policy's mirrors are fictional, and tests reach nothing beyond loopback.
        "--no-health-probes",
    ]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_busy_port_is_a_one_line_error(
    tmp_path: Path, serving_pair: KeyPair, busy_port: int
) -> None:
    """Exit 2, one line naming the address and the reason, and never a "serving" line."""
    done = subprocess.run(
        serve_command(tmp_path, serving_pair, busy_port),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"mirrorgate: error: cannot listen on 127.0.0.1:{busy_port}: Address already in use\n"
    )
    assert done.stdout == ""


@contextlib.contextmanager
def running(command: list[str]) -> Iterator[subprocess.Popen[str]]:
    """`mirrorgate serve` as a process with its log on a pipe; killed if still running after."""
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        if process.stderr:
            process.stderr.close()


def read_log(stream: IO[str] | None) -> dict[str, object]:
    assert stream is not None
    line = stream.readline()
    assert line, "the server closed its log before saying it serves"
    entry = json.loads(line)
    assert isinstance(entry, dict)
    return entry


def test_sigterm_drains_the_request_in_flight_and_exits_0(
    tmp_path: Path, serving_pair: KeyPair, ca: CertificateAuthority
) -> None:
    """The request whose body is still arriving is answered; the last log line is written."""
    with running(serve_command(tmp_path, serving_pair, 0)) as process:
        entry = read_log(process.stderr)
        while entry["msg"] != "mirrorgate serving":
            entry = read_log(process.stderr)
        assert entry["version"] == VERSION
        assert entry["mode"] == "namespace-label"
        port = int(str(entry["address"]).rsplit(":", 1)[1])

        body = orjson.dumps(review(pod(PROM_IMAGE)))
        head = (
            f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
        ).encode()
        context = client_context(ca.cert_pem)
        # "serving" comes after the bind: the port accepts at once.
        with (
            socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(head + body[:100])
            # 100 Continue: the app is reading this request's body, so it is in flight.
            assert tls.recv(4096).startswith(b"HTTP/1.1 100 Continue")
            process.send_signal(signal.SIGTERM)
            while read_log(process.stderr)["msg"] != "Shutting down":
                pass
            tls.sendall(body[100:])
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
        status, _, payload = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 200")
        response = orjson.loads(payload)["response"]
        assert response["allowed"] is True
        assert patch_ops(response), "the drained request got its full answer"

        remaining = process.stderr.read() if process.stderr else ""
        assert process.wait(TIMEOUT) == 0
        messages = [json.loads(line)["msg"] for line in remaining.splitlines()]
        assert "mirrorgate stopped" in messages


def test_sigterm_answers_idle_keep_alive_connections_once_with_connection_close(
    tmp_path: Path, serving_pair: KeyPair, ca: CertificateAuthority
) -> None:
    """A review the API server sends on a kept-alive connection just after SIGTERM is
    answered, not met with EOF (admitted unmirrored under Ignore), and that answer closes
    the connection, so the next review goes to a replica that stays."""
    with running(serve_command(tmp_path, serving_pair, 0)) as process:
        entry = read_log(process.stderr)
        while entry["msg"] != "mirrorgate serving":
            entry = read_log(process.stderr)
        port = int(str(entry["address"]).rsplit(":", 1)[1])
        body = orjson.dumps(review(pod(PROM_IMAGE)))
        request = (
            f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        context = client_context(ca.cert_pem)
        with (
            socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(request)
            head, _ = read_response(tls)
            assert head.startswith(b"HTTP/1.1 200")
            assert b"connection: close" not in head.lower()  # kept alive, now idle

            process.send_signal(signal.SIGTERM)
            while read_log(process.stderr)["msg"] != "Shutting down":
                pass
            tls.sendall(request)
            head, payload = read_response(tls)
            assert head.startswith(b"HTTP/1.1 200")
            assert b"connection: close" in head.lower()
            assert patch_ops(orjson.loads(payload)["response"])
            assert tls.recv(65536) == b"", "the server closes the connection after its answer"

        remaining = process.stderr.read() if process.stderr else ""
        assert process.wait(TIMEOUT) == 0
        assert "mirrorgate stopped" in [json.loads(line)["msg"] for line in remaining.splitlines()]


# Valid but unsafe: a "*" grant, a mirror whose certificate is not verified.
UNSAFE_POLICY = """\
mirrors:
  - {source: docker.io, mirror: harbor.corp.example/hub, credential: harbor-pull}
  - {source: quay.io, mirror: m.example/quay, insecureSkipVerify: true}
credentials:
  harbor-pull: {namespaces: ["*"]}
"""
# Another unsafe one: a credential sent to a plain-HTTP mirror.
CLEAR_TEXT_POLICY = """\
mirrors:
  - {source: docker.io, mirror: 'http://cache.local:5000/hub', credential: cache}
credentials:
  cache: {namespaces: [team-a]}
"""
SAFE_POLICY = "mirrors:\n  - {source: docker.io, mirror: harbor.corp.example/hub}\n"


def test_the_policys_warnings_are_logged_once_per_load(
    tmp_path: Path, serving_pair: KeyPair
) -> None:
    """At start and at each accepted reload, one warning line per warning of the policy
    put in force, naming the file and the field; a rejected reload brings none."""
    command = serve_command(tmp_path, serving_pair, 0, policy_text=UNSAFE_POLICY)
    policy_file = tmp_path / "policy.yaml"
    with running([*command, "--reload-interval", "0.05"]) as process:

        def lines_until(msg: str) -> list[dict[str, object]]:
            """The log lines before the next one whose message is ``msg`` (dropped)."""
            seen = []
            while (entry := read_log(process.stderr))["msg"] != msg:
                seen.append(entry)
            return seen

        def warned(entries: list[dict[str, object]]) -> list[tuple[object, ...]]:
            return [
                (e["level"], e["file"], str(e["warning"]).split(":")[0])
                for e in entries
                if e["msg"] == "policy warning"
            ]

        at_start = lines_until("mirrorgate serving")
        assert warned(at_start) == [
            ("warning", str(policy_file), "mirrors[1].insecureSkipVerify"),
            ("warning", str(policy_file), "credentials.harbor-pull.namespaces"),
        ]
        texts = [str(e["warning"]) for e in at_start if e["msg"] == "policy warning"]
        assert 'TLS certificates of "m.example" are not verified' in texts[0]
        assert texts[1].startswith('credentials.harbor-pull.namespaces: "*" grants')

        write_atomically(policy_file, CLEAR_TEXT_POLICY.encode())
        lines_until("policy reloaded")
        write_atomically(policy_file, policies.INVALID_POLICY.encode())
        after_reload = lines_until("policy rejected; the previous policy stays in force")
        assert warned(after_reload) == [("warning", str(policy_file), "mirrors[0].mirror")]
        assert "cross the network in clear" in str(after_reload[-1]["warning"])

        write_atomically(policy_file, SAFE_POLICY.encode())
        assert warned(lines_until("policy reloaded")) == [], "a rejected policy warns of nothing"
        process.send_signal(signal.SIGTERM)
        assert warned(lines_until("mirrorgate stopped")) == [], "a safe policy warns of nothing"
        assert process.wait(TIMEOUT) == 0


# --- the composition root: every component made once, started in order -------------------------


def _settings(directory: Path, pair: KeyPair, **overrides: Any) -> settings.Settings:
    cert, key = write_pair(directory, pair)
    policy = directory / "policy.yaml"
    policy.write_text(policies.POLICY)
    return settings.Settings(
        policy=str(policy), tls_cert=str(cert), tls_key=str(key), health_probes=False, **overrides
    )


def test_standalone_components_are_made_once_in_dependency_order(
    tmp_path: Path, serving_pair: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime is complete when built; the reloaders come after what they publish to."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    built = wiring.build(_settings(tmp_path, serving_pair))
    assert built.components.names == [
        "review-worker",
        "mirror-health",
        "policy-file",
        "serving-certificate",
        "log-flusher",
    ]
    assert isinstance(built.runtime.secrets, wiring.StandalonePullSecrets)
    assert built.runtime.screener is not None
    assert list(built.runtime.readiness) == []
    assert len(built.runtime.advisories) == 1  # the health monitor's


def test_a_file_store_is_a_component_with_a_readiness_check(
    tmp_path: Path, serving_pair: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    key_file = tmp_path / "key"
    key_file.write_text(filestore.generate_key())
    key_file.chmod(0o600)
    store_file = tmp_path / "store.json"
    filestore.update_store(
        str(store_file),
        filestore.load_key(key_file=str(key_file), environ={}),
        lambda contents: contents.credentials,
        missing_ok=True,
    )
    built = wiring.build(
        _settings(
            tmp_path,
            serving_pair,
            store="file",
            store_file=str(store_file),
            store_key_file=str(key_file),
        )
    )
    assert built.components.names[:2] == ["review-worker", "credential-store"]
    assert list(built.runtime.readiness) == ["credential-store"]
    assert built.runtime.readiness["credential-store"]() is None


def test_the_lifespan_starts_the_components_and_stops_them(
    tmp_path: Path, serving_pair: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started with the application, stopped with it: nothing is left to stop after."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    built = wiring.build(_settings(tmp_path, serving_pair))
    with TestClient(built.application, base_url="https://testserver") as client:
        assert client.get("/healthz").status_code == 200
        assert built.components.stop().late == ()  # stops what the lifespan started...
    assert built.components.stop() == background.Shutdown()  # ...and the lifespan finds none
