"""Secretless pulls against a real API server: mirrorgate with `--kubelet-port`, the real
plugin binary, Pod-bound tokens from TokenRequest and kubelet certificates from the API
server's own client CA. Shared by tests/e2e/api/test_kubelet_credentials.py and
bench/kubelet_bench.py.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client as k8s

from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kube import create_namespace
from tests.e2e.harness.procs import free_port
from tests.e2e.harness.testimages import go_binary

__all__ = [
    "AUDIENCE",
    "CredentialServer",
    "credential_request",
    "hub_policy",
    "kubelet_pem",
    "pod_tokens",
    "run_plugin",
    "start_credential_server",
]

AUDIENCE = "mirrorgate"
NODES = "system:nodes"


@dataclass
class CredentialServer:
    plane: ControlPlane
    server: mg.Mirrorgate
    url: str
    """The credential endpoint's URL."""
    plugin: Path
    workdir: Path


def start_credential_server(
    plane: ControlPlane,
    workdir: Path,
    *,
    policy: str,
    credential: str,
    registry: str,
    username: str,
    password: str,
    args: Sequence[str] = (),
) -> CredentialServer:
    """mirrorgate (admin kubeconfig, the kubernetes store holding ``credential``'s login)
    serving the credential endpoint, its metrics on a port of their own, and the plugin."""
    with plane.api_client() as api:
        create_namespace(api, mg.NAMESPACE)
        k8s.CoreV1Api(api).create_namespaced_secret(
            mg.NAMESPACE,
            {  # type: ignore[arg-type]
                "metadata": {"name": credential, "labels": {"mirrorgate.io/credential": "true"}},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {
                    ".dockerconfigjson": json.dumps(
                        {"auths": {registry: {"username": username, "password": password}}}
                    )
                },
            },
        )
    port = free_port()
    server = mg.start_mirrorgate(
        workdir / "server",
        plane,
        policy=policy,
        kubeconfig=plane.kubeconfig,
        args=["--store", "kubernetes", "--kubelet-port", str(port), *args],
        client_ca=True,  # metrics on a port of their own
    )
    plugin = workdir / "mirrorgate-credential-provider"
    plugin.write_bytes(go_binary("credential-provider", sources=REPO_ROOT / "plugins"))
    plugin.chmod(0o755)
    return CredentialServer(
        plane, server, f"https://127.0.0.1:{port}/kubelet-credentials", plugin, workdir
    )


def hub_policy(mirror: str, granted: str, *, delivery: str = "kubelet") -> str:
    """Docker Hub through ``mirror``/hub, its credential hub-robot granted to ``granted``
    and delivered by the kubelet (the endpoint serves no other delivery)."""
    return (
        f"mirrors:\n  - source: docker.io\n    mirror: {mirror}/hub\n    credential: hub-robot\n"
        f"credentials:\n  hub-robot: {{namespaces: [{granted!r}], delivery: {delivery}}}\n"
    )


def kubelet_pem(plane: ControlPlane, path: Path, common_name: str, *groups: str) -> Path:
    """A client certificate from the API server's client CA, cert and key in one file as the
    kubelet keeps kubelet-client-current.pem (a node's: ``system:node:<n>``, ``system:nodes``)."""
    issued = plane.ca.issue_client(common_name=common_name, organizations=list(groups or (NODES,)))
    path.write_bytes(issued.cert_pem + issued.key_pem)
    path.chmod(0o600)
    return path


def pod_tokens(
    plane: ControlPlane,
    namespace: str,
    node: str,
    *,
    image: str,
    audience: str = AUDIENCE,
    count: int = 1,
) -> list[str]:
    """``count`` tokens of the namespace's ServiceAccount `web`, bound to a new Pod on
    ``node``: what the kubelet mints for a pull, and what a tenant allowed TokenRequest can
    mint too."""
    with plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        for create in (
            lambda: core.create_node({"metadata": {"name": node}}),  # type: ignore[arg-type]
            lambda: core.create_namespaced_service_account(
                namespace,
                {"metadata": {"name": "web"}},  # type: ignore[arg-type]
            ),
        ):
            try:
                create()
            except k8s.ApiException as error:
                if error.status != 409:
                    raise
        pod_name = f"web-{secrets.token_hex(3)}"
        pod = core.create_namespaced_pod(
            namespace,
            {  # type: ignore[arg-type]
                "metadata": {"name": pod_name},
                "spec": {
                    "serviceAccountName": "web",
                    "nodeName": node,
                    "containers": [{"name": "web", "image": image}],
                },
            },
        )
        assert pod.metadata is not None
        tokens = []
        for _ in range(count):
            answer = core.create_namespaced_service_account_token(
                "web",
                namespace,
                {  # type: ignore[arg-type]
                    "spec": {
                        "audiences": [audience],
                        "expirationSeconds": 3600,
                        "boundObjectRef": {
                            "kind": "Pod",
                            "apiVersion": "v1",
                            "name": pod_name,
                            "uid": pod.metadata.uid,
                        },
                    }
                },
            )
            assert answer.status is not None
            tokens.append(str(answer.status.token))
        return tokens


def credential_request(image: str, token: str) -> str:
    """The kubelet's CredentialProviderRequest for ``image`` with ``token``."""
    return json.dumps(
        {
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "kind": "CredentialProviderRequest",
            "image": image,
            "serviceAccountToken": token,
            "serviceAccountAnnotations": {},
        }
    )


def run_plugin(
    setup: CredentialServer, client_cert: Path, token: str, image: str
) -> subprocess.CompletedProcess[str]:
    """The plugin, run as the kubelet runs it: the request on stdin, a clean environment."""
    return subprocess.run(
        [
            str(setup.plugin),
            f"--url={setup.url}",
            f"--ca-file={setup.server.ca_path}",
            f"--client-cert={client_cert}",
        ],
        input=credential_request(image, token),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
