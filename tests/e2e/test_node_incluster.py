"""mirrorgate in the cluster from its own image, on the real node (issue #12, item 2).

The image `make image` builds is pushed to the loopback upstream and installed
the way docs/install.md tells users: a kustomization of one's own on
`manifests/overlays/enforce`, the image set through `images:`, the policy
replaced with `configMapGenerator` (as `examples/custom-policy`), and the
pull secret for mirrorgate's own image on its ServiceAccount. Two replicas
with their PodDisruptionBudget, self-managed certificates, the central
credential an ordinary `kubernetes.io/dockerconfigjson` Secret.

How the API server reaches the webhook Service: the node's kube-apiserver runs
with `--enable-aggregator-routing=true`, so it resolves the Service to the
Ready addresses of its EndpointSlices and dials a Pod directly, as it does
for aggregated APIs. kube-proxy would need iptables NAT rules on this shared
machine for nothing the API server needs; the endpoint routing exercises the
same Service, EndpointSlice and readiness path (a Pod leaves the rotation when
it stops being Ready), which is what availability depends on.

How the Pods reach the API server: this machine's API servers listen on
loopback only and there is no kube-proxy, so the `kubernetes` Service has no
usable endpoint. A test-only patch (the one thing not in docs/install.md) points
the in-cluster client at the CNI bridge's gateway, where the test relays
bytes to the API server (TLS end to end, under a name the serving
certificate carries, through hostAliases).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import dynamic

from mirrorgate import policy
from tests.e2e import mirrorgate as mg
from tests.e2e import nodepods
from tests.e2e.conftest import (
    CREDENTIAL,
    GRANTED_PREFIX,
    Installed,
    central_credential,
    node_policy,
)
from tests.e2e.fixtures_secrets import log_entries
from tests.e2e.kube import create_namespace, namespace_name
from tests.e2e.node import POD_SUBNET, Node
from tests.e2e.procs import wait_until
from tests.e2e.relay import relay
from tests.image.podman import build, push

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.image]

REPOSITORY = "mirrorgate/mirrorgate"
TAG = "in-cluster"
# The CNI bridge's own address (isGateway): the subnet's first, in the host's namespace.
GATEWAY = POD_SUBNET.rsplit(".", 1)[0] + ".1"
# A name the API server's serving certificate carries (tests/e2e/controlplane.py).
API_NAME = "kubernetes.default.svc"
ROLLOUT_TIMEOUT = 180.0


@dataclass
class InCluster:
    node: Node
    objects: list[dict[str, Any]]
    image: str


def _kustomization(workdir: Path, node: Node, relay_port: int) -> Path:
    """The user's kustomization (docs/install.md), plus the API route this machine needs."""
    (workdir / "mirrorgate").symlink_to(mg.REPO)
    mine = workdir / "mine"
    mine.mkdir()
    (mine / "policy.yaml").write_text(node_policy(node.registry))
    api_route = [
        {"op": "add", "path": "/spec/template/spec/hostAliases",
         "value": [{"ip": GATEWAY, "hostnames": [API_NAME]}]},
        {"op": "add", "path": "/spec/template/spec/containers/0/env",
         "value": [{"name": "KUBERNETES_SERVICE_HOST", "value": API_NAME},
                   {"name": "KUBERNETES_SERVICE_PORT", "value": str(relay_port)}]},
        # The mirror listens on the host's loopback, where the kubelet pulls from
        # but a Pod cannot reach: probed from the Pod it would be down, and every
        # image would fall back to the upstream.
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
         "value": "--no-health-probes"},
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../mirrorgate/manifests/overlays/enforce"],
        "images": [{"name": "ghcr.io/mirrorgate/mirrorgate",
                    "newName": f"{node.registry.upstream_host}/{REPOSITORY}", "newTag": TAG}],
        "configMapGenerator": [{"name": "mirrorgate-policy", "namespace": mg.NAMESPACE,
                                "behavior": "replace", "files": ["policy.yaml"],
                                "options": {"disableNameSuffixHash": True}}],
        "patches": [
            {"target": {"kind": "ServiceAccount", "name": "mirrorgate"},
             "patch": yaml.safe_dump([{"op": "add", "path": "/imagePullSecrets",
                                       "value": [{"name": nodepods.UPSTREAM_SECRET}]}])},
            {"target": {"kind": "Deployment", "name": "mirrorgate"},
             "patch": yaml.safe_dump(api_route)},
        ],
    }
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return mine


def _bridge_up(api: k8s.ApiClient, node: Node) -> None:
    """The CNI makes the bridge with the first Pod; make sure one has run."""
    with socket.socket() as probe:
        try:
            probe.bind((GATEWAY, 0))
            return
        except OSError:
            pass
    workload = nodepods.push_workload(node.registry, "node/bridge")
    namespace = create_namespace(api, namespace_name("bridge"))
    secret = nodepods.upstream_pull_secret(api, namespace, node.registry)
    k8s.CoreV1Api(api).create_namespaced_pod(namespace, nodepods.pod(
        "bridge", [nodepods.container("hello", workload.image)], pull_secrets=[secret]))
    nodepods.wait_running(api, namespace, "bridge")


def _apply(api: k8s.ApiClient, objects: list[dict[str, Any]]) -> None:
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    for obj in objects:
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        client.server_side_apply(  # type: ignore[no-untyped-call]
            resource, body=obj, namespace=obj["metadata"].get("namespace"),
            field_manager="mirrorgate-incluster", force_conflicts=True)


def _rolled_out(api: k8s.ApiClient) -> str | None:
    deployment = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        k8s.AppsV1Api(api).read_namespaced_deployment("mirrorgate", mg.NAMESPACE))
    status = deployment.get("status", {})
    if status.get("availableReplicas") != 2 or status.get("updatedReplicas") != 2:
        return f"Deployment status {status}"
    slices = k8s.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        mg.NAMESPACE, label_selector="kubernetes.io/service-name=mirrorgate").items
    ready = [e for s in slices for e in (s.endpoints or []) if e.conditions and e.conditions.ready]
    if len(ready) != 2:
        return f"{len(ready)} ready endpoints"
    webhooks = k8s.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
        "mirrorgate").webhooks or []
    if not all(w.client_config.ca_bundle for w in webhooks):
        return "caBundle not yet set by mirrorgate"
    return None


@pytest.fixture(scope="module")
def in_cluster(node_cluster: Node, node_installed: Installed, kustomize: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[InCluster]:
    """mirrorgate installed from its image. The session's out-of-cluster
    mirrorgate holds the same webhook name: its registration is set aside
    meanwhile and put back after (its RBAC, namespace and credential are the
    same objects and stay)."""
    workdir = tmp_path_factory.mktemp("in-cluster")
    registry = node_cluster.registry
    image = build("build.sh", env={"TAG": "localhost/mirrorgate:under-test"})
    push(image, f"{registry.upstream_host}/{REPOSITORY}:{TAG}", ca_path=registry.ca_path,
         username=registry.upstream_username, password=registry.upstream_password)
    plane = node_cluster.control_plane
    api_port = int(plane.url.rsplit(":", 1)[1])
    with plane.api_client() as api:
        _bridge_up(api, node_cluster)
        with relay(GATEWAY, ("127.0.0.1", api_port)) as route:
            directory = _kustomization(workdir, node_cluster, route.port)
            objects = [o for o in yaml.safe_load_all(subprocess.run(
                [str(kustomize), "build", str(directory)], check=True, capture_output=True,
                text=True, timeout=120).stdout) if o]
            mg.unregister(api, "mirrorgate")
            try:
                namespaces = [o for o in objects if o["kind"] == "Namespace"]
                _apply(api, namespaces)
                with contextlib.suppress(k8s.ApiException):  # made by the session already
                    nodepods.upstream_pull_secret(api, mg.NAMESPACE, registry)
                central_credential(api, registry)
                _apply(api, [o for o in objects if o["kind"] != "Namespace"])
                wait_until(lambda: _rolled_out(api), timeout=ROLLOUT_TIMEOUT,
                           what="mirrorgate rolled out in the cluster", interval=0.5)
                yield InCluster(node=node_cluster, objects=objects, image=image)
            finally:
                _remove(api, objects)
                mg.register(api, node_installed.configuration, node_installed.server,
                            excluded_labels=mg.OWN_WEBHOOK_LABELS)


def _remove(api: k8s.ApiClient, objects: list[dict[str, Any]]) -> None:
    """What the session's mirrorgate does not share: the webhook registration
    and the workload (Deployment, Service, PodDisruptionBudget)."""
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    for obj in objects:
        if obj["kind"] in ("MutatingWebhookConfiguration", "Deployment", "Service",
                           "PodDisruptionBudget"):
            resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            with contextlib.suppress(dynamic.exceptions.NotFoundError):
                resource.delete(name=obj["metadata"]["name"],
                                namespace=obj["metadata"].get("namespace"))


def test_runs_from_its_image_as_installed(in_cluster: InCluster) -> None:
    """Two replicas of the pushed image, non-root, read-only root, Ready behind
    the Service; the PodDisruptionBudget guards them; mirrorgate made its own
    certificate and caBundle."""
    with in_cluster.node.control_plane.api_client() as api:
        pods = k8s.CoreV1Api(api).list_namespaced_pod(
            mg.NAMESPACE, label_selector="app.kubernetes.io/name=mirrorgate").items
        stored = [api.sanitize_for_serialization(p) for p in pods]

        # The disruption controller updates the budget's status on its own
        # schedule, after the replicas are Ready: wait for it, bounded.
        def budget_counts_both() -> str | None:
            budget = k8s.PolicyV1Api(api).read_namespaced_pod_disruption_budget(
                "mirrorgate", mg.NAMESPACE)
            status = api.sanitize_for_serialization(budget).get("status") or {}
            return None if status.get("disruptionsAllowed") == 1 else f"status {status}"

        wait_until(budget_counts_both, timeout=60, what="the PodDisruptionBudget's status")
    registry = in_cluster.node.registry
    assert len(stored) == 2
    for pod in stored:
        container = pod["spec"]["containers"][0]
        assert container["image"] == f"{registry.upstream_host}/{REPOSITORY}:{TAG}"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["spec"]["securityContext"]["runAsUser"] == 65532
        assert pod["status"]["phase"] == "Running"


def _admission_logged(api: k8s.ApiClient, namespace: str,
                      timeout: float = 30.0) -> list[dict[str, Any]]:
    """The in-cluster replicas' admission lines for Pods of ``namespace``, once one is logged.

    A replica writes its admission line to a buffer it flushes once a second:
    its log, read once right after the Pods run, may not hold the line yet.
    """
    found: list[dict[str, Any]] = []

    def logged() -> str | None:
        core = k8s.CoreV1Api(api)
        replicas = core.list_namespaced_pod(
            mg.NAMESPACE, label_selector="app.kubernetes.io/name=mirrorgate").items
        found[:] = [e for p in replicas if p.metadata
                    for e in log_entries(core.read_namespaced_pod_log(
                        str(p.metadata.name), mg.NAMESPACE))
                    if e.get("msg") == "admission" and e.get("namespace") == namespace]
        return None if found else f"no admission line for {namespace} in {len(replicas)} replicas"

    wait_until(logged, timeout=timeout, what=f"an in-cluster admission line for {namespace}",
               interval=0.2)
    return found


def test_deployment_pulls_through_the_mirror_via_in_cluster_mirrorgate(
        in_cluster: InCluster) -> None:
    """The node's Deployment scenario, admitted by the in-cluster replicas."""
    registry = in_cluster.node.registry
    workload = nodepods.push_workload(registry, "node/in-cluster")
    with in_cluster.node.control_plane.api_client() as api:
        namespace = create_namespace(api, f"{GRANTED_PREFIX}{namespace_name('in-cluster')}",
                                     {"mirrorgate.io/mode": "enforce"})
        pods, logs = nodepods.run_deployment(api, namespace, workload)
        answered = _admission_logged(api, namespace)
    mirrored = f"{registry.host}/{workload.repository}:{workload.tag}"
    for stored in pods:
        assert stored["spec"]["containers"][0]["image"] == mirrored
        assert stored["spec"]["imagePullSecrets"] == [
            {"name": policy.pull_secret_name(CREDENTIAL)}]
    assert [line.strip() for line in logs] == [workload.greeting] * 2
    assert answered  # the in-cluster replicas answered these admissions


# Availability under load (issue #12, item 3): Pods created at a steady rate
# while one replica is deleted and then a new image version rolls out.
LOAD_RATE = 20.0      # Pods per second
LOAD_SECONDS = 60.0
ROLLOUT_TAG = "in-cluster-rollout"
# Stored, never scheduled: the load measures admission, not the node.
HOLD = "mirrorgate.io/e2e-hold"


@dataclass
class Outcome:
    """One create of the load: when, in which phase, and what the API server said."""

    at: float
    phase: str
    image: str | None  # as stored; None when the create failed
    error: str | None = None


def _load(api: k8s.ApiClient, namespace: str, image: str, phase: list[str],
          outcomes: list[Outcome]) -> None:
    core = k8s.CoreV1Api(api)
    started = time.monotonic()
    for i in range(int(LOAD_RATE * LOAD_SECONDS)):
        delay = started + i / LOAD_RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        body = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=f"load-{i}"),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image=image)],
                               scheduling_gates=[k8s.V1PodSchedulingGate(name=HOLD)]))
        now = time.monotonic() - started
        try:
            created = core.create_namespaced_pod(namespace, body)
        except k8s.ApiException as error:
            outcomes.append(Outcome(now, phase[0], None, f"{error.status} {error.reason}"))
            continue
        assert created.spec is not None
        outcomes.append(Outcome(now, phase[0], created.spec.containers[0].image))


def _deployment_done(api: k8s.ApiClient, image: str) -> str | None:
    deployment = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        k8s.AppsV1Api(api).read_namespaced_deployment("mirrorgate", mg.NAMESPACE))
    status = deployment.get("status", {})
    if deployment["spec"]["template"]["spec"]["containers"][0]["image"] != image:
        return "not this image"
    if (status.get("observedGeneration") != deployment["metadata"]["generation"]
            or status.get("updatedReplicas") != 2 or status.get("availableReplicas") != 2
            or status.get("replicas") != 2):
        return f"Deployment status {status}"
    return _rolled_out(api)


def test_admission_stays_available_through_replica_loss_and_rollout(
        in_cluster: InCluster, e2e_figures: dict[str, str]) -> None:
    registry = in_cluster.node.registry
    image = f"{registry.upstream_host}/node/load:1"  # never pulled: the Pods are held
    mirrored = f"{registry.host}/node/load:1"
    new_version = build("build.sh", env={"TAG": f"localhost/mirrorgate:{ROLLOUT_TAG}",
                                         "VERSION": "0.1.0+rollout"})
    new_reference = f"{registry.upstream_host}/{REPOSITORY}:{ROLLOUT_TAG}"
    push(new_version, new_reference, ca_path=registry.ca_path,
         username=registry.upstream_username, password=registry.upstream_password)
    plane = in_cluster.node.control_plane
    phase = ["steady"]
    outcomes: list[Outcome] = []
    marks: dict[str, float] = {}
    with plane.api_client() as api, plane.api_client() as load_api:
        namespace = create_namespace(api, f"{GRANTED_PREFIX}{namespace_name('load')}",
                                     {"mirrorgate.io/mode": "enforce"})
        load = threading.Thread(target=_load, args=(load_api, namespace, image, phase, outcomes))
        started = time.monotonic()
        load.start()
        try:
            time.sleep(10)
            phase[0] = "replica deleted"
            marks["replica deleted at"] = time.monotonic() - started
            core = k8s.CoreV1Api(api)
            victim = core.list_namespaced_pod(
                mg.NAMESPACE, label_selector="app.kubernetes.io/name=mirrorgate").items[0]
            assert victim.metadata is not None
            core.delete_namespaced_pod(str(victim.metadata.name), mg.NAMESPACE)
            old_image = f"{registry.upstream_host}/{REPOSITORY}:{TAG}"
            wait_until(lambda: _deployment_done(api, old_image), timeout=ROLLOUT_TIMEOUT,
                       what="a replacement replica Ready", interval=0.5)
            marks["replacement ready at"] = time.monotonic() - started
            phase[0] = "rollout"
            marks["rollout started at"] = time.monotonic() - started
            k8s.AppsV1Api(api).patch_namespaced_deployment("mirrorgate", mg.NAMESPACE, {
                "spec": {"template": {"spec": {"containers": [
                    {"name": "mirrorgate", "image": new_reference}]}}}})
            wait_until(lambda: _deployment_done(api, new_reference), timeout=ROLLOUT_TIMEOUT,
                       what="the new version rolled out", interval=0.5)
            marks["rollout done at"] = time.monotonic() - started
            phase[0] = "after"
        finally:
            load.join()
        stored = {str(p.metadata.name): p.spec.containers[0].image
                  for p in k8s.CoreV1Api(api).list_namespaced_pod(namespace).items
                  if p.metadata and p.spec}
        k8s.CoreV1Api(api).delete_namespace(namespace)
    failed = [o for o in outcomes if o.error is not None]
    unrewritten = sorted(name for name, found in stored.items() if found != mirrored)
    per_phase = {p: sum(1 for o in outcomes if o.phase == p)
                 for p in ("steady", "replica deleted", "rollout", "after")}
    e2e_figures["availability under load"] = (
        f"{len(outcomes)} Pods at {LOAD_RATE:g}/s for {LOAD_SECONDS:g} s "
        f"({', '.join(f'{k}: {v}' for k, v in per_phase.items())}); "
        f"failed admissions {len(failed)}, stored without their rewrite {len(unrewritten)}; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in marks.items()))
    assert len(outcomes) == int(LOAD_RATE * LOAD_SECONDS)
    assert per_phase["replica deleted"] > 0
    assert per_phase["rollout"] > 0
    assert len(stored) == len(outcomes) - len(failed)
    assert failed == []
    assert unrewritten == []
