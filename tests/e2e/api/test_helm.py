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
import re
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import dynamic
from kubernetes.dynamic.resource import ResourceList

from mirrorgate import certs, policy
from mirrorgate.webhook.credentials import providerconfig
from tests.e2e.harness import helm as h
from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.kube import cert_manager_crds, create_namespace, namespace_name
from tests.e2e.harness.procs import wait_until
from tests.webhook.reviews import patch_ops, pod, response_of, review

pytestmark = pytest.mark.e2e

# What the chart renders for these values is what `kustomize build` renders for
# the overlay (the cert-manager overlay builds on enforce).
EQUIVALENT = [
    pytest.param({}, "overlays/audit", id="defaults=audit"),
    pytest.param({"mode": "enforce"}, "overlays/enforce", id="enforce"),
    pytest.param(
        {"mode": "enforce", "certificates.mode": "cert-manager"},
        "overlays/cert-manager",
        id="cert-manager",
    ),
]
EXAMPLE_POLICY = REPO_ROOT / "examples" / "helm" / "policy-values.yaml"
"""The chart ships no policy: the install test passes this one (it grants `shop`)."""
CREDENTIAL_VALUES = {
    "credentials.harbor-pull.registry": "harbor.corp.example",
    "credentials.harbor-pull.username": "robot$pull",
    "credentials.harbor-pull.password": "not-a-real-password",
}


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


def _the_policy_apart(
    charted: dict[tuple[str, str], dict[str, Any]],
    kustomized: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """The one difference, on purpose: the chart's policy is the ClusterMirrorPolicy
    `mirrorgate` made from `policy:` (empty by default: no example survives in a user's
    policy), its CRDs in crds/ (not rendered by `helm template`); the kustomize base still
    serves the deprecated ConfigMap policy (its example) through `--policy`. Each side's
    part is checked and taken out, so that the rest is compared field by field."""
    cluster_policy = charted.pop(("ClusterMirrorPolicy", "mirrorgate"))
    assert cluster_policy["spec"] == {"exclude": {"namespaces": [mg.NAMESPACE]}}
    config_map = kustomized.pop(("ConfigMap", "mirrorgate-policy"))
    assert config_map["metadata"]["labels"]["mirrorgate.io/policy"] == "true"
    for name in ("clustermirrorpolicies.mirrorgate.io", "mirrorpolicies.mirrorgate.io"):
        kustomized.pop(("CustomResourceDefinition", name))
    spec = kustomized[("Deployment", "mirrorgate")]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    container["args"].remove("--policy=/etc/mirrorgate/policy.yaml")
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "policy"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "policy"]


def test_a_users_policy_is_rendered_whole_with_no_example_key(
    helm: Path, home: Path, tmp_path: Path
) -> None:
    """#32: Helm deep-merges maps, and an example in values.yaml used to survive in a user's
    policy (its `harbor-pull` grant, its `exclude.images`). A user's policy with other
    credentials is rendered exactly as given (plus the release namespace's exclusion),
    and `helm template --include-crds` renders both CRDs as manifests/base has them."""
    example = yaml.safe_load(EXAMPLE_POLICY.read_text())
    mine = {
        "mirrors": [
            {"source": "ghcr.io", "mirror": "mirror.team.example/ghcr", "credential": "ours"}
        ],
        "credentials": {"ours": {"namespaces": ["payments"]}},
    }
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"policy": mine}))
    objects = h.template(helm, home, files=[values])
    (rendered,) = [o["spec"] for o in objects if o["kind"] == "ClusterMirrorPolicy"]
    assert rendered == {**mine, "exclude": {"namespaces": [mg.NAMESPACE]}}
    text = yaml.safe_dump(rendered)
    for key in (*example["policy"]["credentials"], "harbor.corp.example", "registry.k8s.io"):
        assert key not in text, key
    assert "ConfigMap" not in {
        o["kind"] for o in objects if o["metadata"]["name"] == "mirrorgate-policy"
    }
    with_crds = h.run(
        helm, "template", "mirrorgate", str(h.CHART), "--include-crds", home=home
    ).stdout
    crds = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all(with_crds)
        if d and d["kind"] == "CustomResourceDefinition"
    }
    shipped = {
        (d := yaml.safe_load(path.read_text()))["metadata"]["name"]: d
        for path in sorted((REPO_ROOT / "manifests" / "base" / "crds").glob("*.yaml"))
    }
    assert crds == shipped
    assert set(crds) == {"clustermirrorpolicies.mirrorgate.io", "mirrorpolicies.mirrorgate.io"}


@pytest.mark.parametrize(("values", "overlay"), EQUIVALENT)
def test_chart_renders_what_the_overlay_renders(
    helm: Path, kustomize: Path, home: Path, values: dict[str, str], overlay: str
) -> None:
    """Field by field the same objects, apart from Helm's own labels and the
    Namespace (Helm installs into a namespace, it does not own it)."""
    charted = _keyed(h.without_helm_labels(h.template(helm, home, values)))
    kustomized = _keyed([o for o in mg.render(kustomize, overlay) if o["kind"] != "Namespace"])
    _the_policy_apart(charted, kustomized)
    assert sorted(charted) == sorted(kustomized)
    for key, obj in kustomized.items():
        assert charted[key] == obj, key


MONITORING_FILES = ("prometheusrule.yaml", "dashboard.json")


def test_chart_monitoring_renders_what_the_monitoring_overlay_renders(
    helm: Path, kustomize: Path, home: Path
) -> None:
    """monitoring.enabled adds the monitoring overlay's objects, field by field, and changes
    nothing else; off (the default), none of them is rendered."""
    plain = _keyed(h.without_helm_labels(h.template(helm, home)))
    charted = _keyed(h.without_helm_labels(h.template(helm, home, {"monitoring.enabled": "true"})))
    assert {key: charted[key] for key in plain} == plain
    added = {key: obj for key, obj in charted.items() if key not in plain}
    kustomized = _keyed(mg.render(kustomize, "overlays/monitoring"))
    assert (
        sorted(added)
        == sorted(kustomized)
        == [
            ("ConfigMap", "mirrorgate-dashboard"),
            ("PrometheusRule", "mirrorgate"),
            ("ServiceMonitor", "mirrorgate"),
        ]
    )
    for key, obj in kustomized.items():
        assert added[key] == obj, key
    (endpoint,) = added[("ServiceMonitor", "mirrorgate")]["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    alerts = {
        rule["alert"]
        for group in added[("PrometheusRule", "mirrorgate")]["spec"]["groups"]
        for rule in group["rules"]
    }
    assert {"MirrorgateMirrorDown", "MirrorgateCredentialInvalid"} <= alerts


def test_chart_monitoring_follows_the_release_namespace_and_labels(helm: Path, home: Path) -> None:
    """In another namespace the scrape follows it; monitoring.labels reach all three objects."""
    objects = h.template(
        helm,
        home,
        {"monitoring.enabled": "true", "monitoring.labels.release": "prometheus"},
        namespace="observed",
    )
    added = {
        o["kind"]: o
        for o in objects
        if o["metadata"]["name"] in ("mirrorgate", "mirrorgate-dashboard")
        and o["kind"] in ("ServiceMonitor", "PrometheusRule", "ConfigMap")
    }
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
    overlay = REPO_ROOT / "manifests" / "overlays" / "monitoring" / name
    assert (h.CHART / "files" / name).read_bytes() == overlay.read_bytes(), (
        f"cp {overlay.relative_to(REPO_ROOT)} {h.CHART.relative_to(REPO_ROOT)}/files/"
    )


def test_every_chart_object_carries_helms_labels(helm: Path, home: Path) -> None:
    """The labels stripped above are really there (the comparison is not vacuous)."""
    for obj in h.template(
        helm,
        home,
        {**CREDENTIAL_VALUES, "certificates.mode": "cert-manager", "monitoring.enabled": "true"},
    ):
        assert set(obj["metadata"]["labels"]) >= h.HELM_LABELS, obj["metadata"]["name"]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"mode": "enforce", "webhook.failurePolicy": "Fail", "replicas": "1"},
        {"certificates.mode": "cert-manager", **CREDENTIAL_VALUES},
        {"excludedNamespaces[0]": "shop", "image.digest": "sha256:" + "a" * 64},
        {"monitoring.enabled": "true", "monitoring.labels.release": "prometheus"},
        {"hostNetwork": "true", "port": "10443", "metricsPort": "10444"},
        {"spread": "preferred", "imagePullSecrets[0]": "a", "imagePullSecrets[1].name": "b"},
    ],
    ids=[
        "defaults",
        "enforce-fail-one-replica",
        "cert-manager-credentials",
        "excluded-digest",
        "monitoring",
        "host-network",
        "preferred-spread-pull-secrets",
    ],
)
def test_lint_is_clean(helm: Path, home: Path, values: dict[str, str]) -> None:
    _assert_lint_clean(helm, home, *h.set_args(values))


def _assert_lint_clean(helm: Path, home: Path, *args: str) -> None:
    done = h.run(helm, "lint", "--strict", str(h.CHART), *args, home=home)
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout
    assert "[ERROR]" not in done.stdout


# Every value a real cluster may need, set at once (README's chart table).
EVERY_VALUE: dict[str, Any] = {
    "mode": "enforce",
    "nameOverride": "gate",
    "fullnameOverride": "platform-gate",
    "serviceAccount": {
        "create": True,
        "name": "gate-sa",
        "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/gate"},
    },
    "nodeSelector": {"node-role.kubernetes.io/infra": ""},
    "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                        ]
                    }
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "gate"}},
        }
    ],
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/team": "platform"},
    "podLabels": {"example.com/tier": "admission"},
    "logLevel": "debug",
    "extraArgs": ["--reconcile-interval=60"],
    "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.corp.example:3128"}],
    "extraVolumes": [{"name": "azure-json", "secret": {"secretName": "azure-json"}}],
    "extraVolumeMounts": [
        {"name": "azure-json", "mountPath": "/etc/kubernetes/azure", "readOnly": True}
    ],
    "webhook": {"timeoutSeconds": 3, "failurePolicy": "Fail"},
    "image": {"pullPolicy": "Always"},
    "imagePullSecrets": ["regcred", {"name": "mirror-pull"}],
    "hostNetwork": True,
    "dnsPolicy": "ClusterFirst",
    "port": 10443,
    "metricsPort": 10444,
    "spread": "preferred",
    "mirrorCA": {"secret": "mirror-ca", "key": "bundle.pem"},
    "clientCA": {"configMap": "apiserver-webhook-ca", "key": "webhook-ca.pem"},
    "networkPolicy": {"controlPlaneCIDRs": ["10.0.0.0/28", "fd00::/120"]},
    "credentialProviders": {
        "config": {
            "apiVersion": "kubelet.config.k8s.io/v1",
            "kind": "CredentialProviderConfig",
            "providers": [
                {
                    "name": "ecr-credential-provider",
                    "matchImages": ["*.dkr.ecr.*.amazonaws.com"],
                    "defaultCacheDuration": "12h",
                    "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
                    "args": ["get-credentials"],
                }
            ],
        },
        "image": {
            "repository": "registry.example.com/ecr-credential-provider",
            "tag": "v1.34.0",
            "digest": "sha256:" + "b" * 64,
            "pullPolicy": "Always",
        },
        "path": "/bin",
        "command": ["cp", "/bin/ecr-credential-provider", "/credential-providers/"],
    },
}


@pytest.fixture(scope="module")
def every_value(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("values") / "every-value.yaml"
    path.write_text(yaml.safe_dump(EVERY_VALUE))
    return path


def test_every_value_lints_and_reaches_the_objects(
    helm: Path, home: Path, every_value: Path
) -> None:
    """helm lint --strict and helm template with every value set; each lands where it
    should, and the names follow fullnameOverride all the way to the server's options."""
    _assert_lint_clean(helm, home, "-f", str(every_value))
    objects = h.template(helm, home, files=[every_value], namespace="platform")
    keyed = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("ServiceAccount", "gate-sa") in keyed
    assert ("ConfigMap", "platform-gate-credential-providers") in keyed
    confined, reserved = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    assert confined["metadata"]["name"] == "platform-gate-writes"
    assert reserved["metadata"]["name"] == "platform-gate-reserved-prefix"
    # The exact username, namespace and all: no other ServiceAccount of that name.
    user = "'system:serviceaccount:platform:gate-sa'"
    assert confined["spec"]["matchConditions"][0]["expression"] == (
        f"request.userInfo.username == {user}"
    )
    assert reserved["spec"]["variables"][0] == {"name": "writers", "expression": f"[{user}]"}
    # The certificates' names, and the Service the policy webhook calls, follow it too.
    assert "'platform-gate-tls'" in confined["spec"]["validations"][0]["expression"]
    assert "'platform-gate-ca'" in confined["spec"]["validations"][1]["expression"]
    configurations = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert len(configurations) == 2  # the Pod webhooks, and the policy's validators
    for webhooks in configurations:
        assert webhooks["metadata"]["name"] == "platform-gate"
        services = {w["clientConfig"]["service"]["name"] for w in webhooks["webhooks"]}
        assert services == {"platform-gate"}
    assert all(name.startswith(("platform-gate", "gate-sa")) for _, name in keyed), keyed
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["metadata"]["labels"]["app.kubernetes.io/name"] == "gate"
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"]["example.com/tier"] == "admission"
    assert template["metadata"]["annotations"]["example.com/team"] == "platform"
    assert "checksum/credential-providers" in template["metadata"]["annotations"]
    spec = template["spec"]
    for key in (
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "priorityClassName",
    ):
        assert spec[key] == EVERY_VALUE[key], key
    assert spec["serviceAccountName"] == "gate-sa"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-pull"}]
    # dnsPolicy given wins over hostNetwork's ClusterFirstWithHostNet.
    assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirst")
    trust, init, host = spec["initContainers"]
    assert init["image"] == (
        "registry.example.com/ecr-credential-provider:v1.34.0@sha256:" + "b" * 64
    )
    assert init["command"] == EVERY_VALUE["credentialProviders"]["command"]
    assert init["imagePullPolicy"] == "Always"
    (container,) = spec["containers"]
    # For the plugins, mirrorCA's bundle is added to the image's own roots by the
    # image itself, at start; serve reads the mounted bundle (--mirror-ca) and follows it.
    assert trust["name"] == "trust-store"
    assert container["imagePullPolicy"] == "Always"
    assert (trust["image"], trust["imagePullPolicy"]) == (
        container["image"],
        container["imagePullPolicy"],
    )
    assert trust["command"][-1] == "/etc/mirrorgate-ca/bundle.pem"
    assert trust["volumeMounts"] == [
        {"name": "mirror-ca", "mountPath": "/etc/mirrorgate-ca", "readOnly": True},
        {"name": "trust-store", "mountPath": "/etc/mirrorgate-trust"},
    ]
    assert trust["securityContext"] == container["securityContext"]
    args = container["args"]
    env_trust = "/etc/mirrorgate-trust/ca-certificates.crt"
    for arg in (
        "--tls-secret=platform-gate-tls",
        "--webhook-config=platform-gate",
        "--service=platform-gate",
        "--log-level=debug",
        "--reconcile-interval=60",
        "--credential-provider-config=/etc/mirrorgate-credential-providers/config.yaml",
        "--port=10443",
        "--metrics-port=10444",
        "--client-ca=/etc/mirrorgate-client-ca/webhook-ca.pem",
        "--credential-provider-socket=/run/mirrorgate-plugins/plugins.sock",
        "--mirror-ca=/etc/mirrorgate-ca/bundle.pem",
    ):
        assert arg in args, arg
    # The plugins run in the plugin host, which gets mirrorCA's trust, not extraEnv.
    assert host["name"] == "plugin-host"
    assert {e["name"]: e["value"] for e in host["env"]} == {"SSL_CERT_FILE": env_trust}
    assert "--audit-only" not in args
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env == {"HTTPS_PROXY": "http://proxy.corp.example:3128"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["azure-json"] == "/etc/kubernetes/azure"
    assert "azure-json" in volumes
    assert mounts["mirror-ca"] == "/etc/mirrorgate-ca"
    assert "trust-store" not in mounts
    host_mounts = {m["name"]: m["mountPath"] for m in host["volumeMounts"]}
    assert host_mounts["trust-store"] == "/etc/mirrorgate-trust"
    assert volumes["trust-store"] == {"name": "trust-store", "emptyDir": {"sizeLimit": "4Mi"}}
    assert volumes["mirror-ca"]["secret"] == {
        "secretName": "mirror-ca",
        "items": [{"key": "bundle.pem", "path": "bundle.pem"}],
    }
    assert mounts["client-ca"] == "/etc/mirrorgate-client-ca"
    assert volumes["client-ca"]["configMap"] == {
        "name": "apiserver-webhook-ca",
        "items": [{"key": "webhook-ca.pem", "path": "webhook-ca.pem"}],
    }
    # The probes use the metrics port: the kubelet presents no client certificate.
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "https": 10443,
        "metrics": 10444,
    }
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics", probe
    (network,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    admission, monitoring = network["spec"]["ingress"]
    assert admission == {
        "ports": [{"port": "https", "protocol": "TCP"}],
        "from": [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "fd00::/120"}}],
    }
    assert monitoring == {"ports": [{"port": "metrics", "protocol": "TCP"}]}
    assert init["volumeMounts"] == [
        {"name": "credential-provider-bin", "mountPath": "/credential-providers"}
    ]
    (configuration,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    webhooks = {w["name"]: w for w in configuration["webhooks"]}
    enforce, audit = webhooks[mg.ENFORCE_WEBHOOK], webhooks[mg.AUDIT_WEBHOOK]
    assert (enforce["timeoutSeconds"], enforce["failurePolicy"]) == (3, "Fail")
    assert (audit["timeoutSeconds"], audit["failurePolicy"]) == (3, "Ignore")
    assert enforce["clientConfig"]["service"]["name"] == "platform-gate"
    (sa,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert sa["metadata"]["annotations"] == EVERY_VALUE["serviceAccount"]["annotations"]
    subjects = [
        s
        for o in objects
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for s in o["subjects"]
    ]
    assert {(s["name"], s["namespace"]) for s in subjects} == {("gate-sa", "platform")}
    (role,) = [
        o
        for o in objects
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "platform-gate"
    ]
    assert {
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": ["platform-gate"],
        "apiGroups": ["admissionregistration.k8s.io"],
        "verbs": ["get", "list", "watch", "patch"],
    } in role["rules"]


def _pod_spec(helm: Path, home: Path, values: dict[str, str]) -> dict[str, Any]:
    (deployment,) = [o for o in h.template(helm, home, values) if o["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def test_replicas_spread_over_nodes_required_by_default(helm: Path, home: Path) -> None:
    """The default spread is required (DoNotSchedule), honouring taints, counted per
    revision; `preferred` only asks; a user's constraints replace it; no anti-affinity."""
    (required,) = _pod_spec(helm, home, {})["topologySpreadConstraints"]
    assert required == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "nodeTaintsPolicy": "Honor",
        "matchLabelKeys": ["pod-template-hash"],
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "mirrorgate"}},
    }
    assert "affinity" not in _pod_spec(helm, home, {})
    (preferred,) = _pod_spec(helm, home, {"spread": "preferred"})["topologySpreadConstraints"]
    assert preferred == required | {"whenUnsatisfiable": "ScheduleAnyway"}
    own = {
        "topologySpreadConstraints[0].maxSkew": "2",
        "topologySpreadConstraints[0].topologyKey": "topology.kubernetes.io/zone",
        "topologySpreadConstraints[0].whenUnsatisfiable": "DoNotSchedule",
    }
    (replaced,) = _pod_spec(helm, home, own)["topologySpreadConstraints"]
    assert replaced["topologyKey"] == "topology.kubernetes.io/zone"


def test_host_network_resolves_cluster_names_and_moves_the_ports(helm: Path, home: Path) -> None:
    """hostNetwork brings ClusterFirstWithHostNet, and the ports go to serve, the
    container and the probes (by name) together; without it no dnsPolicy is set."""
    assert {"hostNetwork", "dnsPolicy"}.isdisjoint(_pod_spec(helm, home, {}))
    spec = _pod_spec(helm, home, {"hostNetwork": "true", "port": "10250", "metricsPort": "10251"})
    assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    (container,) = spec["containers"]
    assert {"--port=10250", "--metrics-port=10251"} <= set(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": 10250, "metrics": 10251}
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"


def test_an_existing_service_account_is_bound_not_made(helm: Path, home: Path) -> None:
    objects = h.template(
        helm, home, {"serviceAccount.create": "false", "serviceAccount.name": "platform-admission"}
    )
    assert "ServiceAccount" not in {o["kind"] for o in objects}
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "platform-admission"
    refused = h.refused(helm, home, {"serviceAccount.create": "false"})
    assert "serviceAccount.name: the ServiceAccount to run as" in refused


def test_plugins_without_their_config_are_refused(helm: Path, home: Path) -> None:
    refused = h.refused(helm, home, {"credentialProviders.image.repository": "plugins.example/p"})
    assert "credentialProviders.config is empty" in refused


def test_the_policy_excludes_the_release_namespace_by_its_name(helm: Path, home: Path) -> None:
    """Wherever the chart is installed, its own namespace is excluded by name (not the
    literal `mirrorgate`), as the webhook's namespaceSelector excludes it."""
    for namespace in ("platform-admission", mg.NAMESPACE):
        objects = h.template(helm, home, namespace=namespace, files=[EXAMPLE_POLICY])
        (stored,) = [o["spec"] for o in objects if o["kind"] == "ClusterMirrorPolicy"]
        assert stored["exclude"]["namespaces"] == ["kube-system", namespace]
        (configuration,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
        (validators,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
        (validator,) = [w for w in validators["webhooks"] if w["name"] == "policy.mirrorgate.io"]
        for webhook in [*configuration["webhooks"], validator]:
            (by_name,) = [
                e
                for e in webhook["namespaceSelector"]["matchExpressions"]
                if e["key"] == "kubernetes.io/metadata.name"
            ]
            assert namespace in by_name["values"]
    # A policy of one's own without an exclude section gets one.
    objects = h.template(helm, home, {"policy.exclude": "null"}, namespace="elsewhere")
    (stored,) = [o["spec"] for o in objects if o["kind"] == "ClusterMirrorPolicy"]
    assert stored["exclude"] == {"namespaces": ["elsewhere"]}


def _notes(helm: Path, home: Path, mode: str) -> str:
    return h.notes(helm, home, {"mode": mode})


def test_notes_lead_from_audit_to_enforce_without_a_trap(helm: Path, home: Path) -> None:
    """A namespace labelled `audit` stays report-only after mode=enforce: in audit mode the
    NOTES have namespaces labelled `enforce` (reported on only, until the switch); in
    enforce mode they list the `audit`-labelled ones and say how to relabel them."""
    audit = _notes(helm, home, "audit")
    assert "kubectl label namespace NAME mirrorgate.io/mode=enforce\n" in audit
    assert "mirrorgate.io/mode=audit stays report-only" in audit
    assert "--reuse-values --set mode=enforce" in audit
    enforce = _notes(helm, home, "enforce")
    assert "kubectl get namespaces -l mirrorgate.io/mode=audit" in enforce
    assert "kubectl label namespace NAME mirrorgate.io/mode=enforce --overwrite" in enforce


RECIPES = REPO_ROOT / "docs" / "credential-providers.md"


def _recipes() -> list[Any]:
    blocks = re.findall(r"```yaml\n(# values: ([^\n]+)\n.*?)```", RECIPES.read_text(), re.DOTALL)
    return [pytest.param(text, id=name) for text, name in blocks]


@pytest.mark.parametrize("recipe", _recipes())
def test_cloud_recipes_lint_render_and_suit_mirrorgate(
    helm: Path, home: Path, tmp_path: Path, recipe: str
) -> None:
    """docs/credential-providers.md as far as it runs without a cloud: each values file
    lints and renders, its CredentialProviderConfig is one mirrorgate accepts, and its
    policy's credentials are served by the providers it names."""
    values = tmp_path / "values.yaml"
    values.write_text(recipe)
    _assert_lint_clean(helm, home, "-f", str(values))
    objects = {
        (o["kind"], o["metadata"]["name"]): o for o in h.template(helm, home, files=[values])
    }
    config = yaml.safe_load(
        objects[("ConfigMap", "mirrorgate-credential-providers")]["data"]["config.yaml"]
    )
    rules = policy.load(objects[("ClusterMirrorPolicy", "mirrorgate")]["spec"])
    parsed = providerconfig.parse(config, source="credentialProviders.config")
    assert providerconfig.policy_problems(parsed, rules, source="credentialProviders.config") == []
    assert {g.provider for g in rules.grants.values() if g.provider} == set(parsed.providers)
    spec = objects[("Deployment", "mirrorgate")]["spec"]["template"]["spec"]
    init, host = spec["initContainers"]
    assert init["command"] == ["cp", "-R", "/plugins/.", "/credential-providers/"]
    # The clouds' APIs and registries are verified with the image's own roots.
    (serve,) = spec["containers"]
    for container in (serve, host):
        assert "SSL_CERT_FILE" not in {e["name"] for e in container.get("env", [])}
    # The cloud identity is the plugin host's: no API token there, its token nowhere else
    # (or, on GKE, the metadata server's answer to the ServiceAccount's annotation).
    assert spec["automountServiceAccountToken"] is False
    assert "kube-api-access" not in {m["name"] for m in host["volumeMounts"]}
    assert "plugin-token" not in {m["name"] for m in serve["volumeMounts"]}
    own_token = "plugin-token" in {m["name"] for m in host["volumeMounts"]}
    annotations = objects[("ServiceAccount", "mirrorgate")]["metadata"].get("annotations", {})
    assert len(annotations) == (0 if own_token else 1)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"mode": "enforcing"}, "at '/mode'"),
        ({"webhook.failurePolicy": "fail"}, "at '/webhook/failurePolicy'"),
        ({"failurePolicy": "Fail"}, "'failurePolicy'"),  # moved under webhook
        ({"webhook.timeoutSeconds": "60"}, "at '/webhook/timeoutSeconds'"),
        ({"serviceAccount.annotation.a": "b"}, "'annotation'"),
        ({"logLevel": "verbose"}, "at '/logLevel'"),
        ({"extraArgs[0]": "reconcile-interval=60"}, "at '/extraArgs/0'"),
        ({"mirrorCA.configMap": "ca", "mirrorCA.secret": "ca"}, "at '/mirrorCA'"),
        ({"mirrorCA.configmap": "ca"}, "'configmap'"),
        ({"mirrorCA.key": "ca.crt; rm -rf /"}, "at '/mirrorCA/key'"),
        ({"credentialProviders.image.tags": "v1"}, "'tags'"),
        ({"nodeSelector.disk": "1"}, "at '/nodeSelector/disk'"),
        ({"certificates.mode": "vault"}, "at '/certificates/mode'"),
        ({"replicas": "0"}, "at '/replicas'"),
        ({"image.digest": "latest"}, "at '/image/digest'"),
        ({"credentials.harbor-pull.registry": "h.example"}, "at '/credentials/harbor-pull'"),
        ({"excludedNamespaces[0]": "Not_A_Namespace"}, "at '/excludedNamespaces/0'"),
        ({"replica": "2"}, "'replica'"),
        ({"monitoring.enabled": "yes"}, "at '/monitoring/enabled'"),
        ({"monitoring.interval": "30 seconds"}, "at '/monitoring/interval'"),
        ({"spread": "always"}, "at '/spread'"),
        ({"hostNetwork": "yes"}, "at '/hostNetwork'"),
        ({"dnsPolicy": "ClusterFirstWithHostnet"}, "at '/dnsPolicy'"),
        ({"port": "70000"}, "at '/port'"),
        ({"metricsPort": "8443"}, "port and metricsPort: both are 8443"),
        ({"imagePullSecrets[0].nam": "regcred"}, "at '/imagePullSecrets/0'"),
    ],
)
def test_bad_values_are_refused_naming_the_field(
    helm: Path, home: Path, values: dict[str, str], named: str
) -> None:
    refused = h.refused(helm, home, values)
    assert named in refused, refused
    assert "goroutine" not in refused
    assert "panic" not in refused


@pytest.mark.parametrize(
    ("values", "every"),
    [
        ({}, False),
        ({"mode": "enforce", "webhook.failurePolicy": "Fail", **CREDENTIAL_VALUES}, False),
        (
            {
                "mode": "enforce",
                "certificates.mode": "cert-manager",
                "excludedNamespaces[0]": "shop",
            },
            False,
        ),
        ({}, True),
    ],
    ids=["defaults", "enforce-fail-credentials", "cert-manager", "every-value"],
)
def test_render_is_accepted_by_server_side_dry_run(
    helm: Path,
    home: Path,
    own_control_plane: ControlPlane,
    every_value: Path,
    values: dict[str, str],
    every: bool,
) -> None:
    with own_control_plane.api_client() as api:
        cert_manager_crds(api)
        _policy_crds(api)  # as `helm install` does first, from crds/
        try:
            namespace = create_namespace(api, namespace_name("helm-dry-run"))
            objects = h.template(
                helm, home, values, namespace=namespace, files=[every_value] if every else []
            )
            kube.apply(api, objects, dry_run=True)
        finally:
            _policy_crds(api, remove=True)  # the install test's helm makes its own


def _policy_crds(api: k8s.ApiClient, *, remove: bool = False) -> None:
    """The chart's crds/ created (not a dry run: a kind is served only once established),
    or with ``remove`` deleted, returning once they are gone."""
    extensions = k8s.ApiextensionsV1Api(api)
    for path in sorted((h.CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if remove:
            name = crd["metadata"]["name"]
            extensions.delete_custom_resource_definition(name)

            def gone(name: str = name) -> str | None:
                try:
                    extensions.read_custom_resource_definition(name)
                except k8s.ApiException as error:
                    if error.status == 404:
                        return None
                    raise
                return "still there"

            wait_until(gone, timeout=30, what=f"{name} deleted")
            continue
        try:
            extensions.create_custom_resource_definition(crd)
        except k8s.ApiException as error:
            if error.status != 409:
                raise

        def established(name: str = crd["metadata"]["name"]) -> str | None:
            found = extensions.read_custom_resource_definition(name)
            conditions = {
                c.type: c.status for c in (found.status and found.status.conditions) or ()
            }
            return None if conditions.get("Established") == "True" else f"{conditions}"

        wait_until(established, timeout=30, what=f"{crd['metadata']['name']} established")


def _get(
    api: k8s.ApiClient, api_version: str, kind: str, name: str, namespace: str | None = mg.NAMESPACE
) -> dict[str, Any]:
    """One object as the API server stores it, as plain data."""
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    resource = client.resources.get(api_version=api_version, kind=kind)
    found: dict[str, Any] = resource.get(name=name, namespace=namespace).to_dict()
    return found


def _accepted(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions", [])
    return any(c["type"] == "Accepted" and c["status"] == "True" for c in conditions)


def _everything(api: k8s.ApiClient) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of every object of every listable resource."""
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    found = set()
    for resource in client.resources.search():
        if isinstance(resource, ResourceList) or "list" not in (resource.verbs or ()):
            continue  # the List kinds, and subresources (no list verb)
        if resource.kind in ("Event", "ComponentStatus"):
            continue  # events come and go; componentstatuses are not objects
        try:
            items = resource.get().items
        except dynamic.exceptions.NotFoundError:
            continue  # a kind whose CRD was just deleted, still in discovery for a moment
        for item in items:
            found.add((resource.kind, item.metadata.namespace or "", item.metadata.name))
    return found


def test_install_upgrade_uninstall_leaves_only_what_is_meant_to_stay(
    helm: Path, home: Path, own_control_plane: ControlPlane, tmp_path: Path
) -> None:
    """helm install (audit) → helm upgrade to enforce with a credential → mirrorgate
    runs with the chart's RBAC and makes its Secrets → helm uninstall. Every object
    Helm made is gone. What stays: the namespace (made by --create-namespace, not
    Helm's) and what mirrorgate made at run time (its CA Secret, Lease,
    fingerprint key, the pull secret running Pods may still need and its record);
    docs/operations.md's clean-up command removes all but the CA and the Lease, which go
    with the namespace."""
    kubeconfig = own_control_plane.kubeconfig
    with own_control_plane.api_client() as api:
        # The example policy grants its credential to `shop` and `team-a`, by exact names.
        shop = create_namespace(api, "shop", ENFORCE_LABELS)
        before = _everything(api)

        h.run(
            helm,
            "install",
            "mirrorgate",
            str(h.CHART),
            "--namespace",
            mg.NAMESPACE,
            "--create-namespace",
            "-f",
            str(EXAMPLE_POLICY),
            home=home,
            kubeconfig=kubeconfig,
        )
        deployment = _get(api, "apps/v1", "Deployment", "mirrorgate")
        assert "--audit-only" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert deployment["spec"]["replicas"] == 2

        h.run(
            helm,
            "upgrade",
            "mirrorgate",
            str(h.CHART),
            "--namespace",
            mg.NAMESPACE,
            "-f",
            str(EXAMPLE_POLICY),
            "--set",
            "mode=enforce",
            *h.set_args(CREDENTIAL_VALUES),
            home=home,
            kubeconfig=kubeconfig,
        )
        deployment = _get(api, "apps/v1", "Deployment", "mirrorgate")
        assert "--audit-only" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        central = _get(api, "v1", "Secret", "harbor-pull")
        assert central["type"] == "kubernetes.io/dockerconfigjson"
        auths = json.loads(base64.b64decode(central["data"][".dockerconfigjson"]))["auths"]
        assert auths["harbor.corp.example"]["username"] == "robot$pull"
        history = h.run(
            helm,
            "history",
            "mirrorgate",
            "--namespace",
            mg.NAMESPACE,
            "-o",
            "json",
            home=home,
            kubeconfig=kubeconfig,
        ).stdout
        assert [r["status"] for r in json.loads(history)] == ["superseded", "deployed"]

        # mirrorgate as the chart's ServiceAccount, with the policy the chart
        # made (the ClusterMirrorPolicy, no file): its own certificates (Secret
        # mirrorgate-tls, caBundle), the Lease, and a pull secret made for a Pod
        # in the opted-in namespace.
        server = mg.start_mirrorgate(
            tmp_path / "mirrorgate",
            own_control_plane,
            policy=None,
            tls_secret="mirrorgate-tls",
            args=[
                "--store",
                "kubernetes",
                "--webhook-config",
                "mirrorgate",
                "--service",
                "mirrorgate",
                "--tls-name",
                "127.0.0.1",
            ],
        )
        try:
            ca_pem = base64.b64decode(
                _get(api, "v1", "Secret", "mirrorgate-tls")["data"][certs.CA_CERT]
            )
            with httpx.Client(
                base_url=server.url,
                timeout=10,
                verify=ssl.create_default_context(cadata=ca_pem.decode()),
            ) as https:
                answer = https.post("/mutate", json=review(pod("nginx:1.27"), namespace=shop))
            assert answer.status_code == 200
            assert {
                "op": "replace",
                "path": "/spec/containers/0/image",
                "value": "harbor.corp.example/dockerhub-proxy/library/nginx:1.27",
            } in patch_ops(response_of(answer.json()))
            generated = _get(api, "v1", "Secret", "mirrorgate-harbor-pull", shop)
            assert generated["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mirrorgate"
            for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                webhooks = _get(api, "admissionregistration.k8s.io/v1", kind, "mirrorgate", None)
                assert all(w["clientConfig"]["caBundle"] for w in webhooks["webhooks"]), kind
            # The leader (the one replica) says the chart's policy is in force.
            wait_until(
                lambda: (
                    None
                    if _accepted(
                        _get(api, policy.API_VERSION, "ClusterMirrorPolicy", "mirrorgate", None)
                    )
                    else "no Accepted status yet"
                ),
                timeout=15,
                what="the chart's ClusterMirrorPolicy Accepted",
            )
        finally:
            server.stop()

        h.run(
            helm,
            "uninstall",
            "mirrorgate",
            "--namespace",
            mg.NAMESPACE,
            home=home,
            kubeconfig=kubeconfig,
        )
        made_at_run_time = {
            ("Secret", mg.NAMESPACE, "mirrorgate-tls"),  # its serving certificate
            ("Secret", mg.NAMESPACE, "mirrorgate-ca"),  # its CA: a reinstall keeps caBundle
            ("ConfigMap", mg.NAMESPACE, "mirrorgate-ca"),  # the CA certificate, for Prometheus
            ("Lease", mg.NAMESPACE, "mirrorgate-reconciler"),
            ("Secret", mg.NAMESPACE, "mirrorgate-fingerprint-key"),
            ("ConfigMap", mg.NAMESPACE, f"copy.{shop}.mirrorgate-harbor-pull"),  # its record
            ("Secret", shop, "mirrorgate-harbor-pull"),  # running Pods may still need it
        }
        # The CRDs stay (Helm never deletes crds/: deleting one deletes its objects).
        crds = {
            *(
                ("CustomResourceDefinition", "", f"{plural}.mirrorgate.io")
                for plural in ("clustermirrorpolicies", "mirrorpolicies")
            ),
            # The API server's own entry for the group the CRDs serve.
            ("APIService", "", f"{policy.API_VERSION.split('/')[1]}.mirrorgate.io"),
        } - before
        made_at_run_time |= crds
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
            *crds,
            ("Namespace", "", mg.NAMESPACE),
            ("Secret", mg.NAMESPACE, "mirrorgate-tls"),
            ("Secret", mg.NAMESPACE, "mirrorgate-ca"),
            ("Lease", mg.NAMESPACE, "mirrorgate-reconciler"),
        }
