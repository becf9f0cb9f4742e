"""mirrorgate installed on the node cluster as users install it: its image, `helm install`.

The `node_installed` fixture (conftest.py) is a `Release` of this module: the
image `make image` builds, pushed to the node's upstream, installed with
`helm install` of `manifests/helm/mirrorgate` in enforce mode, two replicas,
self-managed certificates, leader election and the reconciliation of pull
secrets in the cluster, and health probes on against the node's own mirror,
which presents a certificate of a private CA given through `mirrorCA`. No
host-process mirrorgate is registered with the node cluster.

How the API server reaches the webhook Service: the node's kube-apiserver runs
with `--enable-aggregator-routing=true`, so it resolves the Service to the
Ready addresses of its EndpointSlices and dials a Pod directly, as it does for
aggregated APIs. kube-proxy would need iptables NAT rules on this shared
machine for nothing the API server needs; the endpoint routing exercises the
same Service, EndpointSlice and readiness path (a Pod leaves the rotation when
it stops being Ready), which is what availability depends on.

How the Pods reach the API server: this machine's API servers listen on
loopback only and there is no kube-proxy, so the `kubernetes` Service has no
usable endpoint. A test-only route (the one thing not in docs/install.md)
points the in-cluster client at the CNI bridge's gateway, where the test
relays bytes to the API server (TLS end to end, under a name the serving
certificate carries, through hostAliases). The node's registries listen on
that gateway already (node.py), so nothing else needs a route.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.e2e.harness import helm as h
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness import nodepods, plugins
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.fixtures_secrets import log_entries, metric
from tests.e2e.harness.kube import create_namespace
from tests.e2e.harness.node import GATEWAY, Node
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.provider_setup import TEAMS, TTL, source
from tests.e2e.harness.providers import RobotIssuer, start_issuer
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.relay import relay
from tests.e2e.harness.suite import GRANTED_PREFIX, central_credential, node_policy
from tests.e2e.harness.testimages import push_upstream
from tests.image.podman import build, push

REPOSITORY = "mirrorgate/mirrorgate"
TAG = "in-cluster"
# A name the API server's serving certificate carries (tests/e2e/harness/controlplane.py).
API_NAME = "kubernetes.default.svc"
ROLLOUT_TIMEOUT = 180.0
# The kubelet's sync (5 s, node.py), the atomic swap of the volume, the replicas' reload.
POLICY_RELOAD_TIMEOUT = 60.0
MIRROR_CA = "mirror-ca"
CLIENT_CA = "apiserver-webhook-ca"
"""The ConfigMap holding the CA of the API server's webhook client certificate (clientCA)."""
METRICS_PORT = 9443
"""The replicas' metrics port: /metrics and the detailed /readyz."""
"""The ConfigMap holding the node registries' private CA, given to the chart as mirrorCA."""
MIRROR_CA_FILE = "/etc/mirrorgate-ca/ca.crt"
"""Where the chart mounts it (the plugins' CA_FILE)."""
PROVIDERS_REPOSITORY = "mirrorgate-e2e/credential-providers"
# Probes every 2 s, so the health scenarios see a stopped mirror within seconds, with
# the chart's own 2 s timeout: shorter ones flap on this shared machine while it pushes
# images (400 ms did), and a flap sends Pods to the upstream.
HEALTH = {"interval": "2s", "timeout": "2s", "failureThreshold": 2, "successThreshold": 1}


def installed_policy(registry: RegistryStack) -> dict[str, Any]:
    """The node policy (`node_policy`), with fast probes and onMirrorDown spelled out,
    then a project of each robot (TEAMS: `team-x.e2e.example` to `<upstream>/team-x`)
    whose login the test plugin mints, for the granted namespaces."""
    found: dict[str, Any] = yaml.safe_load(node_policy(registry))
    found["health"] = HEALTH
    for rule in found["mirrors"]:
        rule["onMirrorDown"] = "fallback"
    up = registry.upstream_host
    found["mirrors"] += [
        {"source": source(t), "mirror": f"{up}/{t}", "credential": t} for t in TEAMS
    ]
    found["credentials"].update(
        {
            t: {
                "namespaces": [f"{GRANTED_PREFIX}*"],
                "registry": f"{up}/{t}",
                "provider": f"{t}-provider",
            }
            for t in TEAMS
        }
    )
    return found


@dataclass
class Robots:
    """The token server's project robots whose logins the test plugin mints in the replicas."""

    issuer: RobotIssuer
    names: dict[str, str]
    """The robot of each project (its username at the registry)."""


def _robots(registry: RegistryStack, workdir: Path) -> Robots:
    assert registry.token_server is not None
    issuer = start_issuer(workdir, server=registry.token_server, ca_path=registry.ca_path)
    names = {t: f"robot-{t}-{secrets.token_hex(2)}" for t in TEAMS}
    for team in TEAMS:
        issuer.add_robot(names[team], team)
    return Robots(issuer=issuer, names=names)


def _credential_providers(registry: RegistryStack, robots: Robots) -> dict[str, Any]:
    """The chart's credentialProviders: the kubelet's CredentialProviderConfig naming a
    plugin per project, and the image (by digest) the initContainer copies them from. The
    plugins run in the plugin host, reach the token server on the node's bridge and trust
    it through mirrorCA's bundle."""
    image = plugins.image([f"{t}-provider" for t in TEAMS])
    reference = push_upstream(registry, PROVIDERS_REPOSITORY, "1", image)
    providers = []
    for team in TEAMS:
        provider = robots.issuer.provider(
            f"{team}-provider",
            robots.names[team],
            match_images=[registry.upstream_host],
            default_cache_duration="1h",  # the response's cacheDuration wins
            # --report: each run says, in the log, what of mirrorgate's identity it sees.
            args=["--ttl", str(TTL), "--cache-duration", f"{TTL}s", "--report"],
        )
        provider["env"] = [
            {**e, "value": MIRROR_CA_FILE} if e["name"] == "CA_FILE" else e for e in provider["env"]
        ]
        providers.append(provider)
    repository, _, tag = reference.rpartition(":")
    return {
        "config": {
            "apiVersion": "kubelet.config.k8s.io/v1",
            "kind": "CredentialProviderConfig",
            "providers": providers,
        },
        "image": {"repository": repository, "tag": tag, "digest": image.digest},
        "path": f"/{plugins.IMAGE_PATH}",
        "command": plugins.INSTALL_COMMAND,
    }


def helm_values(node: Node, relay_port: int, robots: Robots) -> dict[str, Any]:
    """The chart's values for this cluster: what a user sets, plus the API route."""
    return {
        "mode": "enforce",
        "image": {"repository": f"{node.registry.upstream_host}/{REPOSITORY}", "tag": TAG},
        "imagePullSecrets": [nodepods.UPSTREAM_SECRET],
        "policy": installed_policy(node.registry),
        "mirrorCA": {"configMap": MIRROR_CA, "key": "ca.crt"},
        # Only the API server's certificate opens the admission port (its
        # AdmissionConfiguration presents one, tests/e2e/harness/controlplane.py).
        "clientCA": {"configMap": CLIENT_CA, "key": "ca.crt"},
        "credentialProviders": _credential_providers(node.registry, robots),
        "logLevel": "info",
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": API_NAME},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(relay_port)},
        ],
    }


@dataclass
class Release:
    """mirrorgate installed by Helm on the node cluster (what `node_installed` yields)."""

    node: Node
    helm: Path
    home: Path
    values: Path
    image: str
    """The local image the release runs (built by image/build.sh)."""
    relay_port: int
    robots: Robots

    @property
    def registry(self) -> RegistryStack:
        return self.node.registry

    @property
    def control_plane(self) -> ControlPlane:
        return self.node.control_plane

    def run_helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return h.run(
            self.helm,
            *args,
            "--namespace",
            mg.NAMESPACE,
            home=self.home,
            kubeconfig=self.node.control_plane.kubeconfig,
            check=check,
        )

    def install(self) -> None:
        """`helm install` (taking over objects an earlier install left under the same
        names), the test route, then wait until both replicas serve."""
        self.run_helm(
            "install",
            "mirrorgate",
            str(h.CHART),
            "--take-ownership",
            "--force-conflicts",
            "-f",
            str(self.values),
        )
        with self.node.control_plane.api_client() as api:
            _route_to_api(api)
            wait_rolled_out(api)
        # Probed up by both, not merely unprobed: a first probe that fails marks the
        # mirror down at once, and the scenarios' Pods would be left as written.
        self.wait_gauge("mirrorgate_mirror_up", 1.0, timeout=60, mirror=self.registry.host)

    def upgrade(self, *args: str) -> None:
        # Tests that run a second mirrorgate beside the chart's add its username to the
        # chart's reserved-prefix writers (mg.allow_reserved_names), as that
        # installation's operator would; the chart's own upgrade takes the field back.
        self.run_helm(
            "upgrade", "mirrorgate", str(h.CHART), "--reuse-values", "--force-conflicts", *args
        )

    def revision(self) -> int:
        """The release's current revision (`helm status`)."""
        status = json.loads(self.run_helm("status", "mirrorgate", "-o", "json").stdout)
        return int(status["version"])

    def roll_back(self, revision: int) -> None:
        """`helm rollback` to ``revision`` (its values, its policy); returns once both
        replicas serve, the ClusterMirrorPolicy is Accepted for its generation and the
        node's mirror is probed up again."""
        self.run_helm("rollback", "mirrorgate", str(revision), "--force-conflicts")
        with self.node.control_plane.api_client() as api:
            wait_rolled_out(api)
        self._wait_accepted(self._cluster_policy()["metadata"]["generation"])
        self.wait_gauge("mirrorgate_mirror_up", 1.0, timeout=60, mirror=self.registry.host)

    def uninstall(self) -> None:
        self.run_helm("uninstall", "mirrorgate", "--wait", check=False)

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Uninstalled meanwhile (for another way of installing), installed again after."""
        self.uninstall()
        try:
            yield
        finally:
            self.install()

    def metrics(self) -> list[str]:
        """Each serving replica's /metrics, read through the API server's Pod proxy."""
        with self.node.control_plane.api_client() as api:
            core = k8s.CoreV1Api(api)
            return [
                str(
                    core.connect_get_namespaced_pod_proxy_with_path(
                        f"https:{p.metadata.name}:{METRICS_PORT}", mg.NAMESPACE, "metrics"
                    )
                )
                for p in replicas(api)
                if p.metadata is not None
            ]

    def gauges(self, name: str, **labels: str) -> list[float]:
        """``name``'s value on each replica (each probes on its own)."""
        return [metric(text, name, **labels) for text in self.metrics()]

    def wait_gauge(self, name: str, value: float, *, timeout: float, **labels: str) -> None:
        """Until every replica reports ``value``."""

        def check() -> str | None:
            found = self.gauges(name, **labels)
            return None if found and all(v == value for v in found) else f"{name} = {found}"

        wait_until(
            check, timeout=timeout, what=f"{name}{labels} {value} on every replica", interval=0.2
        )

    def set_policy(self, policy: dict[str, Any]) -> None:
        """`helm upgrade` with ``policy`` as the chart's `policy` value (its
        ClusterMirrorPolicy); returns once the leader says it is Accepted for its new
        generation and every replica serves one same composition, a new one if the policy
        changed (they watch the object; nothing restarts).

        The whole policy: `--set policy.mirrors[0].x=y` would replace the list with a
        sparse one (the policy admission webhook refuses that, rightly)."""
        before = self._policy_versions()
        generation = self._cluster_policy()["metadata"]["generation"]
        self.upgrade("--set-json", f"policy={json.dumps(policy)}")

        def served() -> str | None:
            stored = self._cluster_policy()
            status = stored.get("status") or {}
            conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
            if status.get("observedGeneration") != stored["metadata"]["generation"]:
                return f"status of generation {status.get('observedGeneration')} only"
            if conditions.get("Accepted") != "True":
                return f"ClusterMirrorPolicy not accepted: {status}"
            found = self._policy_versions()
            changed = stored["metadata"]["generation"] != generation
            if len(set(found)) != 1 or (changed and set(found) <= set(before)):
                return f"replicas serve policy versions {found} (before: {before})"
            return None

        wait_until(
            served,
            timeout=POLICY_RELOAD_TIMEOUT,
            what="the chart's policy served by every replica",
            interval=0.5,
        )

    @contextlib.contextmanager
    def policy_spec_replaced(self, spec: dict[str, Any]) -> Iterator[None]:
        """The chart's ClusterMirrorPolicy holds ``spec`` meanwhile, written through the API
        (not Helm, whose merge of reused values keeps keys set to null), and its own spec
        again after; each time until the leader says the new generation is Accepted."""
        stored = self._cluster_policy()
        self._write_spec(stored, spec)
        try:
            yield
        finally:
            self._write_spec(self._cluster_policy(), stored["spec"])

    def _write_spec(self, stored: dict[str, Any], spec: dict[str, Any]) -> None:
        with self.node.control_plane.api_client() as api:
            written: Any = k8s.CustomObjectsApi(api).replace_cluster_custom_object(
                "mirrorgate.io",
                "v1alpha1",
                "clustermirrorpolicies",
                "mirrorgate",
                {**stored, "spec": spec},
            )
        self._wait_accepted(written["metadata"]["generation"])

    def _wait_accepted(self, generation: int) -> None:
        def accepted() -> str | None:
            status = self._cluster_policy().get("status") or {}
            conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
            if (
                status.get("observedGeneration") != generation
                or conditions.get("Accepted") != "True"
            ):
                return f"status {status} (generation {generation})"
            return None

        wait_until(
            accepted, timeout=POLICY_RELOAD_TIMEOUT, what="the policy accepted", interval=0.5
        )

    def _cluster_policy(self) -> dict[str, Any]:
        with self.node.control_plane.api_client() as api:
            found: Any = k8s.CustomObjectsApi(api).get_cluster_custom_object(
                "mirrorgate.io", "v1alpha1", "clustermirrorpolicies", "mirrorgate"
            )
        return dict(found)

    def _policy_versions(self) -> list[str]:
        return [
            version
            for m in self.metrics()
            for version in re.findall(r'mirrorgate_policy_info\{[^}]*version="([0-9a-f]+)"', m)
        ]

    def log_entries(self) -> list[dict[str, Any]]:
        with self.node.control_plane.api_client() as api:
            core = k8s.CoreV1Api(api)
            return [
                e
                for p in replicas(api)
                if p.metadata
                for e in log_entries(
                    core.read_namespaced_pod_log(str(p.metadata.name), mg.NAMESPACE)
                )
            ]

    def describe(self, lines: int = 40) -> str:
        """The replicas' last log lines (for a failed test's report)."""
        with self.node.control_plane.api_client() as api:
            return _replica_logs(api, lines)


def replicas(api: k8s.ApiClient, *, terminating: bool = False) -> list[k8s.V1Pod]:
    """mirrorgate's Pods; those being deleted only with ``terminating``."""
    pods = (
        k8s.CoreV1Api(api)
        .list_namespaced_pod(mg.NAMESPACE, label_selector="app.kubernetes.io/name=mirrorgate")
        .items
    )
    return [
        p
        for p in pods
        if terminating or p.metadata is None or p.metadata.deletion_timestamp is None
    ]


def rolled_out(api: k8s.ApiClient) -> str | None:
    """None once the Deployment's current generation runs on both replicas, and nothing
    else does, each Ready behind the Service, and caBundle is set."""
    deployment = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        k8s.AppsV1Api(api).read_namespaced_deployment("mirrorgate", mg.NAMESPACE)
    )
    status = deployment.get("status", {})
    if (
        status.get("observedGeneration") != deployment["metadata"]["generation"]
        or status.get("updatedReplicas") != 2
        or status.get("availableReplicas") != 2
        or status.get("replicas") != 2
    ):
        return f"Deployment status {status}"
    slices = (
        k8s.DiscoveryV1Api(api)
        .list_namespaced_endpoint_slice(
            mg.NAMESPACE, label_selector="kubernetes.io/service-name=mirrorgate"
        )
        .items
    )
    ready = [e for s in slices for e in (s.endpoints or []) if e.conditions and e.conditions.ready]
    if len(ready) != 2:
        return f"{len(ready)} ready endpoints"
    webhooks = (
        k8s.AdmissionregistrationV1Api(api)
        .read_mutating_webhook_configuration("mirrorgate")
        .webhooks
        or []
    )
    if not all(w.client_config.ca_bundle for w in webhooks):
        return "caBundle not yet set by mirrorgate"
    return None


def _replica_logs(api: k8s.ApiClient, lines: int) -> str:
    core = k8s.CoreV1Api(api)
    tails = []
    for replica in replicas(api):
        assert replica.metadata is not None
        restarted = (
            any(c.restart_count for c in (replica.status.container_statuses or []))
            if replica.status
            else False
        )
        try:
            tails.append(
                f"{replica.metadata.name}:\n"
                # None while the container has not started (its status says why).
                + (
                    core.read_namespaced_pod_log(
                        str(replica.metadata.name),
                        mg.NAMESPACE,
                        previous=restarted,
                        tail_lines=lines,
                    )
                    or f"(no log yet; status {replica.status})"
                )
            )
        except k8s.ApiException as failed:
            tails.append(f"{replica.metadata.name}: (no log: {failed.status} {failed.reason})")
    return "\n---\n".join(tails)


def wait_rolled_out(api: k8s.ApiClient) -> None:
    """Until both replicas serve; on a timeout, the replicas' last log lines say why."""
    try:
        wait_until(
            lambda: rolled_out(api),
            timeout=ROLLOUT_TIMEOUT,
            what="mirrorgate rolled out in the cluster",
            interval=0.5,
        )
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{_replica_logs(api, 20)}") from None


def _route_to_api(api: k8s.ApiClient) -> None:
    """hostAliases is no chart value: a test-only patch (module docstring)."""
    k8s.AppsV1Api(api).patch_namespaced_deployment(
        "mirrorgate",
        mg.NAMESPACE,
        {
            "spec": {
                "template": {"spec": {"hostAliases": [{"ip": GATEWAY, "hostnames": [API_NAME]}]}}
            }
        },
    )


def push_image(
    registry: RegistryStack,
    tag: str,
    *,
    version: str | None = None,
    root: Path = REPO_ROOT,
    timeout: float = 1200,
) -> str:
    """Build mirrorgate's image (image/build.sh of the tree at ``root``: this one, or an
    earlier release's) and push it to the node's upstream as ``tag``; returns the local
    image name."""
    env = {"TAG": f"localhost/mirrorgate:{tag}"}
    if version is not None:
        env["VERSION"] = version
    image = build("build.sh", env=env, root=root, timeout=timeout)
    push(
        image,
        f"{registry.upstream_host}/{REPOSITORY}:{tag}",
        ca_path=registry.ca_path,
        username=registry.upstream_username,
        password=registry.upstream_password,
    )
    return image


def _prepare_namespace(api: k8s.ApiClient, registry: RegistryStack, client_ca: Path) -> None:
    """What a user makes before `helm install`: the namespace, the central credential,
    the pull secret for mirrorgate's own image, the mirrors' CA bundle and the CA of
    the API server's webhook client certificate."""
    create_namespace(api, mg.NAMESPACE)
    central_credential(api, registry)
    nodepods.upstream_pull_secret(api, mg.NAMESPACE, registry)
    core = k8s.CoreV1Api(api)
    for name, path in ((MIRROR_CA, registry.ca_path), (CLIENT_CA, client_ca)):
        data = {"ca.crt": path.read_text()}
        core.create_namespaced_config_map(
            mg.NAMESPACE, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data=data)
        )


@contextlib.contextmanager
def installed_release(node: Node, helm: Path, workdir: Path) -> Iterator[Release]:
    """mirrorgate from its image through `helm install`, uninstalled afterwards."""
    registry = node.registry
    image = push_image(registry, TAG)
    plane = node.control_plane
    api_port = int(plane.url.rsplit(":", 1)[1])
    robots = _robots(registry, workdir / "robots")
    with relay(GATEWAY, ("127.0.0.1", api_port)) as relayed:
        values = workdir / "values.yaml"
        values.write_text(json.dumps(helm_values(node, relayed.port, robots), indent=2))
        release = Release(
            node=node,
            helm=helm,
            home=workdir / "home",
            values=values,
            image=image,
            relay_port=relayed.port,
            robots=robots,
        )
        with plane.api_client() as api:
            _prepare_namespace(api, registry, plane.webhook_client_ca)
        try:
            release.install()
            yield release
        finally:
            release.uninstall()
