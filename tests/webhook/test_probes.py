"""The probes' verdicts for each way a registry can answer, against real loopback TLS servers.

A real docker-registry covers the ordinary answers in tests/e2e/tools/test_health_serve.py;
the faults it cannot be made to produce (a 5xx, a server that accepts and
never answers, one that drips its answer, odd challenges and token answers)
come from a small HTTPS server here, scripted per test.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mirrorgate import certs, policy
from mirrorgate.webhook.mirrorhealth import monitor, probes

Handler = Callable[[http.server.BaseHTTPRequestHandler], None]
TIMEOUT = 2.0


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> tuple[certs.KeyPair, Path]:
    ca = certs.CertificateAuthority.generate()
    directory = tmp_path_factory.mktemp("probe-ca")
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    return ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"]), directory / "ca.crt"


@contextlib.contextmanager
def https_server(pair: certs.KeyPair | None, tmp_path: Path, handle: Handler) -> Iterator[str]:
    """A loopback HTTPS server (plain HTTP without ``pair``) whose every GET runs ``handle``;
    yields its host:port."""

    class Scripted(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            handle(self)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    if pair is not None:
        (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
        (tmp_path / "tls.key").write_bytes(pair.key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def answer(status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> Handler:
    def handle(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(status)
        for name, value in (headers or {}).items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    return handle


MIRROR_ANSWERS = [
    pytest.param(200, (True, "HTTP 200"), id="200-up"),
    pytest.param(401, (True, "HTTP 401"), id="401-up"),
    pytest.param(503, (False, "/v2/ answered HTTP 503"), id="503-down"),
    pytest.param(500, (False, "/v2/ answered HTTP 500"), id="500-down"),
    pytest.param(404, (False, "/v2/ answered HTTP 404"), id="404-not-a-registry"),
]


@pytest.mark.parametrize(("status", "expected"), MIRROR_ANSWERS)
def test_mirror_answers(
    authority: tuple[certs.KeyPair, Path], tmp_path: Path, status: int, expected: tuple[bool, str]
) -> None:
    pair, ca = authority
    with https_server(pair, tmp_path, answer(status)) as host:
        assert (
            probes.check_mirror(host, context=probes.tls_context(str(ca)), timeout=TIMEOUT)
            == expected
        )


def test_refused(authority: tuple[certs.KeyPair, Path]) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert probes.check_mirror(
        f"127.0.0.1:{port}", context=probes.tls_context(str(authority[1])), timeout=TIMEOUT
    ) == (False, "connection refused")


def test_silent_server_times_out(authority: tuple[certs.KeyPair, Path]) -> None:
    """Accepted, never answered (not even the TLS handshake): a timeout, not a hang."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        assert probes.check_mirror(
            f"127.0.0.1:{port}", context=probes.tls_context(str(authority[1])), timeout=0.3
        ) == (False, "timed out")


def test_dripping_server_is_cut_at_the_deadline(
    authority: tuple[certs.KeyPair, Path], tmp_path: Path
) -> None:
    """A server answering a byte at a time cannot hold a probe beyond its whole deadline."""
    pair, ca = authority
    stop = threading.Event()

    def drip(request: http.server.BaseHTTPRequestHandler) -> None:
        request.wfile.write(b"HTTP/1.1 200 OK\r\n")
        while not stop.is_set():
            request.wfile.write(b"X-Drip: .\r\n")
            request.wfile.flush()
            time.sleep(0.05)

    with https_server(pair, tmp_path, drip) as host:
        try:
            verdict = probes.check_mirror(host, context=probes.tls_context(str(ca)), timeout=0.5)
        finally:
            stop.set()
    # 100 header lines (http.client's limit) would take 5 s: the deadline comes first.
    assert verdict == (False, "timed out")


def test_untrusted_certificate(authority: tuple[certs.KeyPair, Path], tmp_path: Path) -> None:
    other = certs.CertificateAuthority.generate()
    (tmp_path / "other.crt").write_bytes(other.cert_pem)
    with https_server(authority[0], tmp_path, answer(401)) as host:
        verdict = probes.check_mirror(
            host, context=probes.tls_context(str(tmp_path / "other.crt")), timeout=TIMEOUT
        )
    assert not verdict.ok
    assert verdict.reason.startswith("TLS verification failed: ")


def test_unreadable_ca_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot load caFile"):
        probes.tls_context(str(tmp_path / "missing.crt"))


def test_tls_is_at_least_1_2() -> None:
    assert probes.tls_context(None).minimum_version == ssl.TLSVersion.TLSv1_2


GOOD_BASIC = "Basic " + base64.b64encode(b"robot:right").decode()


def _registry(challenge: str | None, *, realm_answer: Handler | None = None) -> Handler:
    """/v2/ answering 401 with ``challenge``; Basic checked there, tokens at /token."""
    good = GOOD_BASIC

    def handle(request: http.server.BaseHTTPRequestHandler) -> None:
        if request.path.startswith("/token"):
            assert realm_answer is not None
            realm_answer(request)
        elif (
            challenge
            and challenge.startswith("Basic")
            and request.headers.get("Authorization") == good
        ):
            answer(200)(request)
        else:
            answer(401, {"WWW-Authenticate": challenge} if challenge else {})(request)

    return handle


def _token(request: http.server.BaseHTTPRequestHandler) -> None:
    if request.headers.get("Authorization") != GOOD_BASIC:
        answer(401)(request)
        return
    assert "scope=repository%3Ahub%2Fmirrorgate-health%3Apull" in request.path, request.path
    assert "service=registry.example" in request.path
    answer(200, body=json.dumps({"token": "t0ken"}).encode())(request)


LOGINS = [
    pytest.param('Basic realm="r"', None, "right", ("valid", "logged in"), id="basic-valid"),
    pytest.param(
        'Basic realm="r"',
        None,
        "wrong",
        ("invalid", "login refused by /v2/ (HTTP 401)"),
        id="basic-refused",
    ),
    pytest.param(
        'Bearer realm="https://{host}/token",service="registry.example"',
        _token,
        "right",
        ("valid", "logged in"),
        id="bearer-valid",
    ),
    pytest.param(
        'Bearer realm="https://{host}/token",service="registry.example"',
        _token,
        "wrong",
        ("invalid", "login refused by the token realm (HTTP 401)"),
        id="bearer-refused",
    ),
    pytest.param(
        'Bearer realm="https://{host}/token"',
        answer(200, body=b'{"token": ""}'),
        "right",
        ("invalid", "the token realm answered without a token"),
        id="bearer-empty-token",
    ),
    pytest.param(
        'Bearer realm="https://{host}/token"',
        answer(503),
        "right",
        ("unknown", "the token realm answered HTTP 503"),
        id="bearer-realm-5xx",
    ),
    pytest.param(
        'Bearer realm="http://{host}/token"',
        None,
        "right",
        (
            "unknown",
            "refusing to log in over http scheme (HTTPS only: the scheme "
            "the policy gives the mirror)",
        ),
        id="bearer-plain-http-realm",
    ),
    pytest.param(
        "Negotiate",
        None,
        "right",
        ("unknown", "the 401 from /v2/ advertises no Basic or Bearer login"),
        id="other-scheme",
    ),
    pytest.param(
        None,
        None,
        "right",
        ("unknown", "the 401 from /v2/ advertises no Basic or Bearer login"),
        id="no-challenge",
    ),
]


@pytest.mark.parametrize(("challenge", "realm", "password", "expected"), LOGINS)
def test_login(
    authority: tuple[certs.KeyPair, Path],
    tmp_path: Path,
    challenge: str | None,
    realm: Handler | None,
    password: str,
    expected: tuple[str, str],
) -> None:
    pair, ca = authority
    host_box: list[str] = []

    def handle(request: http.server.BaseHTTPRequestHandler) -> None:
        text = challenge.replace("{host}", host_box[0]) if challenge else None
        _registry(text, realm_answer=realm)(request)

    with https_server(pair, tmp_path, handle) as host:
        host_box.append(host)
        verdict = probes.check_login(
            host,
            "robot",
            password,
            repository="hub/mirrorgate-health",
            context=probes.tls_context(str(ca)),
            timeout=TIMEOUT,
        )
    assert verdict == expected
    assert password not in repr(verdict)


def test_open_registry_needs_no_login(
    authority: tuple[certs.KeyPair, Path], tmp_path: Path
) -> None:
    pair, ca = authority
    with https_server(pair, tmp_path, answer(200)) as host:
        assert (
            probes.check_login(
                host,
                "robot",
                "pw",
                repository="x",
                timeout=TIMEOUT,
                context=probes.tls_context(str(ca)),
            ).verdict
            == "valid"
        )


CHALLENGES = [
    (
        'Bearer realm="https://a/token",service="reg",scope="x"',
        ("bearer", {"realm": "https://a/token", "service": "reg", "scope": "x"}),
    ),
    ('basic realm="Registry Realm"', ("basic", {"realm": "Registry Realm"})),
    (
        "Bearer realm=https://a/token, service=reg",
        ("bearer", {"realm": "https://a/token", "service": "reg"}),
    ),
    ("", ("", {})),
]


@pytest.mark.parametrize(("header", "expected"), CHALLENGES)
def test_challenge_parsing(header: str, expected: tuple[str, dict[str, str]]) -> None:
    assert probes._challenge(header) == expected


# --- plain-HTTP mirrors (`mirror: http://...`) and insecureSkipVerify ----------------------------


def test_plain_http_mirror_is_up_when_probed_without_tls(tmp_path: Path) -> None:
    with https_server(None, tmp_path, answer(200)) as host:
        assert probes.check_mirror(host, context=None, timeout=TIMEOUT) == (True, "HTTP 200")


def test_plain_http_mirror_probed_as_https_is_the_tls_failure_users_saw(tmp_path: Path) -> None:
    """Why the scheme must be declared: HTTPS to a plain-HTTP cache is always "down"."""
    with https_server(None, tmp_path, answer(200)) as host:
        verdict = probes.check_mirror(host, context=probes.tls_context(None), timeout=TIMEOUT)
    assert verdict == (False, "TLS failed: WRONG_VERSION_NUMBER")


def test_https_mirror_probed_as_plain_http_is_down(
    authority: tuple[certs.KeyPair, Path], tmp_path: Path
) -> None:
    with https_server(authority[0], tmp_path, answer(200)) as host:
        verdict = probes.check_mirror(host, context=None, timeout=TIMEOUT)
    assert not verdict.ok


def test_plain_http_login_and_no_tls_realm_from_it(tmp_path: Path) -> None:
    """A plain-HTTP mirror's login goes as plain HTTP (the policy warns); its token realm
    must be plain HTTP too: the probe never mixes the schemes of one mirror."""
    with https_server(None, tmp_path, _registry('Basic realm="r"')) as host:
        assert probes.check_login(
            host, "robot", "right", repository="x", context=None, timeout=TIMEOUT
        ) == ("valid", "logged in")
    with https_server(None, tmp_path, _registry('Bearer realm="https://a.example/token"')) as host:
        verdict = probes.check_login(
            host, "robot", "right", repository="x", context=None, timeout=TIMEOUT
        )
    assert verdict == (
        "unknown",
        "refusing to log in over https scheme (plain HTTP only: the "
        "scheme the policy gives the mirror)",
    )


def test_skip_verify_accepts_an_untrusted_certificate_only_when_asked(
    authority: tuple[certs.KeyPair, Path], tmp_path: Path
) -> None:
    with https_server(authority[0], tmp_path, answer(401)) as host:
        verified = probes.check_mirror(host, context=probes.tls_context(None), timeout=TIMEOUT)
        skipped = probes.check_mirror(
            host, context=probes.tls_context(None, skip_verify=True), timeout=TIMEOUT
        )
    assert verified.reason.startswith("TLS verification failed: ")
    assert skipped == (True, "HTTP 401")


def test_the_monitor_probes_each_mirror_with_the_scheme_the_policy_gives_it(
    authority: tuple[certs.KeyPair, Path], tmp_path: Path
) -> None:
    with (
        https_server(None, tmp_path / "plain", answer(200)) as plain,
        https_server(authority[0], tmp_path, answer(401)) as tls,
    ):
        mirror_policy = policy.load(
            {
                "mirrors": [
                    {"source": "docker.io", "mirror": f"http://{plain}/hub"},
                    {"source": "quay.io", "mirror": f"https://{tls}/q", "insecureSkipVerify": True},
                ]
            }
        )
        health = monitor.probe_mirrors(mirror_policy, [r.mirror.host for r in mirror_policy.rules])
    assert health.down == {}
