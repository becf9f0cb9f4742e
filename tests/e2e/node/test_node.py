"""mirrorgate on a real node: the kubelet and containerd pull through the authenticated mirror.

Scenarios of issue #11, each on the node cluster (tests/e2e/harness/node.py): a real
kubelet picks the pull secret for each image by the image's own host, and
a real containerd pulls, so what the registries' access logs show is what a
production node would do. `containerd` in a registry's log is the node;
`Go-http-client` in the upstream's log is the mirror filling its cache.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes import client as k8s

from mirrorgate import policy
from tests.commands import MIRRORGATE
from tests.e2e.harness import nodepods
from tests.e2e.harness.binaries import REPO_ROOT, kubernetes_minor
from tests.e2e.harness.dockerconfig import Credentials
from tests.e2e.harness.fixtures_secrets import AUDIT_LABELS, ENFORCE_LABELS, as_dict, read_secret
from tests.e2e.harness.incluster import Release
from tests.e2e.harness.kube import create_namespace, create_pod, namespace_name
from tests.e2e.harness.node import (
    KUBELET_CLIENT_USER,
    NODE_NAME,
    NODE_USER,
    NODES_GROUP,
    Node,
    ensures_secret_pulled_images,
)
from tests.e2e.harness.nodepods import Workload, by_node, manifest_statuses, push_workload
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.provider_setup import password_of
from tests.e2e.harness.registry import RegistryStack, htpasswd_line
from tests.e2e.harness.registry_client import RegistryClient, RegistryHTTPError
from tests.e2e.harness.suite import (
    CREDENTIAL,
    GRANTED_PREFIX,
    central_credential,
    node_policy,
)

pytestmark = [pytest.mark.e2e, pytest.mark.node]
# Against mirrorgate installed from its image by its chart (tests/e2e/harness/incluster.py).
INSTALLED, IMAGE = pytest.mark.installed, pytest.mark.image

SECRET = policy.pull_secret_name(CREDENTIAL)
MIRROR_FILLING = "Go-http-client"
ROTATION_LIMIT = 30.0


def make_namespace(
    api: k8s.ApiClient, hint: str, labels: dict[str, str] | None = None, *, granted: bool
) -> str:
    """A fresh namespace; `granted` ones match the node policy's grant (`granted-*`)."""
    name = namespace_name(hint)
    return create_namespace(api, f"{GRANTED_PREFIX}{name}" if granted else name, labels)


def mirror_image(registry: RegistryStack, workload: Workload) -> str:
    return f"{registry.host}/{workload.repository}:{workload.tag}"


@contextlib.contextmanager
def exported_hosts_toml(node: Node, tmp_path: Path) -> Iterator[str]:
    """containerd configured with what `mirrorgate export containerd` writes for the upstream.

    The written file is used as is, plus our test CA (`ca = …`, for the
    server and for the mirror host); the usual file is put back afterwards.
    """
    registry = node.registry
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(node_policy(registry))
    out = tmp_path / "export"
    subprocess.run(
        [*MIRRORGATE, "export", "containerd", "--policy", str(policy_file), "--out", str(out)],
        check=True,
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
    )
    exported = (out / registry.upstream_host / "hosts.toml").read_text()
    ca = f'ca = "{registry.ca_path}"'
    lines = []
    for line in exported.splitlines():
        lines.append(line)
        if line.startswith("server = "):
            lines.append(ca)
        elif line.startswith("[host."):
            lines.append(f"  {ca}")
    text = "\n".join(lines) + "\n"
    node.write_hosts_toml(registry.upstream_host, text)
    try:
        yield exported
    finally:
        node.write_hosts_toml(
            registry.upstream_host, node.default_hosts_toml(registry.upstream_host)
        )


def _allowed(
    api: k8s.ApiClient, user: str, verb: str, resource: str, subresource: str = ""
) -> bool:
    review = k8s.AuthorizationV1Api(api).create_subject_access_review(
        k8s.V1SubjectAccessReview(
            spec=k8s.V1SubjectAccessReviewSpec(
                user=user,
                resource_attributes=k8s.V1ResourceAttributes(
                    verb=verb, resource=resource, subresource=subresource or None
                ),
            )
        )
    )
    return bool(review.status and review.status.allowed)


def test_api_server_reaches_kubelet_and_pods(node_cluster: Node) -> None:
    """Pod logs through the API (from the kubelet); a Pod by its own address (pods/proxy).

    The API server calls the kubelet as a user RBAC lets use the kubelet's API and
    nothing else (no system:masters)."""
    registry = node_cluster.registry
    workload = push_workload(registry, "node/reachable")
    with node_cluster.control_plane.api_client() as api:
        namespace = make_namespace(api, "reachable", granted=False)
        secret = nodepods.upstream_pull_secret(api, namespace, registry)
        create_pod(
            api,
            namespace,
            nodepods.pod(
                "web",
                [nodepods.container("web", workload.image, listen=True)],
                pull_secrets=[secret],
            ),
        )
        stored = nodepods.wait_running(api, namespace, "web")
        assert nodepods.log(api, namespace, "web").strip() == workload.greeting
        # The API server proxies to the Pod's own address on the bridge.
        answer = k8s.CoreV1Api(api).connect_get_namespaced_pod_proxy_with_path(
            "web:8080", namespace, ""
        )
        kubelet_api = [
            _allowed(api, KUBELET_CLIENT_USER, verb, "nodes", sub)
            for verb, sub in (("get", "log"), ("create", "proxy"))
        ]
        beyond = [
            _allowed(api, KUBELET_CLIENT_USER, verb, resource)
            for verb, resource in (("get", "secrets"), ("create", "pods"))
        ]
    assert stored["status"]["podIP"].startswith("10.244.0.")
    assert answer.strip() == workload.greeting
    assert kubelet_api == [True, True]
    assert beyond == [False, False]


def _kubelet_certificate(node: Node) -> bytes:
    """The client certificate (PEM) in the kubelet's own kubeconfig."""
    assert node.kubelet_kubeconfig is not None
    [user] = yaml.safe_load(node.kubelet_kubeconfig.read_text())["users"]
    return base64.b64decode(user["user"]["client-certificate-data"])


def _forbidden(call: Callable[[], object]) -> str:
    """The API server's message for a call it must refuse with 403."""
    with pytest.raises(k8s.ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value
    return str(json.loads(str(refused.value.body))["message"])


def test_the_kubelet_runs_on_its_own_node_identity(node_cluster: Node) -> None:
    """Node,RBAC and NodeRestriction, as in production: the kubelet gets what its Pods need.

    The kubelet's kubeconfig holds a certificate of the cluster CA for
    `system:node:localhost` in `system:nodes`, and no RBAC binding names that
    user or group. With that certificate, the Secret of a Pod bound to the
    node can be read (the Pod pulled with it), a Secret no Pod of the node
    uses cannot, nor can Secrets be listed; and NodeRestriction refuses the
    node a label reserved for administrators on its own Node.
    """
    plane, registry = node_cluster.control_plane, node_cluster.registry
    pem = _kubelet_certificate(node_cluster)
    cert = x509.load_pem_x509_certificate(pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(plane.ca_pem))
    assert (
        [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        == [NODE_USER]
        == [f"system:node:{NODE_NAME}"]
    )
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        NODES_GROUP
    ]
    workload = push_workload(registry, "node/identity")
    with plane.api_client() as api:
        rbac = k8s.RbacAuthorizationV1Api(api)
        bindings = [
            as_dict(api, b)
            for b in [
                *rbac.list_cluster_role_binding().items,
                *rbac.list_role_binding_for_all_namespaces().items,
            ]
        ]
        namespace = make_namespace(api, "identity", granted=False)
        bound = nodepods.upstream_pull_secret(api, namespace, registry)
        unused = nodepods.create_pull_secret(
            api, namespace, "unused", registry.host, registry.username, registry.password
        )
        create_pod(
            api,
            namespace,
            nodepods.pod("app", [nodepods.container("app", workload.image)], pull_secrets=[bound]),
        )
        nodepods.wait_running(api, namespace, "app")
    granted = [
        (b["metadata"]["name"], s["name"])
        for b in bindings
        for s in b.get("subjects", [])
        if s["name"] in (NODE_USER, NODES_GROUP)
    ]
    assert granted == []
    # The very certificate and key of the kubelet's kubeconfig (the plane issues one per identity).
    with plane.api_client(NODE_USER, [NODES_GROUP]) as kubelet:
        assert Path(kubelet.configuration.cert_file).read_bytes() == pem
        core = k8s.CoreV1Api(kubelet)
        readable = as_dict(kubelet, core.read_namespaced_secret(bound, namespace))
        unrelated = _forbidden(lambda: core.read_namespaced_secret(unused, namespace))
        listing = _forbidden(lambda: core.list_namespaced_secret(namespace))
        label = "node-restriction.kubernetes.io/e2e"
        restricted = _forbidden(
            lambda: core.patch_node(NODE_NAME, {"metadata": {"labels": {label: "yes"}}})
        )
    assert readable["metadata"]["name"] == bound
    assert "no relationship found between node 'localhost' and this object" in unrelated
    assert NODE_USER in listing
    assert label in restricted


def test_1_without_mirrorgate_the_kubelet_gives_the_mirror_no_credential(
    node_cluster: Node, tmp_path: Path
) -> None:
    """The seeds' problem: a node-level mirror never sees the Pod's secret for it.

    containerd sends the upstream's pulls to the mirror (the exported
    hosts.toml); the Pod carries the mirror's own credential. The kubelet
    picks credentials by the image's host, the upstream, finds none, and
    hands containerd none: the mirror answers 401 for a request without
    credentials. containerd then falls back to the upstream itself, which
    also requires credentials the Pod does not have: the pull fails.
    """
    registry = node_cluster.registry
    workload = push_workload(registry, "node/seeds-problem")
    with (
        node_cluster.control_plane.api_client() as api,
        exported_hosts_toml(node_cluster, tmp_path) as exported,
    ):
        namespace = make_namespace(api, "seeds", granted=False)  # no mirrorgate label
        mirror_secret = nodepods.create_pull_secret(
            api, namespace, "mirror-pull", registry.host, registry.username, registry.password
        )
        create_pod(
            api,
            namespace,
            nodepods.pod(
                "app", [nodepods.container("app", workload.image)], pull_secrets=[mirror_secret]
            ),
        )
        message = nodepods.wait_pull_failure(api, namespace, "app", "app")
    assert f'[host."https://{registry.host}' in exported
    assert "password" not in exported.lower()
    mirror = by_node(registry.access_log("mirror"), workload)
    upstream = by_node(registry.access_log("upstream"), workload)
    # The mirror was asked first (for the upstream's name: ?ns=), only ever without credentials.
    assert manifest_statuses(mirror) == {401}
    assert all(f"ns={registry.upstream_host.replace(':', '%3A')}" in a.path for a in mirror)
    refusals = [
        line
        for line in registry.log_text("mirror").splitlines()
        if f"vars.name={workload.repository} " in line and "error authorizing" in line
    ]
    # "invalid authorization credential" is distribution's word for none at all (a
    # wrong one is "authentication failure").
    assert refusals
    assert all("invalid authorization credential" in r for r in refusals), refusals
    # Then the upstream itself, anonymously: its token server refuses, 401 again.
    assert manifest_statuses(upstream) == {401}
    assert nodepods.NO_CREDENTIAL in message, message


@INSTALLED
@IMAGE
def test_2_enforce_deployment_pulls_through_the_mirror(node_installed: Release) -> None:
    """Deployment → controller-manager → mirrorgate → the kubelet pulls via the mirror."""
    registry = node_installed.registry
    workload = push_workload(registry, "node/deployment")
    with node_installed.control_plane.api_client() as api:
        namespace = make_namespace(api, "deployment", ENFORCE_LABELS, granted=True)
        pods, logs = nodepods.run_deployment(api, namespace, workload)
        template = api.sanitize_for_serialization(
            k8s.AppsV1Api(api).read_namespaced_deployment("hello", namespace)
        )
    for stored in pods:
        assert stored["spec"]["containers"][0]["image"] == mirror_image(registry, workload)
        assert stored["spec"]["imagePullSecrets"] == [{"name": SECRET}]
    assert [line.strip() for line in logs] == [workload.greeting] * 2
    # Only Pods are mutated, never their templates.
    assert template["spec"]["template"]["spec"]["containers"][0]["image"] == workload.image
    mirror = by_node(registry.access_log("mirror"), workload)
    # containerd's first request carries no credential (401), then it authenticates (200)
    # as the mirror's only htpasswd user: the credential's.
    htpasswd = (registry.workdir / "mirror.htpasswd").read_text().splitlines()
    assert [line.partition(":")[0] for line in htpasswd] == [registry.username]
    assert 200 in manifest_statuses(mirror)
    assert any("/blobs/" in a.path and a.status == 200 for a in mirror)
    filling = by_node(registry.access_log("upstream"), workload, agent=MIRROR_FILLING)
    assert 200 in manifest_statuses(filling)
    assert any("/blobs/" in a.path and a.status == 200 for a in filling)
    assert by_node(registry.access_log("upstream"), workload) == []  # the node never went there


@INSTALLED
@IMAGE
def test_3_init_and_ephemeral_containers_pull_through_the_mirror(node_installed: Release) -> None:
    """An initContainer, and a `kubectl debug` container added later, both rewritten and run."""
    registry = node_installed.registry
    init, app, debug = (
        push_workload(registry, f"node/{kind}") for kind in ("init", "app", "debug")
    )
    with node_installed.control_plane.api_client() as api:
        namespace = make_namespace(api, "containers", ENFORCE_LABELS, granted=True)
        create_pod(
            api,
            namespace,
            nodepods.pod(
                "app",
                [nodepods.container("app", app.image)],
                init_containers=[nodepods.container("init", init.image, once=True)],
            ),
        )
        nodepods.wait_running(api, namespace, "app")
        # What `kubectl debug -it app --image=…` sends: the ephemeralcontainers subresource.
        k8s.CoreV1Api(api).patch_namespaced_pod_ephemeralcontainers(
            "app",
            namespace,
            {
                "spec": {
                    "ephemeralContainers": [
                        {"name": "debug", "image": debug.image, "targetContainerName": "app"}
                    ]
                }
            },
        )

        def debug_running() -> str | None:
            stored = nodepods.read(api, namespace, "app")
            for status in stored["status"].get("ephemeralContainerStatuses", []):
                if "running" in status.get("state", {}):
                    return None
            return nodepods.describe(stored)

        wait_until(
            debug_running,
            timeout=nodepods.RUNNING_TIMEOUT,
            what="the ephemeral container running",
            interval=0.2,
        )
        stored = nodepods.read(api, namespace, "app")
        logs = {
            name: nodepods.log(api, namespace, "app", name).strip()
            for name in ("init", "app", "debug")
        }
    spec = stored["spec"]
    assert spec["initContainers"][0]["image"] == mirror_image(registry, init)
    assert spec["containers"][0]["image"] == mirror_image(registry, app)
    assert spec["ephemeralContainers"][0]["image"] == mirror_image(registry, debug)
    assert logs == {"init": init.greeting, "app": app.greeting, "debug": debug.greeting}
    mirror = registry.access_log("mirror")
    for workload in (init, app, debug):
        assert 200 in manifest_statuses(by_node(mirror, workload)), workload.repository


@contextlib.contextmanager
def mirror_password(registry: RegistryStack, password: str) -> Iterator[None]:
    """The mirror's htpasswd holds `password` for its user; the original is put back after."""
    htpasswd = registry.workdir / "mirror.htpasswd"
    original = htpasswd.read_text()

    def write(text: str) -> None:
        htpasswd.write_text(text)
        # The registry re-reads the file when its mtime changes: make sure it does.
        stamp = time.time() + secrets.randbelow(1000) / 1000 + 1
        os.utime(htpasswd, (stamp, stamp))

    write(htpasswd_line(registry.username, password) + "\n")
    try:
        yield
    finally:
        write(original)


def mirror_answers(registry: RegistryStack, password: str) -> int:
    """The status the mirror gives a manifest request with `password` (200 or 401)."""
    try:
        with RegistryClient(
            registry.host,
            ca_file=str(registry.ca_path),
            credentials=Credentials(registry.username, password),
        ) as client:
            client.pull(registry.repository, registry.tag)
    except RegistryHTTPError as error:
        return error.status
    return 200


@contextlib.contextmanager
def rotated(api: k8s.ApiClient, registry: RegistryStack, password: str) -> Iterator[float]:
    """The rotation: the mirror takes only `password`, then the central credential holds it.

    Yields when the credential changed (time.monotonic()); both are put back after.
    """
    with mirror_password(registry, password):
        wait_until(
            lambda: (
                None
                if mirror_answers(registry, registry.password) == 401
                else "old password still accepted"
            ),
            timeout=10,
            what="the mirror refusing the old password",
        )
        try:
            started = time.monotonic()
            central_credential(api, registry, password=password)
            yield started
        finally:
            central_credential(api, registry)


@INSTALLED
@IMAGE
def test_4_rotated_mirror_password_reaches_new_pods_within_30s(node_installed: Release) -> None:
    """The mirror's password changes and the central credential with it: a new Pod pulls."""
    registry = node_installed.registry
    workload = push_workload(registry, "node/rotation")
    new_password = f"rotated-{secrets.token_urlsafe(12)}"
    with node_installed.control_plane.api_client() as api:
        namespace = make_namespace(api, "rotation", ENFORCE_LABELS, granted=True)
        with rotated(api, registry, new_password) as started:
            create_pod(
                api, namespace, nodepods.pod("app", [nodepods.container("app", workload.image)])
            )
            nodepods.wait_running(api, namespace, "app", timeout=ROTATION_LIMIT)
            seconds = time.monotonic() - started
            line = nodepods.log(api, namespace, "app").strip()
            old_status = mirror_answers(registry, registry.password)
            new_status = mirror_answers(registry, new_password)
    print(f"\nFIGURE node_rotation_to_running_seconds={seconds:.2f}")
    assert line == workload.greeting
    assert (old_status, new_status) == (401, 200)
    assert 200 in manifest_statuses(by_node(registry.access_log("mirror"), workload))


@INSTALLED
@IMAGE
def test_4_rotation_rewrites_the_copy_of_a_namespace_with_running_pods(
    node_installed: Release,
) -> None:
    """Rotation of an existing copy: Pod A runs in N; the credential rotates, the mirror
    refuses the old password; Pod B in N pulls with the new login; Pod C in N, with
    A's image already on the node, starts under KubeletEnsureSecretPulledImages.

    mirrorgate rewrites N's copy in place (same uid), so the kubelet knows it
    by its coordinates: C starts from the node's copy without a pull (the
    kubelet records the new hash). A copy deleted and made again (a new uid)
    would make the kubelet pull again with it.
    """
    registry = node_installed.registry
    running = push_workload(registry, "node/rotation-existing")
    fresh = push_workload(registry, "node/rotation-fresh")
    new_password = f"rotated-{secrets.token_urlsafe(12)}"

    def copy_in(api: k8s.ApiClient, namespace: str) -> dict[str, Any]:
        found = read_secret(api, namespace, SECRET)
        assert found is not None, f"no {SECRET} in {namespace}"
        return found

    def copy_rotated(api: k8s.ApiClient, namespace: str) -> str | None:
        # Never the passwords themselves in a message.
        return None if password_of(copy_in(api, namespace)) == new_password else "old password"

    with node_installed.control_plane.api_client() as api:
        namespace = make_namespace(api, "rotation-existing", ENFORCE_LABELS, granted=True)
        create_pod(api, namespace, nodepods.pod("a", [nodepods.container("app", running.image)]))
        nodepods.wait_running(api, namespace, "a")
        before = copy_in(api, namespace)
        with rotated(api, registry, new_password) as started:
            # No Pod asks for it: mirrorgate rewrites the copy because the store changed.
            wait_until(
                lambda: copy_rotated(api, namespace),
                timeout=ROTATION_LIMIT,
                what=f"{namespace}/{SECRET} holding the new password",
            )
            rotated_after = time.monotonic() - started
            after = copy_in(api, namespace)
            stored_b, _ = create_pod(
                api, namespace, nodepods.pod("b", [nodepods.container("app", fresh.image)])
            )
            nodepods.wait_running(api, namespace, "b", timeout=ROTATION_LIMIT)
            pulled_b = by_node(registry.access_log("mirror"), fresh)
            mark = len(by_node(registry.access_log("mirror"), running))
            stored_c, _ = create_pod(
                api, namespace, nodepods.pod("c", [nodepods.container("app", running.image)])
            )
            nodepods.wait_running(api, namespace, "c")
            logs = [nodepods.log(api, namespace, name).strip() for name in ("a", "b", "c")]
            old_status = mirror_answers(registry, registry.password)
        asked_for_c = by_node(registry.access_log("mirror"), running)[mark:]
    print(f"\nFIGURE node_existing_copy_rotated_seconds={rotated_after:.2f}")
    assert logs == [running.greeting, fresh.greeting, running.greeting]
    # The same object, rewritten: the kubelet matches it by namespace, name and uid.
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
    for stored in (stored_b, stored_c):
        assert stored["spec"]["imagePullSecrets"] == [{"name": SECRET}]
    assert stored_c["spec"]["containers"][0]["image"] == mirror_image(registry, running)
    # B's pull: the mirror took only the new password by then.
    assert old_status == 401
    assert 200 in manifest_statuses(pulled_b)
    # C: from the node's copy, under the rotated Secret, with no request to the mirror.
    assert asked_for_c == []


def runs_untouched_from_the_upstream(
    installed: Release, repository: str, labels: dict[str, str], *, granted: bool
) -> tuple[Workload, dict[str, Any], list[str]]:
    """A Pod with the user's own upstream Secret runs as written, pulled from the upstream.

    Returns the workload, the Pod as created, and the client's warnings.
    """
    registry = installed.registry
    workload = push_workload(registry, repository)
    with installed.control_plane.api_client() as api:
        namespace = make_namespace(api, repository.rpartition("/")[2], labels, granted=granted)
        secret = nodepods.upstream_pull_secret(api, namespace, registry)
        created, warnings = create_pod(
            api,
            namespace,
            nodepods.pod("app", [nodepods.container("app", workload.image)], pull_secrets=[secret]),
        )
        nodepods.wait_running(api, namespace, "app")
        line = nodepods.log(api, namespace, "app").strip()
    assert created["spec"]["containers"][0]["image"] == workload.image
    assert created["spec"]["imagePullSecrets"] == [{"name": secret}]
    assert policy.ORIGINAL_IMAGES_ANNOTATION not in (created["metadata"].get("annotations") or {})
    assert line == workload.greeting
    assert 200 in manifest_statuses(by_node(registry.access_log("upstream"), workload))
    assert by_node(registry.access_log("mirror"), workload) == []
    return workload, created, warnings


@INSTALLED
@IMAGE
def test_5_audit_mode_runs_the_original_image_and_names_the_rewrite(
    node_installed: Release,
) -> None:
    """audit: the Pod runs from the upstream, untouched; the warning names the mirror image."""
    workload, _, warnings = runs_untouched_from_the_upstream(
        node_installed, "node/audit", AUDIT_LABELS, granted=True
    )
    mirrored = mirror_image(node_installed.registry, workload)
    assert any(mirrored in w and workload.image in w for w in warnings), warnings


@INSTALLED
@IMAGE
def test_6_namespace_without_the_grant_pulls_from_the_upstream(node_installed: Release) -> None:
    """enforce, but not granted the credential: images stay as written, pulled upstream."""
    _, _, warnings = runs_untouched_from_the_upstream(
        node_installed, "node/no-grant", ENFORCE_LABELS, granted=False
    )
    assert any(CREDENTIAL in w for w in warnings), warnings


@INSTALLED
@IMAGE
def test_7_cached_mirror_image_needs_the_grant_on_the_node(node_installed: Release) -> None:
    """KubeletEnsureSecretPulledImages (KEP-2535, on by default from 1.35): no reuse
    without the grant; before 1.35 the node's cache is the boundary (docs/install.md).

    A granted namespace pulls the image through the mirror with mirrorgate's
    Secret. A Pod in a namespace without the grant names the same mirror image
    with IfNotPresent: the node has it. From 1.35 the kubelet re-checks
    credentials, finds none, pulls anonymously, and the mirror refuses; before
    1.35 (the documented fallback) it starts from the node's copy, and the mirror
    is asked nothing. A second granted namespace (its own copy of the same
    credential) starts from the cache either way.
    """
    ensures = ensures_secret_pulled_images(kubernetes_minor())
    registry = node_installed.registry
    workload = push_workload(registry, "node/ensure-pulled")
    image = mirror_image(registry, workload)
    with node_installed.control_plane.api_client() as api:
        granted = make_namespace(api, "ensure-granted", ENFORCE_LABELS, granted=True)
        create_pod(api, granted, nodepods.pod("first", [nodepods.container("app", workload.image)]))
        nodepods.wait_running(api, granted, "first")
        before = len(by_node(registry.access_log("mirror"), workload))

        other = make_namespace(api, "ensure-other", ENFORCE_LABELS, granted=False)
        stored, warnings = create_pod(
            api,
            other,
            nodepods.pod("reuse", [nodepods.container("app", image, pull_policy="IfNotPresent")]),
        )
        if ensures:
            message = nodepods.wait_pull_failure(api, other, "reuse", "app")
        else:
            nodepods.wait_running(api, other, "reuse")
            message = nodepods.log(api, other, "reuse").strip()

        second = make_namespace(api, "ensure-granted-2", ENFORCE_LABELS, granted=True)
        create_pod(api, second, nodepods.pod("again", [nodepods.container("app", workload.image)]))
        nodepods.wait_running(api, second, "again")
    assert stored["spec"]["containers"][0]["image"] == image
    assert not stored["spec"].get("imagePullSecrets")
    assert any(CREDENTIAL in w for w in warnings), warnings
    after = by_node(registry.access_log("mirror"), workload)[before:]
    if ensures:
        assert nodepods.NO_CREDENTIAL in message, message
        # After the first pull the mirror only refused: `reuse` asked without credentials,
        # `again` started from the node's copy, its credential being the same.
        assert manifest_statuses(after) == {401}
    else:
        # The fallback: the Pod without the grant ran the mirror's image from the cache,
        # and neither it nor `again` asked the mirror anything.
        assert message == workload.greeting
        assert after == []
