"""`serve --client-ca` against the real API server: it presents its webhook client
certificate from its AdmissionConfiguration and Pods are rewritten; any other caller is
refused at the TLS handshake, and the monitoring endpoints answer on the metrics port."""

from __future__ import annotations

import secrets
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from kubernetes import client as k8s

from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import register_for_suite, suite_namespace
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import DOCKERHUB_MIRROR, Installed
from tests.webhook import scrape

pytestmark = pytest.mark.e2e

POLICY = f"mirrors:\n  - source: docker.io\n    mirror: {DOCKERHUB_MIRROR}\n"


@dataclass
class Guarded:
    server: mg.Mirrorgate
    namespace: str
    api: k8s.ApiClient

    def dropped(self, reason: str) -> float:
        """mirrorgate_connections_dropped_total{reason}, read on the metrics port."""
        assert self.server.metrics_url is not None
        page = httpx.get(
            f"{self.server.metrics_url}/metrics",
            verify=ssl.create_default_context(cafile=str(self.server.ca_path)),
            timeout=10,
        ).text
        return scrape.samples(page).get(
            ("mirrorgate_connections_dropped_total", frozenset({("reason", reason)})), 0.0
        )


@pytest.fixture(scope="module")
def guarded(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    suite = f"callers-{secrets.token_hex(4)}"
    plane = installed.control_plane
    with plane.api_client() as api:
        server = mg.start_mirrorgate(
            tmp_path_factory.mktemp("callers"), plane, policy=POLICY, client_ca=True
        )
        name = f"mirrorgate-e2e-{suite}"
        try:
            register_for_suite(api, installed.configuration, server, name=name, suite=suite)
            yield Guarded(server, suite_namespace(api, "callers", suite), api)
        finally:
            mg.unregister(api, name)
            server.stop()


def test_the_api_server_presents_its_certificate_and_the_pod_is_rewritten(
    guarded: Guarded,
) -> None:
    """failurePolicy Fail: a refused call would refuse the Pod, not admit it as written."""
    body = {
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
    }

    def created() -> str | None:
        try:
            stored, _ = kube.create_pod(guarded.api, guarded.namespace, body, dry_run=True)
        except k8s.ApiException as error:
            return f"refused: {error.reason}"  # the registration may not be in force yet
        image = stored["spec"]["containers"][0]["image"]
        return None if image.startswith(DOCKERHUB_MIRROR) else f"admitted as {image}"

    wait_until(created, timeout=30, what="the Pod rewritten through --client-ca", interval=0.2)
    stored, _ = kube.create_pod(guarded.api, guarded.namespace, body)
    assert stored["spec"]["containers"][0]["image"] == f"{DOCKERHUB_MIRROR}/library/nginx:1.27"


def refused(guarded: Guarded, context: ssl.SSLContext) -> None:
    """A /mutate call that never gets an HTTP answer, counted as a failed handshake."""
    before = guarded.dropped("handshake-failed")
    with pytest.raises((ssl.SSLError, httpx.TransportError)):
        httpx.post(
            f"{guarded.server.url}/mutate",
            json={"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
            verify=context,
            timeout=10,
        )
    wait_until(
        lambda: None if guarded.dropped("handshake-failed") > before else "not counted",
        timeout=10,
        what="the refused handshake counted",
        interval=0.1,
    )


def test_a_caller_without_a_client_certificate_is_refused_at_the_handshake(
    guarded: Guarded,
) -> None:
    refused(guarded, ssl.create_default_context(cafile=str(guarded.server.ca_path)))


def test_a_certificate_from_the_cluster_ca_is_not_the_api_servers(
    guarded: Guarded, installed: Installed, tmp_path: Path
) -> None:
    """Even an admin's certificate: only the webhook client CA's certificates are callers."""
    plane = installed.control_plane
    issued = plane.ca.issue_client(common_name="mirrorgate-e2e-admin", organizations=[])
    cert, key = tmp_path / "admin.crt", tmp_path / "admin.key"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    context = ssl.create_default_context(cafile=str(guarded.server.ca_path))
    context.load_cert_chain(cert, key)
    refused(guarded, context)


def test_the_admission_port_tells_the_api_server_only_ready_or_not(
    guarded: Guarded, installed: Installed
) -> None:
    """With the API server's own client pair: the minimal /readyz, and no /metrics there."""
    pair = installed.control_plane.webhook_client_ca.parent
    context = ssl.create_default_context(cafile=str(guarded.server.ca_path))
    context.load_cert_chain(pair / "webhook-client.crt", pair / "webhook-client.key")
    with httpx.Client(base_url=guarded.server.url, verify=context, timeout=10) as client:
        assert client.get("/readyz").json() == {"ready": True}
        assert client.get("/metrics").status_code == 404
