"""mirrorgate itself in the end-to-end suite: the real server process, registered for real.

The server runs as ``python -m mirrorgate.webhook.cli serve`` against the real API server
with the identity of its ServiceAccount (a client certificate for
``system:serviceaccount:mirrorgate:mirrorgate``), so the RBAC from
``manifests/base`` is what it gets. The MutatingWebhookConfiguration is the
one from ``manifests/base``, with only its Service reference swapped for the
test URL and caBundle.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import secrets
import ssl
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from mirrorgate import certs
from tests.e2e.harness import kube
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.procs import ManagedProcess, free_port, http_ok, wait_until
from tests.e2e.harness.standalone import serve_argv

NAMESPACE = "mirrorgate"
# The names of the two webhooks of manifests/base (and of the chart).
ENFORCE_WEBHOOK = "enforce.mirrorgate.io"
AUDIT_WEBHOOK = "audit.mirrorgate.io"
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:mirrorgate"
SERVICE_ACCOUNT_GROUPS: tuple[str, ...] = (
    "system:serviceaccounts",
    f"system:serviceaccounts:{NAMESPACE}",
)
CONFINEMENT_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
OWN_WEBHOOK_LABELS = (
    "e2e.mirrorgate.io/suite",
    "e2e.mirrorgate.io/failure",
    "e2e.mirrorgate.io/selfcerts",
)
"""Namespaces a test serves with a webhook configuration of its own carry one of these
(besides mirrorgate.io/mode, which mirrorgate itself checks); the session's configuration
leaves them out."""


def render(kustomize: Path, directory: str) -> list[dict[str, Any]]:
    """`kustomize build manifests/<directory>` as a list of objects."""
    output = subprocess.run(
        [str(kustomize), "build", str(REPO_ROOT / "manifests" / directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return [doc for doc in yaml.safe_load_all(output) if doc]


def webhook_configuration(
    kustomize: Path, kind: str = "MutatingWebhookConfiguration"
) -> dict[str, Any]:
    """manifests/base's Pod webhooks, or with ``kind`` ValidatingWebhookConfiguration the
    policy's validators."""
    (found,) = [d for d in render(kustomize, "base") if d["kind"] == kind]
    return found


def service_account(namespace: str) -> tuple[str, tuple[str, str]]:
    """The user and groups of the ServiceAccount ``mirrorgate`` in ``namespace``."""
    return (
        f"system:serviceaccount:{namespace}:mirrorgate",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
    )


WRITES_POLICY = "mirrorgate-writes"
RESERVED_POLICY = "mirrorgate-reserved-prefix"


def allow_reserved_names(api: k8s.ApiClient, user: str) -> None:
    """Let ``user`` (a test's own mirrorgate) create Secrets named mirrorgate-* too: what a
    second installation would patch into the ValidatingAdmissionPolicy's ``writers``.

    Returns once the API server enforces the new ``writers``: a changed policy reaches its
    admission cache a moment after the write, and a server started meanwhile would be
    refused its first Secret (and exit). That is observed through a probe user of this
    call's own, added in the same write and otherwise unknown to every policy."""
    admission = k8s.AdmissionregistrationV1Api(api)
    found = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        admission.read_validating_admission_policy(RESERVED_POLICY)
    )
    (index,) = [i for i, v in enumerate(found["spec"]["variables"]) if v["name"] == "writers"]
    writers = found["spec"]["variables"][index]["expression"]
    if f"'{user}'" in writers:
        return
    probe = f"e2e-reserved-probe-{secrets.token_hex(4)}"
    admission.patch_validating_admission_policy(
        RESERVED_POLICY,
        [
            {"op": "test", "path": f"/spec/variables/{index}/expression", "value": writers},
            {
                "op": "replace",
                "path": f"/spec/variables/{index}/expression",
                "value": writers.replace("]", f", '{user}', '{probe}']"),
            },
        ],
    )
    configuration = copy.copy(api.configuration)
    with k8s.ApiClient(configuration) as as_probe:
        as_probe.set_default_header("Impersonate-User", probe)
        as_probe.set_default_header("Impersonate-Group", "system:masters")
        wait_until(
            lambda: None if reserved_refused(as_probe, "default") == "allowed" else "refused",
            timeout=30,
            what=f"the reserved prefix allowing {user}",
            interval=0.1,
        )


def confine(api: k8s.ApiClient, user: str) -> None:
    """The session's mirrorgate-writes, for ``user`` too (another installation's copy of it,
    as a kustomize namespace override would make it), and the reserved names for it."""
    admission = k8s.AdmissionregistrationV1Api(api)
    found = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        admission.read_validating_admission_policy(WRITES_POLICY)
    )
    name = f"{WRITES_POLICY}-{user.rsplit(':', 2)[1]}"
    spec = found["spec"]
    spec["matchConditions"] = [
        {**c, "expression": c["expression"].replace(SERVICE_ACCOUNT_USER, user)}
        for c in spec["matchConditions"]
    ]
    policy = {"metadata": {"name": name}, "spec": spec}
    binding = {
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    admission.create_validating_admission_policy(policy)  # type: ignore[arg-type]
    admission.create_validating_admission_policy_binding(binding)  # type: ignore[arg-type]
    allow_reserved_names(api, user)


RESERVED_REFUSAL = "the name prefix mirrorgate- is reserved"


def reserved_refused(api: k8s.ApiClient, namespace: str) -> str | None:
    """None once an administrator's dry-run create of a mirrorgate-* Secret is refused."""
    probe = {"metadata": {"name": "mirrorgate-probe"}, "type": "Opaque"}
    try:
        k8s.CoreV1Api(api).create_namespaced_secret(
            namespace,
            probe,  # type: ignore[arg-type]
            dry_run="All",
        )
    except k8s.ApiException as error:
        return None if RESERVED_REFUSAL in str(error.body) else str(error.body)
    return "allowed"


def wait_reserved_in_force(api: k8s.ApiClient, namespace: str) -> None:
    """Wait until the reserved prefix's policy refuses a mirrorgate-* Secret in ``namespace``
    (a new policy or binding takes a moment to reach the API server's cache)."""
    wait_until(
        lambda: reserved_refused(api, namespace),
        timeout=30,
        what="the reserved prefix in force",
        interval=0.2,
    )


def made_before_install(api: k8s.ApiClient, namespace: str, secret: k8s.V1Secret) -> k8s.V1Secret:
    """Create ``secret`` (named mirrorgate-*) as though before mirrorgate was installed: the
    reserved prefix's binding goes meanwhile, and is back in force before this returns."""
    admission = k8s.AdmissionregistrationV1Api(api)
    binding = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
        admission.read_validating_admission_policy_binding(RESERVED_POLICY)
    )
    admission.delete_validating_admission_policy_binding(RESERVED_POLICY)
    made: list[k8s.V1Secret] = []

    def created() -> str | None:
        try:
            made.append(k8s.CoreV1Api(api).create_namespaced_secret(namespace, secret))
        except k8s.ApiException as error:
            if error.status == 403 and RESERVED_REFUSAL in str(error.body):
                return "still refused"  # the API server has not seen the binding go yet
            raise
        return None

    try:
        wait_until(created, timeout=30, what="the reserved prefix lifted", interval=0.1)
    finally:
        metadata = {
            k: binding["metadata"][k] for k in ("name", "labels") if k in binding["metadata"]
        }
        admission.create_validating_admission_policy_binding(
            {"metadata": metadata, "spec": binding["spec"]}  # type: ignore[arg-type]
        )
        wait_until(
            lambda: reserved_refused(api, namespace),
            timeout=30,
            what="the reserved prefix in force again",
            interval=0.1,
        )
    return made[0]


def installed_in(api: k8s.ApiClient, namespace: str) -> tuple[str, tuple[str, str]]:
    """manifests/base's RBAC for a mirrorgate installed in ``namespace`` (as a kustomize
    namespace override would make it): its ClusterRole and its Roles, bound to the
    ServiceAccount mirrorgate of ``namespace``; its user and groups. A copy of the base's
    ValidatingAdmissionPolicy confines it there as the base's confines the session's."""
    confine(api, service_account(namespace)[0])
    rbac = k8s.RbacAuthorizationV1Api(api)
    subject = {"kind": "ServiceAccount", "name": "mirrorgate", "namespace": namespace}
    kube.bind(rbac, f"mirrorgate-{namespace}", ("ClusterRole", "mirrorgate"), subject)
    for name in ("mirrorgate", "mirrorgate-leader"):
        role = copy.deepcopy(rbac.read_namespaced_role(name, NAMESPACE))
        rbac.create_namespaced_role(
            namespace,
            {  # type: ignore[arg-type]
                "metadata": {"name": name},
                "rules": api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
                    role.rules
                ),
            },
        )
        kube.bind(rbac, name, ("Role", name), subject, namespace=namespace)
    return service_account(namespace)


def install_base(api: k8s.ApiClient, kustomize: Path) -> None:
    """The policy kinds' CRDs, Namespace, ServiceAccount, RBAC and the
    ValidatingAdmissionPolicy confining its writes, from manifests/base: what the server
    runs with."""
    kinds = {
        "CustomResourceDefinition",
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        *CONFINEMENT_KINDS,
    }
    for obj in render(kustomize, "base"):
        if obj["kind"] in kinds:
            try:
                k8s_utils.create_from_dict(api, obj)  # type: ignore[no-untyped-call]
            except k8s_utils.FailToCreateError as error:
                if not all(e.status == 409 for e in error.api_exceptions):
                    raise


@dataclasses.dataclass
class Mirrorgate:
    """A running mirrorgate server."""

    url: str
    ca_pem: bytes
    ca_path: Path
    policy_path: Path
    process: ManagedProcess
    metrics_url: str | None = None
    """The metrics listener's, when the server has one (``client_ca``)."""

    def stop(self) -> None:
        self.process.stop()

    def logs(self) -> str:
        self.process.log_tail(1)  # flushes
        return self.process.log_path.read_text(errors="replace")

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=ssl.create_default_context(cafile=str(self.ca_path)),
            timeout=10,
        )


def start_mirrorgate(
    workdir: Path,
    plane: ControlPlane,
    *,
    policy: str | None,
    user: str = SERVICE_ACCOUNT_USER,
    groups: Sequence[str] = SERVICE_ACCOUNT_GROUPS,
    kubeconfig: Path | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    redact: Sequence[str] = (),
    ready: bool = True,
    tls_secret: str | None = None,
    health_probes: bool = False,
    client_ca: bool = False,
) -> Mirrorgate:
    """Start `mirrorgate serve`; with `tls_secret`, it manages its own certificates.

    Health probes are off unless asked for: the suite's policies name mirrors
    that do not exist (mirror.e2e.example), and tests reach nothing beyond
    loopback.

    In that mode the CA is the server's own, unknown until it has written the
    Secret: readiness is then checked without verification, and the caller
    verifies against the CA from the Secret.

    With ``client_ca`` the admission port accepts only the API server's webhook client
    certificate (``--client-ca``), and readiness is read on the metrics port.
    """
    serve, port, policy_path = serve_argv(workdir, policy, tls_secret=tls_secret)
    metrics_port = free_port() if client_ca else None
    if metrics_port is not None:
        serve += [
            "--client-ca",
            str(plane.webhook_client_ca),
            "--metrics-port",
            str(metrics_port),
        ]
    argv = [
        *serve,
        "--kubeconfig",
        str(kubeconfig or plane.kubeconfig_for(user, groups)),
        "--namespace",
        NAMESPACE,
        *([] if health_probes else ["--no-health-probes"]),
        *args,
    ]
    process = ManagedProcess(
        "mirrorgate", argv, workdir / "mirrorgate.log", env=env, cwd=REPO_ROOT, redact=redact
    )
    own_ca = b"" if tls_secret else (workdir / "tls" / certs.CA_CERT).read_bytes()
    server = Mirrorgate(
        url=f"https://127.0.0.1:{port}",
        ca_pem=own_ca,
        ca_path=workdir / "tls" / certs.CA_CERT,
        policy_path=policy_path,
        process=process,
        metrics_url=None if metrics_port is None else f"https://127.0.0.1:{metrics_port}",
    )
    if tls_secret is None:
        context = ssl.create_default_context(cafile=str(server.ca_path))
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE

    path = "/readyz" if ready else "/healthz"
    try:
        wait_until(
            lambda: http_ok(
                lambda: httpx.get(
                    f"{server.metrics_url or server.url}{path}", verify=context, timeout=2
                )
            ),
            timeout=30,
            what="mirrorgate ready",
            alive=process.exited,
        )
    except BaseException:
        process.stop()
        raise
    return server


class Endpoint(Protocol):
    """What registering needs of a server: where it listens, and its CA."""

    @property
    def url(self) -> str: ...

    @property
    def ca_pem(self) -> bytes: ...


def register(
    api: k8s.ApiClient,
    configuration: Mapping[str, Any],
    server: Endpoint,
    *,
    name: str = "mirrorgate",
    namespace_label: tuple[str, str] | None = None,
    excluded_labels: Sequence[str] = (),
    failure_policy: str | None = None,
) -> dict[str, Any]:
    """Create (or replace) the webhook configuration pointing at ``server``.

    Only the Service reference is swapped for the URL and caBundle; the
    optional arguments exist for the failure-policy scenarios, which register
    a second configuration of their own.
    """
    body = copy.deepcopy(dict(configuration))
    body["metadata"] = {**body["metadata"], "name": name}
    body["metadata"].pop("resourceVersion", None)
    for webhook in body["webhooks"]:
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {
            "url": f"{server.url}{path}",
            "caBundle": base64.b64encode(server.ca_pem).decode(),
        }
        selector = webhook.setdefault("namespaceSelector", {})
        expressions = selector.setdefault("matchExpressions", [])
        if namespace_label is not None:
            expressions.append(
                {"key": namespace_label[0], "operator": "In", "values": [namespace_label[1]]}
            )
        expressions += [{"key": key, "operator": "DoesNotExist"} for key in excluded_labels]
        if failure_policy is not None:
            webhook["failurePolicy"] = failure_policy
    admission = k8s.AdmissionregistrationV1Api(api)
    # The generated client takes plain dicts at run time; its annotations say models.
    kind = "validating" if body["kind"] == "ValidatingWebhookConfiguration" else "mutating"
    try:
        existing = getattr(admission, f"read_{kind}_webhook_configuration")(name)
    except k8s.ApiException as error:
        if error.status != 404:
            raise
        getattr(admission, f"create_{kind}_webhook_configuration")(body)
    else:
        assert existing.metadata is not None
        body["metadata"]["resourceVersion"] = existing.metadata.resource_version
        getattr(admission, f"replace_{kind}_webhook_configuration")(name, body)
    return body


def unregister(api: k8s.ApiClient, name: str) -> None:
    """Remove the webhook configurations named ``name``, of both kinds."""
    admission = k8s.AdmissionregistrationV1Api(api)
    for delete in (
        admission.delete_mutating_webhook_configuration,
        admission.delete_validating_webhook_configuration,
    ):
        try:
            delete(name)
        except k8s.ApiException as error:
            if error.status != 404:
                raise
