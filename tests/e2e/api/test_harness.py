"""Smoke tests: the real components behave as the rest of the e2e suite assumes."""

from __future__ import annotations

import ssl
import subprocess
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.e2e.harness import dockerconfig
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kube import warning_messages
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.registry_client import RegistryHTTPError

pytestmark = pytest.mark.e2e


def _pod(name: str, image: str, **spec: Any) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="app", image=image)], **spec),
    )


def _as_json(api: k8s.ApiClient, obj: object) -> dict[str, Any]:
    """The object as the API server's JSON (camelCase keys), for plain dict assertions."""
    data: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data


def test_api_server_accepts_namespace_and_pod(control_plane: ControlPlane, make_namespace):
    """A Pod is stored (and stays Pending: no scheduler) in a namespace made by the fixture."""
    ns = make_namespace({"mirrorgate.test/smoke": "yes"})
    with control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        namespace = _as_json(api, core.read_namespace(ns))
        assert namespace["metadata"]["labels"]["mirrorgate.test/smoke"] == "yes"
        created = _as_json(
            api, core.create_namespaced_pod(ns, _pod("smoke", "registry.example/app:1"))
        )
        assert created["spec"]["containers"][0]["image"] == "registry.example/app:1"
        # The ServiceAccount admission plugin ran: it defaults the account and mounts
        # the projected token volume, which proves it sits on the request path.
        assert created["spec"]["serviceAccountName"] == "default"
        assert any(v["name"].startswith("kube-api-access-") for v in created["spec"]["volumes"])
        stored = _as_json(api, core.read_namespaced_pod("smoke", ns))
        assert stored["status"]["phase"] == "Pending"


def test_admin_kubeconfig_and_ca(control_plane: ControlPlane):
    """The kubeconfig file works on its own and the CA verifies the serving certificate."""
    kubeconfig = str(control_plane.kubeconfig)
    api = k8s_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    with api:
        version = k8s.VersionApi(api).get_code()
    # major/minor, not git_version: a build without version ldflags says v0.0.0-master.
    assert (version.major, version.minor.rstrip("+").isdigit()) == ("1", True)
    context = ssl.create_default_context(cadata=control_plane.ca_pem.decode())
    # Anonymous requests are authenticated as system:anonymous and /version is public.
    response = httpx.get(f"{control_plane.url}/version", verify=context, trust_env=False)
    assert response.status_code == 200


def test_rbac_is_enforced(control_plane: ControlPlane, make_namespace):
    """A user outside system:masters is forbidden: authorization is real RBAC."""
    ns = make_namespace()
    with (
        control_plane.api_client(user="nobody", groups=()) as api,
        pytest.raises(k8s.ApiException) as excinfo,
    ):
        k8s.CoreV1Api(api).list_namespaced_pod(ns)
    assert excinfo.value.status == 403


def test_warning_headers_are_readable(control_plane: ControlPlane, make_namespace):
    """Response `Warning` headers reach the client (webhook warnings travel the same way)."""
    ns = make_namespace()
    # A deprecated node label in nodeSelector makes kube-apiserver itself add a warning.
    pod = _pod("warned", "registry.example/app:1", node_selector={"beta.kubernetes.io/os": "linux"})
    with control_plane.api_client() as api:
        _, status, headers = k8s.CoreV1Api(api).create_namespaced_pod_with_http_info(ns, pod)
    assert status == 201
    warnings = warning_messages(headers)
    assert any("beta.kubernetes.io/os" in w for w in warnings), warnings


def test_mirror_refuses_missing_credentials(registry: RegistryStack):
    """Without credentials the mirror answers 401 with a Basic challenge."""
    context = ssl.create_default_context(cafile=str(registry.ca_path))
    response = httpx.get(f"https://{registry.host}/v2/", verify=context, trust_env=False)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Basic ")
    with pytest.raises(RegistryHTTPError) as excinfo:
        registry.pull(registry.mirror_image, {"auths": {}})
    assert excinfo.value.status == 401


def test_mirror_refuses_wrong_password(registry: RegistryStack):
    """A wrong password is a 401, and the error does not echo the credentials."""
    wrong = "not-the-mirror-password"
    with pytest.raises(RegistryHTTPError) as excinfo:
        registry.pull(registry.mirror_image, registry.dockerconfigjson(password=wrong))
    assert excinfo.value.status == 401
    message = str(excinfo.value)
    # Booleans, so a failing assert cannot print the real password either.
    leaked = registry.password in message or wrong in message
    assert not leaked, "the 401 error message echoes a password"


def test_pull_through_mirror_matches_upstream(registry: RegistryStack):
    """A correct .dockerconfigjson pulls via the mirror the very digest the upstream serves."""
    secret = registry.dockerconfigjson()
    entry = secret["auths"][registry.host]
    assert {"auth", "username", "password"} <= entry.keys()
    via_mirror = registry.pull(registry.mirror_image, secret)
    upstream_secret = dockerconfig.encode(
        registry.upstream_host, registry.upstream_username, registry.upstream_password
    )
    via_upstream = registry.pull(registry.upstream_image, upstream_secret)
    assert via_mirror == via_upstream == registry.digest
    # By digest too, which is how a rewritten, pinned image reference is pulled.
    assert registry.pull(f"{registry.host}/{registry.repository}@{registry.digest}", secret) == (
        registry.digest
    )


def test_kustomize_runs(kustomize, tmp_path):
    """The pinned kustomize builds a trivial kustomization (manifests tests rely on it)."""
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [cm.yaml]\nnamePrefix: e2e-\n"
    )
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    out = subprocess.run(
        [str(kustomize), "build", str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "name: e2e-x" in out.stdout
