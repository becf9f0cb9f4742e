"""Secretless pulls against a real API server (issue 31, item 2): the real plugin binary asks
`serve --kubelet-port` for the login of a Pod, with tokens the API server issued
(TokenRequest bound to a Pod on a node) and reviewed (TokenReview), and client certificates
signed by the API server's own client CA, for the right node and for another.

The module has a control plane of its own: its mirrorgate reads the kubelets' client CA
from the API server's ConfigMap kube-system/extension-apiserver-authentication, as it does
by default in a cluster.
"""

from __future__ import annotations

import json
import secrets
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client as k8s

from tests.e2e.harness import fixtures_secrets as fx
from tests.e2e.harness import kubeletcreds as kc
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kube import create_namespace
from tests.e2e.harness.procs import wait_until

pytestmark = pytest.mark.e2e

Setup = kc.CredentialServer

AUDIENCE = kc.AUDIENCE
MIRROR = "mirror.kubelet-e2e.example"
USERNAME = "kubelet-robot"
PASSWORD = f"pw-{secrets.token_hex(12)}"
PULL_SECRET_PASSWORD = f"pw-{secrets.token_hex(12)}"
POLICY = (
    kc.hub_policy(MIRROR, "granted-*").replace(
        "credentials:\n",
        f"  - source: ghcr.io\n    mirror: {MIRROR}/ghcr\n    credential: ghcr-robot\n"
        "credentials:\n",
    )
    # Granted to the same namespaces but delivered as a pull secret (the default): its login
    # is in the store, and the kubelet never gets it.
    + "  ghcr-robot: {namespaces: ['granted-*']}\n"
)
IMAGE = f"{MIRROR}/hub/library/nginx:1.27"
PULL_SECRET_IMAGE = f"{MIRROR}/ghcr/org/app:1"


@pytest.fixture(scope="module")
def setup(
    own_control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    found = kc.start_credential_server(
        own_control_plane,
        tmp_path_factory.mktemp("kubelet-credentials"),
        policy=POLICY,
        credential="hub-robot",
        registry=MIRROR,
        username=USERNAME,
        password=PASSWORD,
    )
    with own_control_plane.api_client() as api:
        k8s.CoreV1Api(api).create_namespaced_secret(
            mg.NAMESPACE,
            {  # type: ignore[arg-type]
                "metadata": {"name": "ghcr-robot", "labels": {"mirrorgate.io/credential": "true"}},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {
                    ".dockerconfigjson": json.dumps(
                        {"auths": {MIRROR: {"username": "ghcr", "password": PULL_SECRET_PASSWORD}}}
                    )
                },
            },
        )
    try:
        yield found
    finally:
        found.server.stop()


def _pod_token(plane: ControlPlane, namespace: str, node: str, *, audience: str = AUDIENCE) -> str:
    (token,) = kc.pod_tokens(plane, namespace, node, image=IMAGE, audience=audience)
    return token


def _pem_pair(plane: ControlPlane, path: Path, common_name: str, *groups: str) -> Path:
    return kc.kubelet_pem(plane, path, common_name, *groups)


def _plugin(
    setup: Setup, client_cert: Path, token: str, image: str = IMAGE
) -> subprocess.CompletedProcess[str]:
    return kc.run_plugin(setup, client_cert, token, image)


def _refusals(setup: Setup, reason: str) -> float:
    """The refusals counted for ``reason``, read on the metrics port (--metrics-port)."""
    context = ssl.create_default_context(cafile=str(setup.server.ca_path))
    text = httpx.get(f"{setup.server.metrics_url}/metrics", verify=context, timeout=10).text
    return fx.metric(text, "mirrorgate_kubelet_credential_refusals_total", reason=reason)


def _enforced(setup: Setup, prefix: str) -> str:
    with setup.plane.api_client() as api:
        name = create_namespace(
            api, f"{prefix}-{secrets.token_hex(3)}", {"mirrorgate.io/mode": "enforce"}
        )
    return name


def _wait_granted(setup: Setup, cert: Path, token: str) -> subprocess.CompletedProcess[str]:
    """The first answer for a new namespace: mirrorgate's Namespace cache follows a watch."""
    done: list[subprocess.CompletedProcess[str]] = []

    def answered() -> str | None:
        done.append(_plugin(setup, cert, token))
        return None if done[-1].returncode == 0 else done[-1].stderr

    wait_until(answered, timeout=20, what="the login for a new enforced namespace", interval=0.3)
    return done[-1]


def test_the_kubelet_of_the_pods_node_gets_the_login(setup: Setup) -> None:
    namespace = _enforced(setup, "granted-a")
    token = _pod_token(setup.plane, namespace, "node-a")
    kubelet = _pem_pair(
        setup.plane, setup.workdir / "node-a.pem", "system:node:node-a", "system:nodes"
    )
    done = _wait_granted(setup, kubelet, token)
    answer = json.loads(done.stdout)
    assert answer["kind"] == "CredentialProviderResponse"
    assert answer["cacheKeyType"] == "Image"
    assert answer["cacheDuration"] == "300s"
    assert answer["auth"] == {
        f"{MIRROR}/hub/library/nginx": {"username": USERNAME, "password": PASSWORD}
    }
    assert done.stderr == ""
    logs = setup.server.logs()
    assert token not in logs
    assert PASSWORD not in logs


def test_another_nodes_kubelet_and_a_tenant_get_no_login_for_the_pods_token(
    setup: Setup,
) -> None:
    """The token is the Pod's own, valid and bound (a tenant with TokenRequest can mint the
    same); presented by node-b's kubelet, by a user certificate of the same CA, or with no
    certificate at all, it gets nothing, and the refusals are counted by reason."""
    namespace = _enforced(setup, "granted-b")
    token = _pod_token(setup.plane, namespace, "node-a")
    right = _pem_pair(setup.plane, setup.workdir / "a.pem", "system:node:node-a", "system:nodes")
    _wait_granted(setup, right, token)  # the token and namespace would get it from node-a
    wrong_before = _refusals(setup, "wrong-node")
    not_node_before = _refusals(setup, "not-a-node")

    other_node = _pem_pair(
        setup.plane, setup.workdir / "b.pem", "system:node:node-b", "system:nodes"
    )
    done = _plugin(setup, other_node, token)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "wrong-node" in done.stderr
    assert "bound to node 'node-a', the caller is node 'node-b'" in done.stderr

    tenant = _pem_pair(setup.plane, setup.workdir / "tenant.pem", "system:node:node-a", "tenants")
    done = _plugin(setup, tenant, token)
    assert done.returncode == 1
    assert "not-a-node" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr

    # Without a client certificate the handshake itself fails: nothing is read.
    context = ssl.create_default_context(cafile=str(setup.server.ca_path))
    with pytest.raises(httpx.HTTPError):
        httpx.post(
            setup.url, content=kc.credential_request(IMAGE, token), verify=context, timeout=5
        )

    assert _refusals(setup, "wrong-node") == wrong_before + 1
    assert _refusals(setup, "not-a-node") == not_node_before + 1
    logs = setup.server.logs()
    assert token not in logs
    assert PASSWORD not in logs


@pytest.mark.parametrize(
    ("prefix", "labelled", "audience", "image", "reason"),
    [
        ("ungranted", True, AUDIENCE, IMAGE, "not-granted"),
        ("granted-off", False, AUDIENCE, IMAGE, "not-enforced"),
        ("granted-aud", True, "someone-else", IMAGE, "token-invalid"),
        ("granted-img", True, AUDIENCE, "docker.io/library/nginx:1.27", "not-on-mirror"),
        ("granted-ps", True, AUDIENCE, PULL_SECRET_IMAGE, "not-kubelet-delivery"),
    ],
)
def test_what_the_pod_may_not_pull_gets_no_login(
    setup: Setup, prefix: str, labelled: bool, audience: str, image: str, reason: str
) -> None:
    with setup.plane.api_client() as api:
        namespace = create_namespace(
            api,
            f"{prefix}-{secrets.token_hex(3)}",
            {"mirrorgate.io/mode": "enforce"} if labelled else None,
        )
    token = _pod_token(setup.plane, namespace, "node-a", audience=audience)
    kubelet = _pem_pair(setup.plane, setup.workdir / "n.pem", "system:node:node-a", "system:nodes")
    before = _refusals(setup, reason)
    if labelled and reason != "not-granted":
        # Wait for the Namespace cache: until then the refusal would be not-enforced.
        wait_until(
            lambda: None if reason in _plugin(setup, kubelet, token, image).stderr else "not yet",
            timeout=20,
            what=f"a {reason} refusal",
            interval=0.3,
        )
        before = _refusals(setup, reason)
    done = _plugin(setup, kubelet, token, image)
    assert done.returncode == 1
    assert reason in done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    assert PULL_SECRET_PASSWORD not in done.stdout + done.stderr
    assert _refusals(setup, reason) == before + 1
    logs = setup.server.logs()
    assert token not in logs
    assert PULL_SECRET_PASSWORD not in logs


def test_a_deleted_pods_token_stops_working(setup: Setup) -> None:
    """TokenReview checks that the bound Pod still exists: the token of a deleted Pod is
    refused."""
    namespace = _enforced(setup, "granted-gone")
    token = _pod_token(setup.plane, namespace, "node-a")
    with setup.plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        (pod,) = core.list_namespaced_pod(namespace).items
        assert pod.metadata is not None
        core.delete_namespaced_pod(str(pod.metadata.name), namespace, grace_period_seconds=0)

        def gone() -> str | None:
            try:
                core.read_namespaced_pod(str(pod.metadata.name), namespace)  # type: ignore[union-attr]
            except k8s.ApiException as error:
                return None if error.status == 404 else str(error)
            return "still there"

        wait_until(gone, timeout=20, what="the Pod deleted")
    kubelet = _pem_pair(setup.plane, setup.workdir / "g.pem", "system:node:node-a", "system:nodes")
    done = _plugin(setup, kubelet, token)
    assert done.returncode == 1
    assert "token-invalid" in done.stderr
