"""Who may call: --client-ca on the admission port, /metrics and the detailed /readyz apart.

The real server over real TLS: a caller without a certificate from the client CA
never completes a handshake (so never reaches /mutate), the CA file reloads like
the serving certificate, and --metrics-port serves the monitoring endpoints with
no client certificate while the admission port says only ready or not.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair
from mirrorgate.webhook.edge import tls
from mirrorgate.webhook.errors import ConfigError
from tests.webhook import policies, serving
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.reviews import HUB_IMAGE, HUB_MIRRORED, apply, patch_ops, pod, review


def caller(
    ca: CertificateAuthority, trust: CertificateAuthority, directory: Path
) -> ssl.SSLContext:
    """A client trusting ``trust`` and presenting a certificate issued by ``ca``."""
    directory.mkdir(parents=True, exist_ok=True)
    context = serving.client_context(trust.cert_pem)
    pair = ca.issue_client(common_name="kube-apiserver", organizations=[])
    cert, key = serving.write_pair(directory, pair)  # a client's pair, in files of its own
    context.load_cert_chain(cert, key)
    return context


def mutate(url: str, context: ssl.SSLContext) -> list[str]:
    obj = pod(HUB_IMAGE)
    with httpx.Client(verify=context, timeout=serving.TIMEOUT) as client:
        answer = client.post(
            f"{url}/mutate",
            content=orjson.dumps(review(obj)),
            headers={"content-type": "application/json"},
        )
    assert answer.status_code == 200, answer.text
    patched = apply(obj, patch_ops(answer.json()["response"]))
    return [c["image"] for c in patched["spec"]["containers"]]


def refused_at_handshake(running: serving.Running, context: ssl.SSLContext) -> None:
    """A handshake the server refuses: the client gets no HTTP answer (TLS 1.3 clients learn it
    on their first read: an alert, a reset or the end of the stream), and the server counts
    the connection as a failed handshake, never handing it to HTTP."""
    before = dropped(running, "handshake-failed")
    try:
        with serving.tls_connection(running.port, context) as connection:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answer = connection.recv(1024)
    except (ssl.SSLError, ConnectionError) as error:
        answer = str(error).encode()
    assert not answer.startswith(b"HTTP/"), answer
    serving.wait_for(
        lambda: dropped(running, "handshake-failed") > before or None,
        what="the refused handshake counted",
    )


def counted(running: serving.Running, name: str, **labels: str) -> float:
    """A counter of the running server, read from its registry."""
    found = running.server.runtime.metrics.registry.get_sample_value(name, labels)
    return found or 0.0


def dropped(running: serving.Running, reason: str) -> float:
    return counted(running, "mirrorgate_connections_dropped_total", reason=reason)


@pytest.fixture
def client_ca(tmp_path: Path, other_ca: CertificateAuthority) -> Path:
    path = tmp_path / "client-ca.crt"
    serving.write_atomically(path, other_ca.cert_pem)
    return path


@pytest.fixture
def api_server(
    ca: CertificateAuthority, other_ca: CertificateAuthority, tmp_path: Path
) -> ssl.SSLContext:
    """A caller holding a certificate from the client CA, as the API server does."""
    return caller(other_ca, ca, tmp_path / "api-server")


@pytest.fixture
def guarded(tmp_path: Path, serving_pair: KeyPair, client_ca: Path) -> Iterator[serving.Running]:
    (tmp_path / "server").mkdir()
    with serving.serve(
        tmp_path / "server",
        pair=serving_pair,
        policy=policies.POLICY,
        secrets=RecordingPullSecrets(stale=False),
        client_ca=client_ca,
        metrics=True,
    ) as running:
        yield running


def test_a_caller_with_a_certificate_from_the_client_ca_is_served(
    guarded: serving.Running, api_server: ssl.SSLContext
) -> None:
    assert mutate(guarded.url, api_server) == [HUB_MIRRORED]


def test_a_caller_without_a_certificate_is_refused_at_the_handshake(
    guarded: serving.Running, ca: CertificateAuthority
) -> None:
    refused_at_handshake(guarded, serving.client_context(ca.cert_pem))


def test_a_caller_with_a_certificate_from_another_ca_is_refused_at_the_handshake(
    guarded: serving.Running, ca: CertificateAuthority, tmp_path: Path
) -> None:
    refused_at_handshake(guarded, caller(ca, ca, tmp_path))


def test_the_client_ca_is_reloaded_when_its_file_changes(
    guarded: serving.Running,
    client_ca: Path,
    api_server: ssl.SSLContext,
    ca: CertificateAuthority,
    tmp_path: Path,
) -> None:
    rotated = CertificateAuthority.generate(common_name="rotated webhook client CA")
    new_caller = caller(rotated, ca, tmp_path / "new")
    serving.write_atomically(client_ca, rotated.cert_pem)

    def new_served() -> bool | None:
        try:
            return mutate(guarded.url, new_caller) == [HUB_MIRRORED] or None
        except (ssl.SSLError, httpx.TransportError):
            return None

    serving.wait_for(new_served, what="a certificate from the rotated client CA accepted")
    refused_at_handshake(guarded, api_server)


def test_a_bad_client_ca_reload_keeps_the_previous_one(
    guarded: serving.Running, client_ca: Path, api_server: ssl.SSLContext
) -> None:
    def failed() -> float:
        return counted(guarded, "mirrorgate_certificate_reloads_total", result="failed")

    before = failed()
    serving.write_atomically(client_ca, b"not a certificate\n")
    serving.wait_for(
        lambda: failed() > before or None,
        what="the refused reload counted",
    )
    assert mutate(guarded.url, api_server) == [HUB_MIRRORED]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"", "not a PEM CA certificate", id="empty"),
        pytest.param(None, "holds no CA certificate", id="a-serving-certificate"),
        pytest.param(
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "not a PEM CA certificate",
            id="garbage",
        ),
    ],
)
def test_an_unusable_client_ca_names_the_file(
    tmp_path: Path, serving_pair: KeyPair, content: bytes | None, expected: str
) -> None:
    cert, key = serving.write_pair(tmp_path, serving_pair)
    path = tmp_path / "client-ca.crt"
    path.write_bytes(serving_pair.cert_pem if content is None else content)
    with pytest.raises(ConfigError) as error:
        tls.server_context(str(cert), str(key), str(path))
    assert str(error.value).startswith(f"{path}: {expected}")


def test_a_missing_client_ca_names_the_file(tmp_path: Path, serving_pair: KeyPair) -> None:
    cert, key = serving.write_pair(tmp_path, serving_pair)
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'absent.crt'}: "):
        tls.server_context(str(cert), str(key), str(tmp_path / "absent.crt"))


# --- the metrics listener ------------------------------------------------------------------------


def test_metrics_and_the_detailed_readyz_answer_on_the_metrics_port_without_a_client_certificate(
    guarded: serving.Running, ca: CertificateAuthority
) -> None:
    url = f"https://localhost:{guarded.metrics_port}"
    with httpx.Client(
        verify=serving.client_context(ca.cert_pem), timeout=serving.TIMEOUT
    ) as client:
        assert "mirrorgate_admissions_total" in client.get(f"{url}/metrics").text
        ready = client.get(f"{url}/readyz").json()
        assert client.get(f"{url}/healthz").text == "ok\n"
        # Only the monitoring endpoints: no admission is served without the client CA.
        assert client.post(f"{url}/mutate", json=review(pod(HUB_IMAGE))).status_code == 404
    assert set(ready) == {"ready", "version", "policy", "mode", "problems"}


def test_the_admission_port_keeps_a_minimal_readyz_and_no_metrics(
    guarded: serving.Running, api_server: ssl.SSLContext, ca: CertificateAuthority
) -> None:
    guarded.server.runtime.readiness["credential-store"] = lambda: "Secret mirrorgate/robot: gone"
    guarded.server.runtime.advisories.append(lambda: {"mirror harbor.example": "down"})
    with httpx.Client(verify=api_server, timeout=serving.TIMEOUT) as client:
        ready = client.get(f"{guarded.url}/readyz")
        assert client.get(f"{guarded.url}/healthz").text == "ok\n"
        assert client.get(f"{guarded.url}/metrics").status_code == 404
    assert (ready.status_code, ready.json()) == (503, {"ready": False})
    detailed = httpx.get(
        f"https://localhost:{guarded.metrics_port}/readyz",
        verify=serving.client_context(ca.cert_pem),
    ).json()
    assert detailed["problems"] == {
        "credential-store": "Secret mirrorgate/robot: gone",
        "mirror harbor.example": "down",
    }
