"""The real server (uvicorn + ``webhook.commands.serve``) in a thread, and TLS clients for it.

After httpx's ``serve_in_thread``: uvicorn installs no signal handlers off
the main thread, so ``should_exit`` is how a test stops it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import uvicorn

from mirrorgate.certs import KeyPair
from mirrorgate.webhook import admission
from mirrorgate.webhook.commands.serve import process, settings, wiring
from mirrorgate.webhook.edge.limits import Limits

TIMEOUT = 5.0
_T = TypeVar("_T")


@dataclasses.dataclass
class Running:
    """A started server: its wiring, its port and the files it watches."""

    server: wiring.Server
    uvicorn: uvicorn.Server
    port: int
    metrics_port: int | None
    """The metrics listener's, when the server has one."""
    cert_file: Path
    key_file: Path
    policy_file: Path

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` in one step, as the kubelet swaps a mounted Secret or ConfigMap."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def write_pair(directory: Path, pair: KeyPair) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    write_atomically(cert, pair.cert_pem)
    write_atomically(key, pair.key_pem)
    return cert, key


@contextlib.contextmanager
def serve(
    directory: Path,
    *,
    pair: KeyPair,
    policy: str,
    reload_interval: float = 0.1,
    secrets: admission.PullSecrets | None = None,
    limits: Limits | None = None,
    client_ca: Path | None = None,
    metrics: bool = False,
) -> Iterator[Running]:
    """Run ``webhook.commands.serve`` on a free loopback port until the block exits.

    Health probes are off: these policies name mirrors that do not exist, and
    tests reach nothing beyond loopback (tests/e2e/tools/test_health_serve.py probes).
    """
    cert, key = write_pair(directory, pair)
    policy_file = directory / "policy.yaml"
    write_atomically(policy_file, policy.encode())
    built = wiring.build(
        settings.Settings(
            policy=str(policy_file),
            tls_cert=str(cert),
            tls_key=str(key),
            host="127.0.0.1",
            port=0,
            metrics_port=0 if metrics else None,
            client_ca=None if client_ca is None else str(client_ca),
            reload_interval=reload_interval,
            limits=limits or Limits(),
            health_probes=False,
        ),
        secrets=secrets,
    )
    listener = process.listen("127.0.0.1", 0)
    metrics_listener = process.listen("127.0.0.1", 0) if metrics else None
    instance = process.uvicorn_server(built, listener, metrics_listener)
    failures: list[BaseException] = []

    def run() -> None:
        # Recorded, not raised: an exception escaping a thread is a pytest
        # warning, and warnings are errors here.
        try:
            instance.run(sockets=[listener])
        except BaseException as error:  # SystemExit on a failed startup, too
            failures.append(error)

    thread = threading.Thread(target=run, name="mirrorgate-test-server", daemon=True)
    thread.start()
    try:
        wait_for(lambda: instance.started or bool(failures) or None, what="server start")
        assert not failures, f"server did not start: {failures!r}"
        port = listener.getsockname()[1]
        yield Running(
            server=built,
            uvicorn=instance,
            port=port,
            metrics_port=None if metrics_listener is None else metrics_listener.getsockname()[1],
            cert_file=cert,
            key_file=key,
            policy_file=policy_file,
        )
    finally:
        instance.should_exit = True
        thread.join(TIMEOUT * 2)
    assert not thread.is_alive(), "server thread did not stop"
    assert not failures, f"server failed: {failures!r}"


def wait_for(
    probe: Callable[[], _T | None], *, what: str, timeout: float = TIMEOUT, step: float = 0.02
) -> _T:
    """Poll ``probe`` until it returns something other than None (or fail naming ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def client_context(ca_pem: bytes, *, check_hostname: bool = True) -> ssl.SSLContext:
    """A client that trusts only ``ca_pem`` (TLS 1.2+, strict X.509 checks)."""
    context = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    context.check_hostname = check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def pem_fingerprint(pair: KeyPair) -> str:
    return fingerprint(ssl.PEM_cert_to_DER_cert(pair.cert_pem.decode("ascii")))


@contextlib.contextmanager
def tls_connection(
    port: int,
    context: ssl.SSLContext,
    server_hostname: str | None = "localhost",
    host: str = "127.0.0.1",
) -> Iterator[ssl.SSLSocket]:
    """A completed TLS handshake with the server on ``port``."""
    with (
        socket.create_connection((host, port), timeout=TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname=server_hostname) as tls,
    ):
        yield tls


def peer_fingerprint(
    port: int, context: ssl.SSLContext, server_hostname: str | None = "localhost"
) -> str:
    """The sha256 of the certificate a fresh connection is served."""
    with tls_connection(port, context, server_hostname) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return fingerprint(der)


def http_get(tls: ssl.SSLSocket, path: str, *, keep_alive: bool = True) -> bytes:
    """One HTTP/1.1 GET on an open connection; the raw response (head and body)."""
    connection = "keep-alive" if keep_alive else "close"
    tls.sendall(
        f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: {connection}\r\n\r\n".encode()
    )
    head, body = read_response(tls)
    return head + b"\r\n\r\n" + body


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response with a Content-Length from ``sock``: (head, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return head, body
