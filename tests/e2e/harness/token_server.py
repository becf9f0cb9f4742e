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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Robot:
    """A pull-only robot of one project, as Harbor has: its secret only mints passwords.

    A robot logs in to the registry with a short-lived password minted by
    `GET /robot-token?ttl=N` (Basic auth with its secret), never with the secret
    itself, and its tokens grant access to `project/...` repositories only.
    """

    secret: str = field(repr=False)
    project: str


class RobotPasswords:
    """Minted passwords: `<expiry>.<nonce>.<hmac>`, checked without keeping any state."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._key = os.urandom(32)
        self._clock = clock

    def _mac(self, robot: str, expiry: int, nonce: str) -> str:
        return hmac.new(self._key, f"{robot}|{expiry}|{nonce}".encode(), "sha256").hexdigest()

    def mint(self, robot: str, ttl: int) -> str:
        expiry, nonce = int(self._clock()) + ttl, os.urandom(6).hex()
        return f"{expiry}.{nonce}.{self._mac(robot, expiry, nonce)}"

    def valid(self, robot: str, password: str) -> bool:
        expiry, _, rest = password.partition(".")
        nonce, _, mac = rest.partition(".")
        if not expiry.isdigit() or int(expiry) <= self._clock():
            return False
        return hmac.compare_digest(mac, self._mac(robot, int(expiry), nonce))


def _robot_access(robot: Robot, access: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Only repositories of the robot's own project; pull at most."""
    return [
        {**a, "actions": [x for x in a["actions"] if x == "pull"]}
        for a in access
        if a["type"] == "repository" and a["name"].startswith(robot.project + "/")
    ]


class TokenServer:
    """Serves GET and POST /token (and GET /robot-token) over TLS on a loopback port until
    `stop()`."""

    def __init__(
        self,
        *,
        users: Mapping[str, str],
        tls_cert: Path,
        tls_key: Path,
        signer: TokenSigner,
        robots: Mapping[str, Robot] | None = None,
        address: str = "127.0.0.1",
    ) -> None:
        self.signer = signer
        self.robots = dict(robots or {})
        """Mutable until requests arrive: tests add robots before using them."""
        self.passwords = RobotPasswords()
        self.minted = 0
        """How many robot passwords were minted (the tests count refreshes by it)."""
        handler = _make_handler(signer, dict(users), self)
        # Port 0: the kernel picks the port while the socket is bound, so no race.
        self._server = ThreadingHTTPServer((address, 0), handler)
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls_cert, tls_key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]
        self.url = f"https://{address}:{self.port}"
        self.realm = f"{self.url}/token"
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


def _make_handler(
    signer: TokenSigner, users: dict[str, str], server: TokenServer
) -> type[BaseHTTPRequestHandler]:
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

        def _basic(self) -> tuple[str, str] | None:
            scheme, _, value = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "basic":
                return None
            try:
                name, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return name, password

        def _mint(self, url: Any) -> None:
            login = self._basic()
            robot = server.robots.get(login[0]) if login else None
            if login is None or robot is None or not hmac.compare_digest(robot.secret, login[1]):
                self._send(401, {"error": "bad robot secret"})
                return
            ttl = int(parse_qs(url.query).get("ttl", ["60"])[0])
            server.minted += 1
            self._send(200, {"password": server.passwords.mint(login[0], ttl), "expires_in": ttl})

        def _known(self, name: str, password: str) -> bool:
            """A user's own password, or a robot's minted one that has not expired."""
            if name in server.robots:
                return server.passwords.valid(name, password)
            expected = users.get(name)
            return expected is not None and hmac.compare_digest(expected, password)

        def _user(self) -> str | None:
            login = self._basic()
            return login[0] if login is not None and self._known(*login) else None

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
            if user in server.robots:
                access = _robot_access(server.robots[user], access)
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
            if url.path == "/robot-token":
                self._mint(url)
                return
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
            if form.get("grant_type") != ["password"] or not self._known(name, password):
                self._refuse()
                return
            scopes = [s for value in form.get("scope", []) for s in value.split()]
            self._issue(name, form.get("service", [""])[0], scopes)

        def log_message(self, format: str, *args: Any) -> None:
            # Silent: the default writes every request to pytest's captured stderr.
            pass

    return Handler
