"""`mirrorgate serve` as a process: bind before "serving", a busy port, a graceful SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import orjson
import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair
from mirrorgate.webhook.version import VERSION
from tests.commands import MIRRORGATE
from tests.webhook import policies
from tests.webhook.reviews import PROM_IMAGE, patch_ops, pod, review
from tests.webhook.serving import client_context, write_pair

TIMEOUT = 60


def serve_command(directory: Path, pair: KeyPair, port: int) -> list[str]:
    cert, key = write_pair(directory, pair)
    policy = directory / "policy.yaml"
    policy.write_text(policies.POLICY)
    return [*MIRRORGATE, "serve", "--policy", str(policy),
            "--tls-cert", str(cert), "--tls-key", str(key), "--host", "127.0.0.1",
            "--port", str(port),
            # The policy's mirrors are fictional, and tests reach nothing beyond loopback.
            "--no-health-probes"]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_busy_port_is_a_one_line_error(tmp_path: Path, serving_pair: KeyPair,
                                         busy_port: int) -> None:
    """Exit 2, one line naming the address and the reason, and never a "serving" line."""
    done = subprocess.run(serve_command(tmp_path, serving_pair, busy_port), capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 2
    assert done.stderr == (f"mirrorgate: error: cannot listen on 127.0.0.1:{busy_port}: "
                           "Address already in use\n")
    assert done.stdout == ""


def read_log(stream: IO[str] | None) -> dict[str, object]:
    assert stream is not None
    line = stream.readline()
    assert line, "the server closed its log before saying it serves"
    entry = json.loads(line)
    assert isinstance(entry, dict)
    return entry


def test_sigterm_drains_the_request_in_flight_and_exits_0(
        tmp_path: Path, serving_pair: KeyPair, ca: CertificateAuthority) -> None:
    """The request whose body is still arriving is answered; the last log line is written."""
    process = subprocess.Popen(serve_command(tmp_path, serving_pair, 0),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        entry = read_log(process.stderr)
        while entry["msg"] != "mirrorgate serving":
            entry = read_log(process.stderr)
        assert entry["version"] == VERSION
        assert entry["mode"] == "namespace-label"
        port = int(str(entry["address"]).rsplit(":", 1)[1])

        body = orjson.dumps(review(pod(PROM_IMAGE)))
        head = (f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()
        context = client_context(ca.cert_pem)
        # "serving" comes after the bind: the port accepts at once.
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as tls:
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
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        if process.stderr:
            process.stderr.close()
