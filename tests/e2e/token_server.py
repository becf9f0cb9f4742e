"""A registry Bearer token server, run in a thread, for the upstream registry.

Why it exists: distribution 2.8's pull-through cache sends its `proxy.username` and
`proxy.password` only to a Bearer token realm, never as Basic auth to an htpasswd
upstream (distribution/distribution#3153). An upstream with `auth: token` plus this
server is the way to make the mirror authenticate upstream as documented.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import ssl
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

ISSUER = "mirrorgate-e2e-token-issuer"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenSigner:
    """ES256 JWTs whose `x5c` header carries a self-signed cert the registry trusts."""

    def __init__(self, ttl: int = 300) -> None:
        # P-256 because the registry's JWS verification supports ES256; generating it
        # is also ~1000x faster than an RSA key.
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "e2e registry token signer")])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            # distribution verifies the x5c chain against `rootcertbundle`, so the
            # signer is its own root: CA:TRUE and keyCertSign are what Go checks.
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self._x5c = [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()]
        self.ttl = ttl

    def token(self, subject: str, service: str, access: list[dict[str, Any]]) -> str:
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": self._x5c}
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": service,
            "iat": now,
            "nbf": now - 5,
            "exp": now + self.ttl,
            "jti": _b64url(os.urandom(12)),
            "access": access,
        }
        signing_input = ".".join(
            _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        der = self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)  # JWS wants raw r||s, not DER
        return signing_input + "." + _b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


def _parse_scope(scope: str) -> dict[str, Any] | None:
    # "repository:library/hello:pull,push"; the name itself may contain ':'.
    kind, _, rest = scope.partition(":")
    name, sep, actions = rest.rpartition(":")
    if not kind or not sep:
        return None
    return {"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]}


class TokenServer:
    """Serves GET and POST /token over TLS on a loopback port until `stop()`."""

    def __init__(
        self,
        *,
        users: Mapping[str, str],
        tls_cert: Path,
        tls_key: Path,
        signer: TokenSigner,
    ) -> None:
        self.signer = signer
        handler = _make_handler(signer, dict(users))
        # Port 0: the kernel picks the port while the socket is bound, so no race.
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls_cert, tls_key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]
        self.realm = f"https://127.0.0.1:{self.port}/token"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="e2e-token-server", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()


def _make_handler(signer: TokenSigner, users: dict[str, str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "e2e-token-server"

        def _send(
            self, code: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
        ) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _user(self) -> str | None:
            scheme, _, value = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "basic":
                return None
            try:
                name, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            expected = users.get(name)
            if expected is None or not hmac.compare_digest(expected, password):
                return None
            return name

        def _refuse(self) -> None:
            self._send(
                401,
                {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]},
                {"WWW-Authenticate": 'Basic realm="token"'},
            )

        def _issue(self, user: str, service: str, scopes: list[str]) -> None:
            # Every known user gets every action asked for: authorization is not
            # what these tests are about, authentication across the proxy is.
            access = [a for s in scopes if (a := _parse_scope(s)) is not None]
            token = signer.token(user, service, access)
            issued = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._send(
                200,
                {
                    "token": token,
                    "access_token": token,
                    "expires_in": signer.ttl,
                    "issued_at": issued,
                },
            )

        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path != "/token":
                self._send(404, {"error": "not found"})
                return
            user = self._user()
            if user is None:
                self._refuse()
                return
            query = parse_qs(url.query)
            self._issue(user, query.get("service", [""])[0], query.get("scope", []))

        def do_POST(self) -> None:
            """The OAuth2 password grant, which containerd tries before GET when it has a password.

            Form fields: grant_type=password, username, password, service, and
            scope (space-separated), as Docker's token specification has them.
            """
            if urlparse(self.path).path != "/token":
                self._send(404, {"error": "not found"})
                return
            length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024)
            form = parse_qs(self.rfile.read(length).decode(errors="replace"))
            name = form.get("username", [""])[0]
            password = form.get("password", [""])[0]
            expected = users.get(name)
            if form.get("grant_type") != ["password"] or expected is None \
                    or not hmac.compare_digest(expected, password):
                self._refuse()
                return
            scopes = [s for value in form.get("scope", []) for s in value.split()]
            self._issue(name, form.get("service", [""])[0], scopes)

        def log_message(self, format: str, *args: Any) -> None:
            # Silent: the default writes every request to pytest's captured stderr.
            pass

    return Handler
