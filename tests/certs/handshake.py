"""Real TLS handshakes over loopback with the stdlib ``ssl`` module.

The client context trusts only the CA it is given, checks the host name,
requires TLS 1.2+, and uses ``VERIFY_X509_STRICT`` (the default in Python
3.13's ``create_default_context``) so certificates that a newer runtime would
reject fail here too.
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

from mirrorgate.certs import KeyPair

_TIMEOUT = 5.0
_PAYLOAD = b"ping"


@dataclasses.dataclass
class Outcome:
    """What each side saw."""

    client_error: Exception | None = None
    server_error: Exception | None = None
    echoed: bytes | None = None
    client_subject_seen_by_server: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        """Both sides completed and the payload made the round trip."""
        return self.client_error is None and self.server_error is None and self.echoed == _PAYLOAD


def handshake(
    tmp_path: Path,
    *,
    server: KeyPair,
    trusted_ca_pem: bytes,
    server_hostname: str,
    client: KeyPair | None = None,
    client_trust_ca_pem: bytes | None = None,
) -> Outcome:
    """Serve ``server`` on 127.0.0.1 in a thread and connect to it once.

    If ``client_trust_ca_pem`` is given the server requires a client
    certificate issued by that CA, and ``client`` is presented.
    """
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    server_ctx.load_cert_chain(*_write_pair(tmp_path / "server", server))
    if client_trust_ca_pem is not None:
        server_ctx.verify_mode = ssl.CERT_REQUIRED
        server_ctx.load_verify_locations(cadata=client_trust_ca_pem.decode("ascii"))

    client_ctx = ssl.create_default_context(cadata=trusted_ca_pem.decode("ascii"))
    client_ctx.check_hostname = True
    client_ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    if client is not None:
        client_ctx.load_cert_chain(*_write_pair(tmp_path / "client", client))

    outcome = Outcome()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(_TIMEOUT)
        thread = threading.Thread(target=_serve_once, args=(listener, server_ctx, outcome))
        thread.start()
        try:
            with (
                socket.create_connection(listener.getsockname(), timeout=_TIMEOUT) as raw,
                client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls,
            ):
                tls.sendall(_PAYLOAD)
                outcome.echoed = tls.recv(len(_PAYLOAD))
        except (ssl.SSLError, OSError) as exc:
            outcome.client_error = exc
        finally:
            thread.join(_TIMEOUT)
    assert not thread.is_alive(), "server thread did not finish"
    return outcome


def _serve_once(listener: socket.socket, ctx: ssl.SSLContext, outcome: Outcome) -> None:
    # Every exception is recorded, never raised: an uncaught thread exception
    # becomes a pytest warning, and warnings are errors in this project.
    try:
        conn, _ = listener.accept()
        conn.settimeout(_TIMEOUT)
        with conn, ctx.wrap_socket(conn, server_side=True) as tls:
            peer = tls.getpeercert()
            if peer:
                outcome.client_subject_seen_by_server = _flatten_subject(peer)
            tls.sendall(tls.recv(len(_PAYLOAD)))
    except Exception as exc:
        outcome.server_error = exc


def _flatten_subject(peer: dict[str, Any]) -> dict[str, str]:
    # getpeercert() nests the subject as a tuple of RDNs of (key, value) pairs.
    return {key: value for rdn in peer["subject"] for key, value in rdn}


def _write_pair(directory: Path, pair: KeyPair) -> tuple[Path, Path]:
    # SSLContext.load_cert_chain only reads files.
    directory.mkdir(exist_ok=True)
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    return cert, key
