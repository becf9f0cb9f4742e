"""The real server over real TLS: 1.2+ only, the right certificate, rotation without restart."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from mirrorgate import certs
from mirrorgate.certs import CertificateAuthority, KeyPair
from tests.environment import skips_forbidden
from tests.webhook import policies, serving
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.reviews import (
    HUB_IMAGE,
    HUB_MIRRORED,
    PROM_IMAGE,
    PROM_MIRRORED,
    apply,
    patch_ops,
    pod,
    review,
)
from tests.webhook.scrape import samples, value


def https_client(ca: CertificateAuthority) -> httpx.Client:
    return httpx.Client(verify=serving.client_context(ca.cert_pem), timeout=serving.TIMEOUT)


def test_serves_the_issued_certificate(
    https_server: serving.Running, ca: CertificateAuthority, serving_pair: KeyPair
) -> None:
    """A client trusting only our CA completes the handshake and gets the serving cert."""
    fingerprint = serving.peer_fingerprint(https_server.port, serving.client_context(ca.cert_pem))
    assert fingerprint == serving.pem_fingerprint(serving_pair)


def test_admission_over_https(https_server: serving.Running, ca: CertificateAuthority) -> None:
    """/mutate, /healthz, /readyz and /metrics answer over HTTPS on the real server."""
    obj = pod(HUB_IMAGE, PROM_IMAGE)
    with https_client(ca) as client:
        answer = client.post(
            f"{https_server.url}/mutate",
            content=orjson.dumps(review(obj)),
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == 200
        patched = apply(obj, patch_ops(answer.json()["response"]))
        assert [c["image"] for c in patched["spec"]["containers"]] == [HUB_MIRRORED, PROM_MIRRORED]
        assert client.get(f"{https_server.url}/healthz").text == "ok\n"
        ready = client.get(f"{https_server.url}/readyz")
        assert ready.status_code == 200
        assert ready.json()["ready"] is True
        metrics = client.get(f"{https_server.url}/metrics").text
    assert "mirrorgate_admissions_total" in metrics


def test_client_trusting_another_ca_fails_the_handshake(
    https_server: serving.Running, other_ca: CertificateAuthority
) -> None:
    """Negative control: the certificate only verifies against the CA that issued it."""
    with pytest.raises(ssl.SSLCertVerificationError):
        serving.peer_fingerprint(https_server.port, serving.client_context(other_ca.cert_pem))


def test_wrong_host_name_fails_the_handshake(
    https_server: serving.Running, ca: CertificateAuthority
) -> None:
    """Negative control: the certificate names localhost and 127.0.0.1 only."""
    with pytest.raises(ssl.SSLCertVerificationError):
        serving.peer_fingerprint(
            https_server.port,
            serving.client_context(ca.cert_pem),
            server_hostname="mirrorgate.example",
        )


def test_plain_http_is_not_served(https_server: serving.Running) -> None:
    """There is no cleartext listener: an HTTP request gets no HTTP answer."""
    with socket.create_connection(("127.0.0.1", https_server.port), timeout=serving.TIMEOUT) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        try:
            reply = raw.recv(1024)
        except ConnectionResetError:
            reply = b""
    assert not reply.startswith(b"HTTP/")


def legacy_context(ca: CertificateAuthority, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client (or server) willing to speak ``version`` only, as old stacks do."""
    context = ssl.create_default_context(cadata=ca.cert_pem.decode("ascii"))
    with warnings.catch_warnings():
        # Python deprecates TLS 1.0/1.1 constants; using one is the point here.
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = version
        context.maximum_version = version
    # OpenSSL 3 allows TLS < 1.2 at security level 0 only.
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


@contextlib.contextmanager
def permissive_server(directory: Path, pair: KeyPair) -> Iterator[int]:
    """A bare stdlib TLS server that accepts TLS 1.0+ once: proof the client can speak 1.1."""
    cert, key = serving.write_pair(directory, pair)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(serving.TIMEOUT)

    def accept_once() -> None:
        with contextlib.suppress(OSError):
            connection, _ = listener.accept()
            with connection, context.wrap_socket(connection, server_side=True) as tls:
                tls.recv(1)

    thread = threading.Thread(target=accept_once)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        thread.join(serving.TIMEOUT)
        listener.close()


def test_tls_1_1_client_is_refused(
    https_server: serving.Running, ca: CertificateAuthority, serving_pair: KeyPair, tmp_path: Path
) -> None:
    """A client limited to TLS 1.1 cannot connect, though it can to a server that allows 1.1."""
    client = legacy_context(ca, ssl.TLSVersion.TLSv1_1)
    with permissive_server(tmp_path, serving_pair) as port:
        try:
            with serving.tls_connection(port, client) as tls:
                assert tls.version() == "TLSv1.1"
                tls.sendall(b"x")
        except ssl.SSLError as error:  # this OpenSSL cannot speak 1.1 at all
            reason = f"the local OpenSSL refuses TLS 1.1 as a client: {error}"
            if skips_forbidden():
                pytest.fail(reason)
            pytest.skip(reason)
    with pytest.raises(ssl.SSLError, match=r"(?i)protocol|version"):
        serving.peer_fingerprint(https_server.port, client)


@pytest.mark.parametrize(
    "version",
    [
        pytest.param(ssl.TLSVersion.TLSv1_2, id="tls1.2"),
        pytest.param(ssl.TLSVersion.TLSv1_3, id="tls1.3"),
    ],
)
def test_tls_1_2_and_1_3_clients_are_served(
    https_server: serving.Running, ca: CertificateAuthority, version: ssl.TLSVersion
) -> None:
    """The versions the API server speaks are accepted."""
    context = serving.client_context(ca.cert_pem)
    context.minimum_version = context.maximum_version = version
    with serving.tls_connection(https_server.port, context) as tls:
        assert (
            tls.version()
            == {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]
        )
        assert serving.http_get(tls, "/healthz", keep_alive=False).startswith(b"HTTP/1.1 200")


# --- rotation ----------------------------------------------------------------------------------


@pytest.fixture
def rotating(tmp_path: Path, serving_pair: KeyPair) -> Iterator[serving.Running]:
    """A server of its own, whose certificate files the test replaces."""
    with serving.serve(
        tmp_path,
        pair=serving_pair,
        policy=policies.POLICY,
        secrets=RecordingPullSecrets(stale=False),
    ) as running:
        yield running


def peer_of(response: httpx.Response) -> str:
    """The certificate of the connection a response came over."""
    tls = response.extensions["network_stream"].get_extra_info("ssl_object")
    der = tls.getpeercert(True)  # httpcore hands out the C-level object: positional only
    assert der is not None
    return serving.fingerprint(der)


def serves(running: serving.Running, trust: ssl.SSLContext, fingerprint: str) -> bool | None:
    """True once a new connection verified by ``trust`` gets ``fingerprint`` (else None)."""
    try:
        return True if serving.peer_fingerprint(running.port, trust) == fingerprint else None
    except ssl.SSLCertVerificationError:  # still the certificate of the other CA
        return None


def record_server_names(running: serving.Running) -> list[str | None]:
    """Spy on the SNI callback to see which server name each handshake carried."""
    base = running.server.certificates.base
    original = base.sni_callback
    assert original is not None
    seen: list[str | None] = []

    def spy(connection: ssl.SSLObject, name: str, context: ssl.SSLContext) -> int | None:
        seen.append(name)  # typeshed says str; OpenSSL passes None when there was no SNI
        return original(connection, name, context)

    base.sni_callback = spy
    return seen


@pytest.mark.parametrize(
    "same_ca", [pytest.param(True, id="renewed-by-same-ca"), pytest.param(False, id="new-ca")]
)
def test_rotated_certificate_serves_new_connections_without_a_restart(
    rotating: serving.Running,
    ca: CertificateAuthority,
    other_ca: CertificateAuthority,
    serving_pair: KeyPair,
    same_ca: bool,
) -> None:
    """Cert B on disk reaches new handshakes; a connection opened on cert A still works."""
    old_fp = serving.pem_fingerprint(serving_pair)
    old_trust = serving.client_context(ca.cert_pem)
    new_ca = ca if same_ca else other_ca
    new_pair = new_ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])
    new_fp = serving.pem_fingerprint(new_pair)
    new_trust = serving.client_context(new_ca.cert_pem)
    assert new_fp != old_fp
    url = rotating.url

    with https_client(ca) as kept, serving.tls_connection(rotating.port, old_trust) as raw_kept:
        before = kept.get(f"{url}/healthz")
        assert peer_of(before) == old_fp
        assert serving.http_get(raw_kept, "/healthz").startswith(b"HTTP/1.1 200")

        serving.write_pair(rotating.cert_file.parent, new_pair)
        serving.wait_for(
            lambda: serves(rotating, new_trust, new_fp),
            what="the rotated certificate on new connections",
        )

        # In flight: both connections opened before the rotation still complete requests.
        after = kept.get(f"{url}/readyz")
        assert after.status_code == 200
        assert peer_of(after) == old_fp  # same connection, not a silent reconnect
        assert serving.http_get(raw_kept, "/healthz").startswith(b"HTTP/1.1 200")

    with https_client(new_ca) as fresh:
        response = fresh.get(f"{url}/healthz")
        assert peer_of(response) == new_fp
        metrics = fresh.get(f"{url}/metrics").text
    page = samples(metrics)
    assert value(page, "mirrorgate_certificate_reloads_total", result="loaded") >= 1
    assert (
        value(page, "mirrorgate_certificate_expiry_timestamp_seconds")
        == certs.certificate_expiry(new_pair.cert_pem).timestamp()
    )
    if not same_ca:
        with pytest.raises(ssl.SSLCertVerificationError):
            serving.peer_fingerprint(rotating.port, old_trust)


def test_rotated_certificate_reaches_clients_without_sni(
    rotating: serving.Running, ca: CertificateAuthority
) -> None:
    """The API server sends no SNI for an IP URL; those handshakes get the new cert too."""
    new_pair = ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])
    new_fp = serving.pem_fingerprint(new_pair)
    seen = record_server_names(rotating)
    serving.write_pair(rotating.cert_file.parent, new_pair)
    trust = serving.client_context(ca.cert_pem)
    # Python sends no SNI for an IP literal, and none at all without a server_hostname.
    serving.wait_for(
        lambda: (
            True if serving.peer_fingerprint(rotating.port, trust, "127.0.0.1") == new_fp else None
        ),
        what="the rotated certificate for a client connecting by IP",
    )
    no_hostname = serving.client_context(ca.cert_pem, check_hostname=False)
    assert serving.peer_fingerprint(rotating.port, no_hostname, None) == new_fp
    assert seen
    assert set(seen) == {None}


def test_half_written_rotation_keeps_serving_the_old_certificate(
    rotating: serving.Running, ca: CertificateAuthority, serving_pair: KeyPair
) -> None:
    """A new cert with the old key is rejected until the key arrives; the old cert serves."""
    trust = serving.client_context(ca.cert_pem)
    new_pair = ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])
    serving.write_atomically(rotating.cert_file, new_pair.cert_pem)
    metrics = rotating.server.runtime.metrics.certificate_reloads
    serving.wait_for(
        lambda: True if metrics.labels("failed")._value.get() >= 1 else None,
        what="a failed certificate reload",
    )
    assert serving.peer_fingerprint(rotating.port, trust) == serving.pem_fingerprint(serving_pair)

    serving.write_atomically(rotating.key_file, new_pair.key_pem)
    new_fp = serving.pem_fingerprint(new_pair)
    serving.wait_for(
        lambda: True if serving.peer_fingerprint(rotating.port, trust) == new_fp else None,
        what="the completed rotation",
    )
