"""mirrorgate in the cluster from its own image, on the real node (issue #12, item 2;
issue #20, items 1 and 4).

The session's release (`node_installed`, tests/e2e/harness/incluster.py) is the chart
installed as docs/install.md tells users; the other node scenarios run against
it too. Here: what the release is made of, the same Deployment scenario through
the other way users install (a kustomization of one's own on
`manifests/overlays/enforce`, the image set through `images:`, the policy
replaced with `configMapGenerator`, as `examples/custom-policy`, the pull secret
for mirrorgate's own image on its ServiceAccount), and availability under load
through a replica's loss, a caBundle emptied by a replace, and a `helm upgrade`.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
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
from tests.e2e.harness import apiload, kube, nodepods
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS, log_entries, read_secret
from tests.e2e.harness.incluster import (
    API_NAME,
    MIRROR_CA,
    MIRROR_CA_FILE,
    REPOSITORY,
    ROLLOUT_TIMEOUT,
    TAG,
    Release,
    push_image,
    replicas,
    wait_rolled_out,
)
from tests.e2e.harness.kube import create_namespace, create_pod, namespace_name
from tests.e2e.harness.node import GATEWAY, Node
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.rollout import deployment_done, held_load, old_replicas_stopped
from tests.e2e.harness.suite import CREDENTIAL, GRANTED_PREFIX, node_policy

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.image, pytest.mark.installed]


def _kustomization(workdir: Path, node: Node, relay_port: int) -> Path:
    """The user's kustomization (docs/install.md), plus the API route this machine needs."""
    (workdir / "mirrorgate").symlink_to(REPO_ROOT)
    mine = workdir / "mine"
    mine.mkdir()
    (mine / "policy.yaml").write_text(node_policy(node.registry))
    api_route = [
        {
            "op": "add",
            "path": "/spec/template/spec/hostAliases",
            "value": [{"ip": GATEWAY, "hostnames": [API_NAME]}],
        },
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/env",
            "value": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": API_NAME},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(relay_port)},
                # The node's registries' private CA, which the base has no place
                # for: kustomize users patch it in as they patch anything else.
                {"name": "SSL_CERT_FILE", "value": "/etc/mirror-ca/ca.crt"},
            ],
        },
        {
            "op": "add",
            "path": "/spec/template/spec/volumes/-",
            "value": {"name": "mirror-ca", "configMap": {"name": MIRROR_CA}},
        },
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/volumeMounts/-",
            "value": {"name": "mirror-ca", "mountPath": "/etc/mirror-ca", "readOnly": True},
        },
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../mirrorgate/manifests/overlays/enforce"],
        "images": [
            {
                "name": "ghcr.io/mirrorgate/mirrorgate",
                "newName": f"{node.registry.upstream_host}/{REPOSITORY}",
                "newTag": TAG,
            }
        ],
        "configMapGenerator": [
            {
                "name": "mirrorgate-policy",
                "namespace": mg.NAMESPACE,
                "behavior": "replace",
                "files": ["policy.yaml"],
                "options": {"disableNameSuffixHash": True},
            }
        ],
        "patches": [
            {
                "target": {"kind": "ServiceAccount", "name": "mirrorgate"},
                "patch": yaml.safe_dump(
                    [
                        {
                            "op": "add",
                            "path": "/imagePullSecrets",
                            "value": [{"name": nodepods.UPSTREAM_SECRET}],
                        }
                    ]
                ),
            },
            {
                "target": {"kind": "Deployment", "name": "mirrorgate"},
                "patch": yaml.safe_dump(api_route),
            },
        ],
    }
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return mine


def _apply(api: k8s.ApiClient, objects: list[dict[str, Any]]) -> None:
    kube.apply(api, objects, field_manager="mirrorgate-incluster")


def _remove(api: k8s.ApiClient, objects: list[dict[str, Any]]) -> None:
    """Everything the kustomization applied but the namespace (the release's home) and the
    CRDs: the Deployment first, its replicas gone before their RBAC, so the leader can
    hand its Lease back as it stops. The CRDs stay, as `helm uninstall` leaves them: the
    release installed next would find one still terminating, skip it (Helm installs
    only missing CRDs), and fail on its ClusterMirrorPolicy once it is gone (seen on
    v1.30.14)."""
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    k8s.AppsV1Api(api).delete_namespaced_deployment("mirrorgate", mg.NAMESPACE)
    wait_until(
        lambda: None if not replicas(api, terminating=True) else "replicas stopping",
        timeout=ROLLOUT_TIMEOUT,
        what="the kustomized replicas gone",
        interval=0.5,
    )
    for obj in reversed(objects):
        if obj["kind"] in ("Namespace", "Deployment", "CustomResourceDefinition"):
            continue
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        with contextlib.suppress(dynamic.exceptions.NotFoundError):
            resource.delete(
                name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace")
            )


@dataclass
class Kustomized:
    node: Node
    objects: list[dict[str, Any]]


@pytest.fixture
def kustomized(node_installed: Release, kustomize: Path, tmp_path: Path) -> Iterator[Kustomized]:
    """mirrorgate from its image through `kustomize build` of a kustomization on
    overlays/enforce (docs/install.md), while the session's release is set aside."""
    node = node_installed.node
    directory = _kustomization(tmp_path, node, node_installed.relay_port)
    objects = [
        o
        for o in yaml.safe_load_all(
            subprocess.run(
                [str(kustomize), "build", str(directory)],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
        )
        if o
    ]
    with node.control_plane.api_client() as api, node_installed.set_aside():
        try:
            _apply(api, objects)
            wait_rolled_out(api)
            yield Kustomized(node=node, objects=objects)
        finally:
            _remove(api, objects)


def _wait_rewritten(api: k8s.ApiClient, namespace: str, image: str, mirrored: str) -> None:
    """Until the API server sends this namespace's Pods to the new webhook, as a user waits
    after an install: a dry-run Pod of ``image`` comes back as ``mirrored``.

    A webhook configuration reaches the API server's admission a moment after it is
    written, and under the overlay's ``failurePolicy: Ignore`` a Pod created before then
    is admitted as written. On v1.30.14, after other modules had installed and removed
    webhook configurations of the same names, the Deployment's Pods were admitted
    unmirrored, with no call made (0 admissions on both replicas); this wait says so
    after 60 s instead of a pull failure after 120."""

    def rewritten() -> str | None:
        stored, _ = create_pod(
            api, namespace, nodepods.pod("probe", [nodepods.container("probe", image)]), True
        )
        found = stored["spec"]["containers"][0]["image"]
        return None if found == mirrored else f"admitted as {found}"

    wait_until(rewritten, timeout=60, what="the new webhook rewriting Pods", interval=0.5)


def _deployment_scenario(node: Node) -> None:
    """The node's Deployment scenario, admitted by the in-cluster replicas."""
    registry = node.registry
    workload = nodepods.push_workload(registry, "node/in-cluster")
    mirrored = f"{registry.host}/{workload.repository}:{workload.tag}"
    with node.control_plane.api_client() as api:
        namespace = create_namespace(
            api,
            f"{GRANTED_PREFIX}{namespace_name('in-cluster')}",
            ENFORCE_LABELS,
        )
        _wait_rewritten(api, namespace, workload.image, mirrored)
        pods, logs = nodepods.run_deployment(api, namespace, workload)
        answered = _admission_logged(api, namespace)
    for stored in pods:
        assert stored["spec"]["containers"][0]["image"] == mirrored
        assert stored["spec"]["imagePullSecrets"] == [{"name": policy.pull_secret_name(CREDENTIAL)}]
    assert [line.strip() for line in logs] == [workload.greeting] * 2
    assert answered  # the in-cluster replicas answered these admissions


def test_deployment_pulls_through_the_mirror_via_the_kustomize_overlay(
    kustomized: Kustomized,
) -> None:
    """Installed through `kustomize build` of overlays/enforce, the release set aside."""
    _deployment_scenario(kustomized.node)


def test_runs_from_its_image_as_installed(node_installed: Release) -> None:
    """Two replicas of the pushed image, non-root, read-only root, Ready behind
    the Service; the PodDisruptionBudget guards them; mirrorgate made its own
    certificate and caBundle."""
    with node_installed.node.control_plane.api_client() as api:
        pods = replicas(api)
        stored = [api.sanitize_for_serialization(p) for p in pods]

        # The disruption controller updates the budget's status on its own
        # schedule, after the replicas are Ready: wait for it, bounded.
        def budget_counts_both() -> str | None:
            budget = k8s.PolicyV1Api(api).read_namespaced_pod_disruption_budget(
                "mirrorgate", mg.NAMESPACE
            )
            status = api.sanitize_for_serialization(budget).get("status") or {}
            return None if status.get("disruptionsAllowed") == 1 else f"status {status}"

        wait_until(budget_counts_both, timeout=60, what="the PodDisruptionBudget's status")
    registry = node_installed.node.registry
    assert len(stored) == 2
    for pod in stored:
        container = pod["spec"]["containers"][0]
        assert container["image"] == f"{registry.upstream_host}/{REPOSITORY}:{TAG}"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["spec"]["securityContext"]["runAsUser"] == 65532
        assert pod["status"]["phase"] == "Running"


CALLER = """
import socket, ssl, sys
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
request = (
    b"POST /mutate HTTP/1.1\\r\\nHost: mirrorgate\\r\\nContent-Type: application/json\\r\\n"
    b"Content-Length: 2\\r\\n\\r\\n{}"
)
try:
    with socket.create_connection((sys.argv[1], 8443), timeout=10) as raw:
        with context.wrap_socket(raw) as tls:
            tls.sendall(request)
            answer = tls.recv(64)
    print(f"answered: {answer!r}" if answer else "refused: the connection was closed")
except (OSError, ssl.SSLError) as error:
    print(f"refused: {type(error).__name__}: {error}")
"""
"""A caller in a Pod: TLS to a replica's admission port, trusting anything, presenting no
certificate, then a /mutate; prints what came back."""


def test_a_pod_calling_mutate_without_the_api_servers_certificate_is_refused(
    node_installed: Release,
) -> None:
    """The chart's clientCA is on (tests/e2e/harness/incluster.py): the API server presents
    its webhook client certificate (every Pod the suite creates is rewritten through it),
    and a Pod that reaches the replica's port gets no HTTP answer, only a refused handshake,
    which the replica counts."""
    registry = node_installed.registry
    dropped = "mirrorgate_connections_dropped_total"
    with node_installed.control_plane.api_client() as api:
        namespace = create_namespace(api, namespace_name("caller"))  # not opted in
        nodepods.upstream_pull_secret(api, namespace, registry)
        (target, *_) = [p for p in replicas(api) if p.status and p.status.pod_ip]
        assert target.status is not None
        before = sum(node_installed.gauges(dropped, reason="handshake-failed"))
        body = nodepods.pod(
            "caller",
            [
                k8s.V1Container(
                    name="caller",
                    image=f"{registry.upstream_host}/{REPOSITORY}:{TAG}",
                    command=["python3", "-c", CALLER, str(target.status.pod_ip)],
                )
            ],
            pull_secrets=[nodepods.UPSTREAM_SECRET],
        )
        assert body.spec is not None
        body.spec.restart_policy = "Never"
        create_pod(api, namespace, body)

        def finished() -> str | None:
            phase = nodepods.read(api, namespace, "caller").get("status", {}).get("phase")
            return None if phase in ("Succeeded", "Failed") else f"phase {phase}"

        wait_until(finished, timeout=180, what="the caller Pod to finish", interval=0.5)
        output = nodepods.log(api, namespace, "caller").strip()
    assert output.startswith("refused:"), output
    wait_until(
        lambda: (
            None
            if sum(node_installed.gauges(dropped, reason="handshake-failed")) > before
            else "not counted"
        ),
        timeout=30,
        what="the refused handshake counted by the replica",
        interval=0.5,
    )


def test_probes_the_node_mirror_through_the_private_ca_given_as_mirror_ca(
    node_installed: Release,
) -> None:
    """The node's mirror presents a certificate of a private CA; the chart's `mirrorCA`
    (a ConfigMap the user made) is what serve's probes trust beside the image's system
    roots (--mirror-ca), so each replica's probes find the mirror up and the
    credential's login valid."""
    registry = node_installed.registry
    with node_installed.control_plane.api_client() as api:
        [container] = [
            c
            for c in api.sanitize_for_serialization(
                k8s.AppsV1Api(api).read_namespaced_deployment("mirrorgate", mg.NAMESPACE)
            )["spec"]["template"]["spec"]["containers"]
            if c["name"] == "mirrorgate"
        ]
    # serve reads the mounted bundle itself, beside the image's roots, and follows it.
    assert f"--mirror-ca={MIRROR_CA_FILE}" in container["args"]
    assert "SSL_CERT_FILE" not in {e["name"] for e in container.get("env", [])}
    node_installed.wait_gauge("mirrorgate_mirror_up", 1.0, timeout=60, mirror=registry.host)
    node_installed.wait_gauge("mirrorgate_credential_valid", 1.0, timeout=60, credential=CREDENTIAL)
    assert len(node_installed.gauges("mirrorgate_mirror_up", mirror=registry.host)) == 2


def test_leader_election_and_reconciliation_run_in_the_cluster(node_installed: Release) -> None:
    """No process outside the cluster serves or leads it: the webhook names the Service,
    a replica holds the reconciler's Lease, and that leader puts back a deleted copy of
    a pull secret at its next pass (the chart's default interval, 30 s)."""
    registry = node_installed.registry
    with node_installed.control_plane.api_client() as api:
        webhooks = (
            k8s.AdmissionregistrationV1Api(api)
            .read_mutating_webhook_configuration("mirrorgate")
            .webhooks
            or []
        )
        namespace = create_namespace(
            api, f"{GRANTED_PREFIX}{namespace_name('reconcile')}", ENFORCE_LABELS
        )
        workload = nodepods.push_workload(registry, "node/reconcile")
        create_pod(api, namespace, nodepods.pod("app", [nodepods.container("app", workload.image)]))
        nodepods.wait_running(api, namespace, "app")
        secret = policy.pull_secret_name(CREDENTIAL)
        before = read_secret(api, namespace, secret)
        assert before is not None
        k8s.CoreV1Api(api).delete_namespaced_secret(secret, namespace)
        deleted = time.monotonic()

        def back() -> str | None:
            found = read_secret(api, namespace, secret)
            return None if found is not None else f"{namespace}/{secret} not made again yet"

        wait_until(back, timeout=60, what="the deleted copy made again by the leader", interval=0.5)
        seconds = time.monotonic() - deleted
        lease = k8s.CoordinationV1Api(api).read_namespaced_lease(
            "mirrorgate-reconciler", mg.NAMESPACE
        )
        names = [str(p.metadata.name) for p in replicas(api) if p.metadata]
    print(f"\nnode: a deleted copy made again by the in-cluster leader in {seconds:.1f} s")
    assert webhooks
    assert all(
        w.client_config.service is not None and w.client_config.url is None for w in webhooks
    )
    assert lease.spec is not None
    assert lease.spec.holder_identity is not None
    assert any(lease.spec.holder_identity.startswith(f"{name}-") for name in names), (
        lease.spec.holder_identity,
        names,
    )


def _admission_logged(
    api: k8s.ApiClient, namespace: str, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The in-cluster replicas' admission lines for Pods of ``namespace``, once one is logged.

    A replica writes its admission line to a buffer it flushes once a second:
    its log, read once right after the Pods run, may not hold the line yet.
    """
    found: list[dict[str, Any]] = []

    def logged() -> str | None:
        core = k8s.CoreV1Api(api)
        serving = replicas(api)
        found[:] = [
            e
            for p in serving
            if p.metadata
            for e in log_entries(core.read_namespaced_pod_log(str(p.metadata.name), mg.NAMESPACE))
            if e.get("msg") == "admission" and e.get("namespace") == namespace
        ]
        return None if found else f"no admission line for {namespace} in {len(serving)} replicas"

    wait_until(
        logged, timeout=timeout, what=f"an in-cluster admission line for {namespace}", interval=0.2
    )
    return found


def test_deployment_pulls_through_the_mirror_via_in_cluster_mirrorgate(
    node_installed: Release,
) -> None:
    """The node's Deployment scenario, admitted by the Helm-installed replicas."""
    _deployment_scenario(node_installed.node)


def test_a_tenant_made_secret_of_the_reserved_prefix_is_refused(
    node_installed: Release,
) -> None:
    """The chart's ValidatingAdmissionPolicy mirrorgate-reserved-prefix, in force on the node's
    cluster: a tenant who may create Secrets is refused mirrorgate-*, not another name;
    mirrorgate's own ServiceAccount, by the chart's exact username, may make its copy."""
    name = f"mirrorgate-{secrets.token_hex(3)}"
    with node_installed.node.control_plane.api_client() as admin:
        namespace = create_namespace(admin, namespace_name("reserved"), ENFORCE_LABELS)
        tenant = kube.tenant(admin, namespace, "secrets")
        mg.wait_reserved_in_force(admin, namespace)
    opaque = {"metadata": {"name": name}, "type": "Opaque", "stringData": {"x": "y"}}
    with node_installed.node.control_plane.api_client(user=tenant, groups=()) as api:
        core = k8s.CoreV1Api(api)
        refused = kube.refusal(core.create_namespaced_secret, namespace, opaque)
        core.create_namespaced_secret(  # the control: any other name is the tenant's
            namespace,
            {**opaque, "metadata": {"name": f"app-{secrets.token_hex(3)}"}},  # type: ignore[arg-type]
        )
    copy = {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "mirrorgate"}},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": '{"auths":{}}'},
    }
    with node_installed.node.control_plane.api_client() as api:
        api.set_default_header(
            "Impersonate-User", f"system:serviceaccount:{mg.NAMESPACE}:mirrorgate"
        )
        k8s.CoreV1Api(api).create_namespaced_secret(namespace, copy, dry_run="All")  # type: ignore[arg-type]
    assert f"Secret {namespace}/{name}: {mg.RESERVED_REFUSAL}" in refused, refused


# Availability under load (issue #12, item 3; issue #20, item 4): 16 concurrent
# creators keep 20 Pods/s while one replica is deleted and then a new image
# version rolls both out, until every old replica has terminated; counted by
# the API server (tests/e2e/harness/apiload.py).
ROLLOUT_TAG = "in-cluster-rollout"


def _ca_bundles_set(api: k8s.ApiClient) -> str | None:
    webhooks = (
        k8s.AdmissionregistrationV1Api(api)
        .read_mutating_webhook_configuration("mirrorgate")
        .webhooks
        or []
    )
    return None if all(w.client_config.ca_bundle for w in webhooks) else "caBundle empty"


def test_a_replaced_configuration_gets_its_ca_bundle_back_under_load(
    node_installed: Release, e2e_figures: dict[str, str]
) -> None:
    """A replace-style apply of the webhook configuration (as `kubectl replace` sends the
    chart's manifest: no caBundle) while Pods are created: the replicas, which watch it,
    set caBundle again within 10 s. The Pods created in the gap are counted: under
    Ignore each one the API server failed open on is stored unrewritten."""
    registry = node_installed.node.registry
    image = f"{registry.upstream_host}/node/gap:1"
    mirrored = f"{registry.host}/node/gap:1"
    plane = node_installed.node.control_plane
    with plane.api_client() as api:
        load = held_load(api, node_installed.node, "gap", image, minimum_s=4.0)
        namespace = load.namespace
        before = apiload.api_server_samples(api)
        with load.running():
            load.wait_created(40)  # two seconds' worth at 20/s before the replace
            admission = k8s.AdmissionregistrationV1Api(api)
            manifest = api.sanitize_for_serialization(
                admission.read_mutating_webhook_configuration("mirrorgate")
            )
            manifest["metadata"] = {
                "name": "mirrorgate",
                "resourceVersion": manifest["metadata"]["resourceVersion"],
            }
            for webhook in manifest["webhooks"]:
                del webhook["clientConfig"]["caBundle"]
            replaced = time.monotonic()
            admission.replace_mutating_webhook_configuration("mirrorgate", manifest)
            wait_until(
                lambda: _ca_bundles_set(api),
                timeout=10,
                what="caBundle restored after a replace",
                interval=0.02,
            )
            gap = time.monotonic() - replaced
        after = apiload.api_server_samples(api)
        stored = [
            p.spec.containers[0].image
            for p in k8s.CoreV1Api(api).list_namespaced_pod(namespace).items
            if p.spec
        ]
        k8s.CoreV1Api(api).delete_namespace(namespace)
    counts = apiload.WebhookCounts.between(before, after, mg.ENFORCE_WEBHOOK)
    unrewritten = sum(1 for found in stored if found != mirrored)
    e2e_figures["caBundle restored on the node after a replace"] = (
        f"in {gap:.2f} s; {len(load.outcomes)} Pods created around it at "
        f"{load.achieved_rate:.1f}/s: fail-open {counts.fail_open}, "
        f"rejected {counts.rejected}, unrewritten {unrewritten}"
    )
    assert gap <= 10.0
    assert [o for o in load.outcomes if o.error is not None] == []
    assert counts.rejected == 0
    assert unrewritten == counts.fail_open  # each miss is one the API server failed open on


def test_admission_stays_available_through_replica_loss_and_rollout(
    node_installed: Release, e2e_figures: dict[str, str]
) -> None:
    registry = node_installed.node.registry
    image = f"{registry.upstream_host}/node/load:1"  # never pulled: the Pods are held
    mirrored = f"{registry.host}/node/load:1"
    push_image(registry, ROLLOUT_TAG, version="0.1.0+rollout")
    new_reference = f"{registry.upstream_host}/{REPOSITORY}:{ROLLOUT_TAG}"
    plane = node_installed.node.control_plane
    marks: dict[str, float] = {}
    with plane.api_client() as api:
        load = held_load(api, node_installed.node, "load", image, minimum_s=20.0)
        namespace = load.namespace
        before = apiload.api_server_samples(api)
        with load.running():
            load.wait_created(100)  # five seconds' worth at 20/s before the first disruption
            (victim, *_) = replicas(api)
            assert victim.metadata is not None
            deleted = time.monotonic()
            k8s.CoreV1Api(api).delete_namespaced_pod(str(victim.metadata.name), mg.NAMESPACE)
            old_image = f"{registry.upstream_host}/{REPOSITORY}:{TAG}"
            wait_until(
                lambda: deployment_done(api, old_image),
                timeout=ROLLOUT_TIMEOUT,
                what="a replacement replica Ready",
                interval=0.5,
            )
            marks["replaced"] = time.monotonic() - deleted
            rollout = time.monotonic()
            node_installed.upgrade("--set", f"image.tag={ROLLOUT_TAG}")
            wait_until(
                lambda: deployment_done(api, new_reference),
                timeout=ROLLOUT_TIMEOUT,
                what="the new version rolled out",
                interval=0.5,
            )
            # The load lasts until every old replica has terminated, not just left the
            # rotation: a terminating replica still answers during its preStop pause.
            wait_until(
                lambda: old_replicas_stopped(api, new_reference),
                timeout=ROLLOUT_TIMEOUT,
                what="the old replicas stopped",
                interval=0.5,
            )
            marks["rollout"] = time.monotonic() - rollout
        after = apiload.api_server_samples(api)
        stored = {
            str(p.metadata.name): p.spec.containers[0].image
            for p in k8s.CoreV1Api(api).list_namespaced_pod(namespace).items
            if p.metadata and p.spec
        }
        k8s.CoreV1Api(api).delete_namespace(namespace)
    counts = apiload.WebhookCounts.between(before, after, mg.ENFORCE_WEBHOOK)
    failed = [o for o in load.outcomes if o.error is not None]
    unrewritten = sorted(name for name, found in stored.items() if found != mirrored)
    e2e_figures["availability"] = (
        f"{len(load.outcomes)} Pods, {load.achieved_rate:.1f}/s achieved, "
        f"fail-open {counts.fail_open}, rejected {counts.rejected}, "
        f"unrewritten {len(unrewritten)}, "
        f"admission p99 <= {counts.p99_bound_s * 1000:g} ms, "
        f"replica replaced in {marks['replaced']:.1f} s, rollout {marks['rollout']:.1f} s"
    )
    assert load.elapsed_s >= 20.0
    assert load.achieved_rate >= 18.0
    assert failed == []
    assert len(stored) == len(load.outcomes)
    assert counts.admissions == len(load.outcomes)
    assert (counts.fail_open, counts.rejected, len(unrewritten)) == (0, 0, 0)
