"""The plugin host in the chart and in the documented kustomize overlay: the plugins'
container holds no API token, and the chart's plugin image a digest.

Rendered with the pinned helm (`helm template`) and kustomize, as tests/e2e/api/test_helm.py
renders the chart and the overlays.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import helm as h
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT

pytestmark = pytest.mark.e2e

PLUGINS = {
    "credentialProviders.image.repository": "plugins.example/p",
    "credentialProviders.image.digest": "sha256:" + "c" * 64,
    "credentialProviders.config.apiVersion": "kubelet.config.k8s.io/v1",
    "credentialProviders.config.kind": "CredentialProviderConfig",
    "credentialProviders.config.providers[0].name": "p",
    "credentialProviders.config.providers[0].matchImages[0]": "*.example",
    "credentialProviders.config.providers[0].defaultCacheDuration": "1h",
    "credentialProviders.config.providers[0].apiVersion": "credentialprovider.kubelet.k8s.io/v1",
}
SOCKET = "/run/mirrorgate-plugins/plugins.sock"
API_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def _pod(helm: Path, home: Path, values: dict[str, str]) -> dict[str, Any]:
    (deployment,) = [o for o in h.template(helm, home, values) if o["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _assert_plugins_apart(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The plugin host runs the plugins and holds no API token; serve holds it and asks
    the host over the shared socket. Every container's mounts, by container and volume."""
    assert spec["automountServiceAccountToken"] is False
    (host,) = [c for c in spec["initContainers"] if c["name"] == "plugin-host"]
    (serve,) = spec["containers"]
    assert host["restartPolicy"] == "Always"
    assert host["args"][:2] == ["plugin-host", f"--socket={SOCKET}"]
    assert f"--credential-provider-socket={SOCKET}" in serve["args"]
    assert not [a for a in serve["args"] if a.startswith("--credential-provider-bin-dir")]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {
        c["name"]: {m["name"]: m for m in c.get("volumeMounts", [])}
        for c in (*spec["initContainers"], serve)
    }
    # The API server's token: serve's alone, where in-cluster clients look for it.
    assert mounts["mirrorgate"]["kube-api-access"]["mountPath"] == API_TOKEN_DIR
    api_token = volumes["kube-api-access"]["projected"]["sources"][0]["serviceAccountToken"]
    assert "audience" not in api_token  # the API server's own
    for name in set(mounts) - {"mirrorgate"}:
        assert "kube-api-access" not in mounts[name]
        assert API_TOKEN_DIR not in {m["mountPath"] for m in mounts[name].values()}
    # The socket's volume is shared; the plugins' binaries are not serve's.
    assert mounts["plugin-host"]["plugin-socket"]["mountPath"] == "/run/mirrorgate-plugins"
    assert mounts["mirrorgate"]["plugin-socket"]["readOnly"] is True
    assert "credential-provider-bin" not in mounts["mirrorgate"]
    return mounts


def test_the_plugins_run_in_a_sidecar_that_holds_no_api_token(helm: Path, home: Path) -> None:
    spec = _pod(
        helm,
        home,
        {
            **PLUGINS,
            "credentialProviders.host.token.audience": "sts.amazonaws.com",
            "credentialProviders.host.env[0].name": "AWS_ROLE_ARN",
            "credentialProviders.host.env[0].value": "arn:aws:iam::1:role/r",
            "extraEnv[0].name": "ONLY_FOR_SERVE",
            "extraEnv[0].value": "x",
        },
    )
    copier, host = spec["initContainers"]
    (serve,) = spec["containers"]
    assert copier["image"] == "plugins.example/p@sha256:" + "c" * 64
    mounts = _assert_plugins_apart(spec)
    volumes = {v["name"]: v for v in spec["volumes"]}
    # The cloud's token: the plugin host's alone, of the audience asked for.
    assert volumes["plugin-token"]["projected"]["sources"] == [
        {
            "serviceAccountToken": {
                "path": "token",
                "audience": "sts.amazonaws.com",
                "expirationSeconds": 3600,
            }
        }
    ]
    assert "plugin-token" in mounts["plugin-host"]
    assert "plugin-token" not in mounts["mirrorgate"]
    # serve's environment is serve's.
    assert {e["name"]: e["value"] for e in host["env"]} == {"AWS_ROLE_ARN": "arn:aws:iam::1:role/r"}
    assert {e["name"] for e in serve["env"]} == {"ONLY_FOR_SERVE"}


def test_without_plugins_the_pod_is_as_before(helm: Path, home: Path) -> None:
    spec = _pod(helm, home, {})
    assert "automountServiceAccountToken" not in spec
    assert "initContainers" not in spec
    assert not {"plugin-socket", "kube-api-access"} & {v["name"] for v in spec["volumes"]}


@pytest.mark.parametrize("tag", ["v1.34.0", ""])
def test_a_plugin_image_without_a_digest_is_refused(helm: Path, home: Path, tag: str) -> None:
    values = {
        **PLUGINS,
        "credentialProviders.image.digest": "",
        "credentialProviders.image.tag": tag,
    }
    refused = h.refused(helm, home, values)
    assert "credentialProviders.image.digest: give the plugin image by digest (sha256:...)" in (
        refused
    )


def test_an_api_server_audience_is_not_a_plugin_token(helm: Path, home: Path) -> None:
    refused = h.refused(
        helm,
        home,
        {**PLUGINS, "credentialProviders.host.token.audience": "https://kubernetes.default.svc"},
    )
    assert "credentialProviders.host.token.audience" in refused


def test_the_documented_kustomize_overlay_runs_the_plugins_apart(
    kustomize: Path, tmp_path: Path
) -> None:
    doc = (REPO_ROOT / "docs" / "credential-providers.md").read_text()
    files = dict(re.findall(r"```yaml\n# kustomize: (\S+)\n(.*?)```", doc, re.DOTALL))
    assert set(files) == {"kustomization.yaml", "plugin-host.yaml"}
    base = os.path.relpath(REPO_ROOT / "manifests" / "base", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        re.sub(r"- \.\./mirrorgate/manifests/base", f"- {base}", files["kustomization.yaml"])
    )
    (tmp_path / "plugin-host.yaml").write_text(files["plugin-host.yaml"])
    (tmp_path / "config.yaml").write_text("kind: CredentialProviderConfig\n")
    objects = mg.render(kustomize, str(tmp_path))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    _assert_plugins_apart(deployment["spec"]["template"]["spec"])
    assert ("ConfigMap", "mirrorgate-credential-providers") in {
        (o["kind"], o["metadata"]["name"]) for o in objects
    }
