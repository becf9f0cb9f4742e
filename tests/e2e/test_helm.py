"""The Helm chart (manifests/helm/mirrorgate): linted, compared with the kustomize
overlays field by field, accepted by a real API server's server-side dry run, and
installed, upgraded and uninstalled for real.

Without a node the chart's Pods never run; these are object-level tests. The
install test runs mirrorgate as a process with the identity and RBAC the chart
gave its ServiceAccount, so the Secrets it generates at run time are real.
"""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import dynamic
from kubernetes.dynamic.resource import ResourceList

from mirrorgate import certs
from tests.e2e import helm as h
from tests.e2e import mirrorgate as mg
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kube import cert_manager_crds, create_namespace, namespace_name
from tests.webhook.reviews import patch_ops, pod, response_of, review

pytestmark = pytest.mark.e2e

# What the chart renders for these values is what `kustomize build` renders for
# the overlay (the cert-manager overlay builds on enforce).
EQUIVALENT = [
    pytest.param({}, "overlays/audit", id="defaults=audit"),
    pytest.param({"mode": "enforce"}, "overlays/enforce", id="enforce"),
    pytest.param({"mode": "enforce", "certificates.mode": "cert-manager"},
                 "overlays/cert-manager", id="cert-manager"),
]
CREDENTIAL_VALUES = {"credentials.harbor-pull.registry": "harbor.corp.example",
                     "credentials.harbor-pull.username": "robot$pull",
                     "credentials.harbor-pull.password": "not-a-real-password"}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def _keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    keyed = {}
    for obj in objects:
        obj = json.loads(json.dumps(obj))  # a deep copy, normalised to JSON types
        if obj["kind"] == "ConfigMap" and "policy.yaml" in obj.get("data", {}):
            # The same policy: kustomize keeps the file's comments, Helm's toYaml drops them.
            obj["data"]["policy.yaml"] = yaml.safe_load(obj["data"]["policy.yaml"])
        keyed[(obj["kind"], obj["metadata"]["name"])] = obj
    return keyed


@pytest.mark.parametrize(("values", "overlay"), EQUIVALENT)
def test_chart_renders_what_the_overlay_renders(helm: Path, kustomize: Path, home: Path,
                                                values: dict[str, str], overlay: str) -> None:
    """Field by field the same objects, apart from Helm's own labels and the
    Namespace (Helm installs into a namespace, it does not own it)."""
    charted = _keyed(h.without_helm_labels(h.template(helm, home, values)))
    kustomized = _keyed([o for o in mg.render(kustomize, overlay) if o["kind"] != "Namespace"])
    assert sorted(charted) == sorted(kustomized)
    for key, obj in kustomized.items():
        assert charted[key] == obj, key


MONITORING_FILES = ("prometheusrule.yaml", "dashboard.json")


def test_chart_monitoring_renders_what_the_monitoring_overlay_renders(
        helm: Path, kustomize: Path, home: Path) -> None:
    """monitoring.enabled adds the monitoring overlay's objects, field by field, and changes
    nothing else; off (the default), none of them is rendered."""
    plain = _keyed(h.without_helm_labels(h.template(helm, home)))
    charted = _keyed(h.without_helm_labels(h.template(helm, home,
                                                      {"monitoring.enabled": "true"})))
    assert {key: charted[key] for key in plain} == plain
    added = {key: obj for key, obj in charted.items() if key not in plain}
    kustomized = _keyed(mg.render(kustomize, "overlays/monitoring"))
    assert sorted(added) == sorted(kustomized) == [
        ("ConfigMap", "mirrorgate-dashboard"), ("PrometheusRule", "mirrorgate"),
        ("ServiceMonitor", "mirrorgate")]
    for key, obj in kustomized.items():
        assert added[key] == obj, key
    (endpoint,) = added[("ServiceMonitor", "mirrorgate")]["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    alerts = {rule["alert"] for group in added[("PrometheusRule", "mirrorgate")]["spec"]["groups"]
              for rule in group["rules"]}
    assert {"MirrorgateMirrorDown", "MirrorgateCredentialInvalid"} <= alerts


def test_chart_monitoring_follows_the_release_namespace_and_labels(helm: Path,
                                                                   home: Path) -> None:
    """In another namespace the scrape follows it; monitoring.labels reach all three objects."""
    objects = h.template(helm, home, {"monitoring.enabled": "true",
                                      "monitoring.labels.release": "prometheus"},
                         namespace="observed")
    added = {o["kind"]: o for o in objects if o["metadata"]["name"] in (
        "mirrorgate", "mirrorgate-dashboard") and o["kind"] in (
        "ServiceMonitor", "PrometheusRule", "ConfigMap")}
    assert sorted(added) == ["ConfigMap", "PrometheusRule", "ServiceMonitor"]
    for obj in added.values():
        assert obj["metadata"]["namespace"] == "observed"
        assert obj["metadata"]["labels"]["release"] == "prometheus"
    monitor = added["ServiceMonitor"]["spec"]
    assert monitor["namespaceSelector"]["matchNames"] == ["observed"]
    assert monitor["endpoints"][0]["tlsConfig"]["serverName"] == "mirrorgate.observed.svc"


@pytest.mark.parametrize("name", MONITORING_FILES)
def test_chart_monitoring_files_are_the_overlays(name: str) -> None:
    """Helm reads no file outside the chart: its copies must equal the overlay's, byte for byte."""
    overlay = mg.REPO / "manifests" / "overlays" / "monitoring" / name
    assert (h.CHART / "files" / name).read_bytes() == overlay.read_bytes(), (
        f"cp {overlay.relative_to(mg.REPO)} {h.CHART.relative_to(mg.REPO)}/files/")


def test_every_chart_object_carries_helms_labels(helm: Path, home: Path) -> None:
    """The labels stripped above are really there (the comparison is not vacuous)."""
    for obj in h.template(helm, home, {**CREDENTIAL_VALUES, "certificates.mode": "cert-manager",
                                       "monitoring.enabled": "true"}):
        assert set(obj["metadata"]["labels"]) >= h.HELM_LABELS, obj["metadata"]["name"]


@pytest.mark.parametrize("values", [
    {}, {"mode": "enforce", "failurePolicy": "Fail", "replicas": "1"},
    {"certificates.mode": "cert-manager", **CREDENTIAL_VALUES},
    {"excludedNamespaces[0]": "shop", "image.digest": "sha256:" + "a" * 64},
    {"monitoring.enabled": "true", "monitoring.labels.release": "prometheus"},
], ids=["defaults", "enforce-fail-one-replica", "cert-manager-credentials", "excluded-digest",
        "monitoring"])
def test_lint_is_clean(helm: Path, home: Path, values: dict[str, str]) -> None:
    done = h.run(helm, "lint", "--strict", str(h.CHART), *h.set_args(values), home=home)
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout
    assert "[ERROR]" not in done.stdout


@pytest.mark.parametrize(("values", "named"), [
    ({"mode": "enforcing"}, "at '/mode'"),
    ({"failurePolicy": "fail"}, "at '/failurePolicy'"),
    ({"certificates.mode": "vault"}, "at '/certificates/mode'"),
    ({"replicas": "0"}, "at '/replicas'"),
    ({"image.digest": "latest"}, "at '/image/digest'"),
    ({"credentials.harbor-pull.registry": "h.example"}, "at '/credentials/harbor-pull'"),
    ({"excludedNamespaces[0]": "Not_A_Namespace"}, "at '/excludedNamespaces/0'"),
    ({"replica": "2"}, "'replica'"),
    ({"monitoring.enabled": "yes"}, "at '/monitoring/enabled'"),
    ({"monitoring.interval": "30 seconds"}, "at '/monitoring/interval'"),
])
def test_bad_values_are_refused_naming_the_field(helm: Path, home: Path,
                                                 values: dict[str, str], named: str) -> None:
    done = h.run(helm, "template", "mirrorgate", str(h.CHART), *h.set_args(values),
                 home=home, check=False)
    assert done.returncode != 0
    assert named in done.stderr, done.stderr
    assert "goroutine" not in done.stderr
    assert "panic" not in done.stderr


@pytest.mark.parametrize("values", [
    {}, {"mode": "enforce", "failurePolicy": "Fail", **CREDENTIAL_VALUES},
    {"mode": "enforce", "certificates.mode": "cert-manager", "excludedNamespaces[0]": "shop"},
], ids=["defaults", "enforce-fail-credentials", "cert-manager"])
def test_render_is_accepted_by_server_side_dry_run(helm: Path, home: Path,
                                                   own_control_plane: ControlPlane,
                                                   values: dict[str, str]) -> None:
    with own_control_plane.api_client() as api:
        cert_manager_crds(api)
        namespace = create_namespace(api, namespace_name("helm-dry-run"))
        client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
        for obj in h.template(helm, home, values, namespace=namespace):
            resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            client.server_side_apply(  # type: ignore[no-untyped-call]
                resource, body=obj, namespace=obj["metadata"].get("namespace"),
                field_manager="mirrorgate-e2e", force_conflicts=True, dry_run="All")


def _get(api: k8s.ApiClient, api_version: str, kind: str, name: str,
         namespace: str | None = mg.NAMESPACE) -> dict[str, Any]:
    """One object as the API server stores it, as plain data."""
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    resource = client.resources.get(api_version=api_version, kind=kind)
    found: dict[str, Any] = resource.get(name=name, namespace=namespace).to_dict()
    return found


def _everything(api: k8s.ApiClient) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of every object of every listable resource."""
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    found = set()
    for resource in client.resources.search():
        if isinstance(resource, ResourceList) or "list" not in (resource.verbs or ()):
            continue  # the List kinds, and subresources (no list verb)
        if resource.kind in ("Event", "ComponentStatus"):
            continue  # events come and go; componentstatuses are not objects
        for item in resource.get().items:
            found.add((resource.kind, item.metadata.namespace or "", item.metadata.name))
    return found


def test_install_upgrade_uninstall_leaves_only_what_is_meant_to_stay(
        helm: Path, home: Path, own_control_plane: ControlPlane, tmp_path: Path) -> None:
    """helm install (audit) → helm upgrade to enforce with a credential → mirrorgate
    runs with the chart's RBAC and makes its Secrets → helm uninstall. Every object
    Helm made is gone. What stays: the namespace (made by --create-namespace, not
    Helm's) and what mirrorgate made at run time (its CA Secret, Lease,
    fingerprint key, the pull secret running Pods may still need and its record);
    docs/operations.md's clean-up command removes all but the CA and the Lease, which go
    with the namespace."""
    kubeconfig = own_control_plane.kubeconfig
    with own_control_plane.api_client() as api:
        # The example policy grants its credential to `shop` and `team-*`.
        shop = create_namespace(api, f"team-{namespace_name('helm-shop')}",
                                {"mirrorgate.io/mode": "enforce"})
        before = _everything(api)

        h.run(helm, "install", "mirrorgate", str(h.CHART), "--namespace", mg.NAMESPACE,
              "--create-namespace", home=home, kubeconfig=kubeconfig)
        deployment = _get(api, "apps/v1", "Deployment", "mirrorgate")
        assert "--audit-only" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert deployment["spec"]["replicas"] == 2

        h.run(helm, "upgrade", "mirrorgate", str(h.CHART), "--namespace", mg.NAMESPACE,
              "--set", "mode=enforce", *h.set_args(CREDENTIAL_VALUES), home=home,
              kubeconfig=kubeconfig)
        deployment = _get(api, "apps/v1", "Deployment", "mirrorgate")
        assert "--audit-only" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        central = _get(api, "v1", "Secret", "harbor-pull")
        assert central["type"] == "kubernetes.io/dockerconfigjson"
        auths = json.loads(base64.b64decode(central["data"][".dockerconfigjson"]))["auths"]
        assert auths["harbor.corp.example"]["username"] == "robot$pull"
        history = h.run(helm, "history", "mirrorgate", "--namespace", mg.NAMESPACE,
                        "-o", "json", home=home, kubeconfig=kubeconfig).stdout
        assert [r["status"] for r in json.loads(history)] == ["superseded", "deployed"]

        # mirrorgate as the chart's ServiceAccount, with the policy the chart
        # stored: its own certificates (Secret mirrorgate-tls, caBundle), the
        # Lease, and a pull secret made for a Pod in the opted-in namespace.
        policy = _get(api, "v1", "ConfigMap", "mirrorgate-policy")["data"]["policy.yaml"]
        server = mg.start_mirrorgate(
            tmp_path / "mirrorgate", own_control_plane, policy=policy,
            tls_secret="mirrorgate-tls",
            args=["--store", "kubernetes", "--webhook-config", "mirrorgate",
                  "--service", "mirrorgate", "--tls-name", "127.0.0.1"])
        try:
            ca_pem = base64.b64decode(
                _get(api, "v1", "Secret", "mirrorgate-tls")["data"][certs.CA_CERT])
            with httpx.Client(base_url=server.url, timeout=10, verify=ssl.create_default_context(
                    cadata=ca_pem.decode())) as https:
                answer = https.post("/mutate", json=review(pod("nginx:1.27"), namespace=shop))
            assert answer.status_code == 200
            assert {"op": "replace", "path": "/spec/containers/0/image",
                    "value": "harbor.corp.example/dockerhub-proxy/library/nginx:1.27",
                    } in patch_ops(response_of(answer.json()))
            generated = _get(api, "v1", "Secret", "mirrorgate-harbor-pull", shop)
            assert generated["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mirrorgate"
            webhooks = _get(api, "admissionregistration.k8s.io/v1",
                            "MutatingWebhookConfiguration", "mirrorgate", None)["webhooks"]
            assert all(w["clientConfig"]["caBundle"] for w in webhooks)
        finally:
            server.stop()

        h.run(helm, "uninstall", "mirrorgate", "--namespace", mg.NAMESPACE, home=home,
              kubeconfig=kubeconfig)
        made_at_run_time = {
            ("Secret", mg.NAMESPACE, "mirrorgate-tls"),  # its CA: a reinstall keeps caBundle
            ("Lease", mg.NAMESPACE, "mirrorgate-reconciler"),
            ("Secret", mg.NAMESPACE, "mirrorgate-fingerprint-key"),
            ("ConfigMap", mg.NAMESPACE, "mirrorgate-policy-accepted"),  # served if one is refused
            ("ConfigMap", mg.NAMESPACE, f"copy.{shop}.mirrorgate-harbor-pull"),  # its record
            ("Secret", shop, "mirrorgate-harbor-pull"),  # running Pods may still need it
        }
        assert _everything(api) - before == {("Namespace", "", mg.NAMESPACE), *made_at_run_time}
        assert before - _everything(api) == set()
        # docs/operations.md:
        # kubectl delete secret,configmap -A -l app.kubernetes.io/managed-by=mirrorgate
        client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
        for kind in ("Secret", "ConfigMap"):
            resource = client.resources.get(api_version="v1", kind=kind)
            made = resource.get(label_selector="app.kubernetes.io/managed-by=mirrorgate")
            for item in made.items:
                resource.delete(name=item.metadata.name, namespace=item.metadata.namespace)
        # What stays goes with `kubectl delete namespace mirrorgate`.
        assert _everything(api) - before == {
            ("Namespace", "", mg.NAMESPACE),
            ("Secret", mg.NAMESPACE, "mirrorgate-tls"),
            ("Lease", mg.NAMESPACE, "mirrorgate-reconciler"),
        }
