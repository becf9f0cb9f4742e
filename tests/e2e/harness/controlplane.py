"""A real etcd + kube-apiserver pair on loopback, with an admin kubeconfig.

There is no controller-manager and no scheduler: Pods stay Pending, namespaces never
finish deleting and ServiceAccounts are not created automatically. What is real is
everything on the request path: authentication, RBAC, admission (including the
ServiceAccount plugin and the webhook plugins) and storage.

The API server presents a client certificate to every webhook that asks for one, as
an AdmissionConfiguration makes it do on a real cluster (docs/install.md, "Only the API
server calls mirrorgate"): issued by a CA of its own, :attr:`ControlPlane.webhook_client_ca`,
which is what `serve --client-ca` is given.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client as k8s

from mirrorgate.certs.authority import CertificateAuthority, KeyPair
from tests.e2e.harness.binaries import built_binary
from tests.e2e.harness.procs import ManagedProcess, free_port, stop_all, wait_until

ETCD_READY_TIMEOUT = 30.0
# A cold kube-apiserver runs ~40 post-start hooks (RBAC bootstrap, priority
# classes, ...) before /readyz is green; 90 s leaves room on a loaded 2-core box.
APISERVER_READY_TIMEOUT = 90.0
ADMIN_USER = "mirrorgate-e2e-admin"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def _write(path: Path, data: bytes, *, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _https_ready(url: str, context: ssl.SSLContext) -> str | None:
    """None when GET `url` answers 200; otherwise a short reason to report on timeout."""
    try:
        response = httpx.get(url, verify=context, timeout=5, trust_env=False)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if response.status_code == 200:
        return None
    # /readyz?verbose lists the failing checks; keep only those lines.
    failing = [line for line in response.text.splitlines() if "failed" in line]
    return f"HTTP {response.status_code}: {'; '.join(failing) or response.text[:200]}"


def _etcd_healthy(url: str) -> str | None:
    try:
        response = httpx.get(url, timeout=2, trust_env=False)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if response.status_code == 200 and response.json().get("health") == "true":
        return None
    return f"HTTP {response.status_code}: {response.text[:200]}"


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver; what the `control_plane` fixture yields."""

    url: str
    kubeconfig: Path
    ca_pem: bytes
    ca_path: Path
    ca: CertificateAuthority = field(repr=False)
    workdir: Path
    webhook_client_ca: Path
    """The CA (PEM) of the client certificate the API server presents to webhooks."""
    processes: list[ManagedProcess] = field(default_factory=list, repr=False)
    timings: dict[str, float] = field(default_factory=dict)
    _clients: list[k8s.ApiClient] = field(default_factory=list, repr=False)

    def api_client(
        self, user: str = ADMIN_USER, groups: Sequence[str] = ("system:masters",)
    ) -> k8s.ApiClient:
        """A configured ApiClient authenticating with a client certificate for user/groups.

        The default is a cluster admin; pass another user and groups to test RBAC for
        real. Use it as a context manager (`with cp.api_client() as api:`); any client
        left open is closed when the control plane stops.
        """
        key_pair = self._client_key_pair(user, groups)
        configuration = k8s.Configuration(host=self.url)
        configuration.ssl_ca_cert = str(self.ca_path)
        configuration.cert_file = str(key_pair[0])
        configuration.key_file = str(key_pair[1])
        api = k8s.ApiClient(configuration)
        self._clients.append(api)
        return api

    def kubeconfig_for(
        self, user: str, groups: Sequence[str] = (), *, url: str | None = None
    ) -> Path:
        """A self-contained kubeconfig for `user` in `groups` (real RBAC applies).

        `url` overrides the server address, e.g. a closed port to make the API
        unreachable for real.
        """
        cert, key = self._client_key_pair(user, groups)
        pair = KeyPair(cert_pem=cert.read_bytes(), key_pem=key.read_bytes())
        path = self.workdir / "clients" / f"{cert.stem}-{abs(hash(url or ''))}.kubeconfig"
        _write(path, _kubeconfig(url or self.url, self.ca_pem, pair, user=user), private=True)
        return path

    def _client_key_pair(self, user: str, groups: Sequence[str]) -> tuple[Path, Path]:
        directory = self.workdir / "clients"
        directory.mkdir(exist_ok=True)
        # One file pair per identity; the kubernetes client wants paths, not bytes.
        stem = base64.urlsafe_b64encode(json.dumps([user, *groups]).encode()).decode()
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        if not cert.exists():
            issued = self.ca.issue_client(common_name=user, organizations=list(groups))
            _write(key, issued.key_pem, private=True)
            _write(cert, issued.cert_pem)
        return cert, key

    def describe(self, lines: int = 30) -> str:
        """Log tails of etcd and kube-apiserver for failure reports."""
        return "\n\n".join(p.describe_failure(lines) for p in self.processes)

    def stop(self) -> None:
        try:
            for api in self._clients:
                api.close()  # type: ignore[no-untyped-call]  # kubernetes leaves it unannotated
            self._clients.clear()
        finally:
            stop_all(self.processes)


def _kubeconfig(url: str, ca_pem: bytes, admin: KeyPair, *, user: str = ADMIN_USER) -> bytes:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    # Self-contained (data inlined) so kubectl or kustomize-driven tools can use it
    # as-is; JSON is valid YAML, so no YAML writer is needed.
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {"server": url, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(admin.cert_pem),
                    "client-key-data": b64(admin.key_pem),
                },
            }
        ],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    return json.dumps(config, indent=2).encode()


WEBHOOK_CLIENT_NAME = "kube-apiserver"
"""The common name of the API server's webhook client certificate."""


def _webhook_client(workdir: Path) -> tuple[Path, Path]:
    """The API server's webhook client: its CA's file and the AdmissionConfiguration.

    The kubeconfig's one user is ``*``: the certificate goes to every webhook that asks
    for one (a host process on a loopback port, or the Service in the node suite), and a
    webhook that asks for none gets none. A real cluster names the Service's host
    (``mirrorgate.mirrorgate.svc``); ``*`` is the API server's fallback for any host.
    """
    directory = workdir / "admission"
    directory.mkdir(parents=True, exist_ok=True)
    authority = CertificateAuthority.generate(common_name="mirrorgate e2e webhook client CA")
    pair = authority.issue_client(common_name=WEBHOOK_CLIENT_NAME, organizations=[])
    cert = _write(directory / "webhook-client.crt", pair.cert_pem)
    key = _write(directory / "webhook-client.key", pair.key_pem, private=True)
    users = [{"name": "*", "user": {"client-certificate": str(cert), "client-key": str(key)}}]
    kubeconfig = _write(
        directory / "webhooks.kubeconfig",
        json.dumps({"apiVersion": "v1", "kind": "Config", "users": users}).encode(),
    )
    webhook = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    admission = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {"name": plugin, "configuration": webhook}
            for plugin in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
        ],
    }
    config = _write(directory / "admission.yaml", json.dumps(admission).encode())
    return _write(directory / "webhook-client-ca.crt", authority.cert_pem), config


def start_control_plane(
    workdir: Path,
    *,
    apiserver_args: Sequence[str] = (),
    ca: CertificateAuthority | None = None,
    authorization_modes: Sequence[str] = ("RBAC",),
) -> ControlPlane:
    """Start etcd then kube-apiserver, wait for /readyz; on any error stop both and raise.

    ``apiserver_args`` are appended to kube-apiserver's flags (the benchmarks
    add an audit log). ``ca`` is the cluster CA to use, for a caller that must
    issue certificates named in those flags (the node's kubelet client).
    ``authorization_modes`` is `--authorization-mode` (a node cluster adds the
    Node authorizer before RBAC); a repeated flag would append, not replace.
    """
    etcd_bin = built_binary("etcd")
    apiserver_bin = built_binary("kube-apiserver")
    workdir.mkdir(parents=True, exist_ok=True)

    # One CA for serving and client certificates: the client CA is what makes
    # `system:masters` in the admin certificate mean cluster-admin.
    ca = ca or CertificateAuthority.generate(common_name="mirrorgate e2e cluster CA")
    ca_path = _write(workdir / "ca.crt", ca.cert_pem)
    serving = ca.issue_serving(
        dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        ips=["127.0.0.1"],
    )
    serving_cert = _write(workdir / "apiserver.crt", serving.cert_pem)
    serving_key = _write(workdir / "apiserver.key", serving.key_pem, private=True)
    admin = ca.issue_client(common_name=ADMIN_USER, organizations=["system:masters"])
    # P-256 signs ServiceAccount tokens as ES256, which kube-apiserver supports.
    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_private = _write(
        workdir / "sa.key",
        sa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        private=True,
    )
    sa_public = _write(
        workdir / "sa.pub",
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )

    etcd_client, etcd_peer, apiserver_port = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{apiserver_port}"
    kubeconfig = _write(workdir / "kubeconfig", _kubeconfig(url, ca.cert_pem, admin), private=True)
    webhook_client_ca, admission_config = _webhook_client(workdir)
    plane = ControlPlane(
        url=url,
        kubeconfig=kubeconfig,
        ca_pem=ca.cert_pem,
        ca_path=ca_path,
        ca=ca,
        workdir=workdir,
        webhook_client_ca=webhook_client_ca,
    )
    # The admin pair under the name api_client() would give it, so it is not reissued.
    admin_cert, admin_key = plane._client_key_pair(ADMIN_USER, ("system:masters",))
    try:
        started = time.monotonic()
        etcd_url = f"http://127.0.0.1:{etcd_client}"
        peer_url = f"http://127.0.0.1:{etcd_peer}"
        etcd = ManagedProcess(
            "etcd",
            [
                str(etcd_bin),
                "--name=e2e",
                f"--data-dir={workdir / 'etcd-data'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e2e={peer_url}",
                # Throwaway data: skipping fsync makes every write ~10x faster.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            workdir / "etcd.log",
        )
        plane.processes.append(etcd)
        plane.timings["etcd_ready_s"] = wait_until(
            lambda: _etcd_healthy(f"{etcd_url}/health"),
            timeout=ETCD_READY_TIMEOUT,
            what=f"etcd at {etcd_url}",
            alive=etcd.exited,
        )

        cert_dir = workdir / "apiserver-certs"
        cert_dir.mkdir(exist_ok=True)
        apiserver = ManagedProcess(
            "kube-apiserver",
            [
                str(apiserver_bin),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                # Without a routable interface the apiserver cannot pick an address to
                # advertise; loopback is what every client here uses anyway.
                "--advertise-address=127.0.0.1",
                # The `kubernetes` Service endpoints may not point at loopback, so the
                # default lease reconciler refuses to start with the address above.
                # Nothing here routes through that Service anyway.
                "--endpoint-reconciler-type=none",
                f"--secure-port={apiserver_port}",
                f"--cert-dir={cert_dir}",
                f"--tls-cert-file={serving_cert}",
                f"--tls-private-key-file={serving_key}",
                f"--client-ca-file={ca_path}",
                f"--authorization-mode={','.join(authorization_modes)}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={sa_public}",
                f"--service-account-signing-key-file={sa_private}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--profiling=false",
                f"--admission-control-config-file={admission_config}",
                *apiserver_args,
            ],
            workdir / "kube-apiserver.log",
        )
        plane.processes.append(apiserver)
        context = ssl.create_default_context(cafile=str(ca_path))
        context.load_cert_chain(admin_cert, admin_key)
        plane.timings["apiserver_ready_s"] = wait_until(
            lambda: _https_ready(f"{url}/readyz?verbose", context),
            timeout=APISERVER_READY_TIMEOUT,
            what=f"kube-apiserver at {url}/readyz",
            interval=0.25,
            alive=apiserver.exited,
        )
        plane.timings["control_plane_ready_s"] = time.monotonic() - started
        return plane
    except BaseException as exc:
        detail = plane.describe(40)
        plane.stop()
        if isinstance(exc, TimeoutError | RuntimeError):
            raise RuntimeError(f"control plane failed to start: {exc}\n\n{detail}") from None
        raise
