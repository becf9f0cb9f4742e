"""What the session fixtures install: the suite's policy and credential, and mirrorgate
registered against a control plane."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.registry import RegistryStack

MakeNamespace = Callable[..., str]

CREDENTIAL = "e2e-mirror"
RECONCILE_INTERVAL = 5.0
"""The session server's --reconcile-interval (seconds)."""
DOCKERHUB_MIRROR = "mirror.e2e.example/dockerhub"


def e2e_policy(registry: RegistryStack, *, extra: str = "") -> str:
    """The suite's policy: the test upstream goes to the authenticated mirror."""
    return (
        f"mirrors:\n"
        f"  - source: {registry.upstream_host}\n"
        f"    mirror: {registry.host}\n"
        f"    credential: {CREDENTIAL}\n"
        f"  - source: docker.io\n"
        f"    mirror: {DOCKERHUB_MIRROR}\n"
        f"credentials:\n"
        f"  {CREDENTIAL}: {{namespaces: ['*']}}\n{extra}"
    )


def central_credential(
    api: k8s.ApiClient,
    registry: RegistryStack,
    *,
    name: str = CREDENTIAL,
    password: str | None = None,
    host: str | None = None,
    username: str | None = None,
) -> None:
    """What `kubectl create secret docker-registry NAME ... -n mirrorgate` makes (or updates),
    labelled as a central credential (`mirrorgate.io/credential=true`).

    ``host`` is the `--docker-server` (default: the registry's mirror); ``username`` and
    ``password`` the login (default: the mirror's own user).
    """
    payload = json.dumps(
        registry.dockerconfigjson(username=username, password=password, host=host)
    ).encode()
    body = k8s.V1Secret(
        metadata=k8s.V1ObjectMeta(
            name=name, namespace=mg.NAMESPACE, labels={"mirrorgate.io/credential": "true"}
        ),
        type="kubernetes.io/dockerconfigjson",
        data={".dockerconfigjson": base64.b64encode(payload).decode()},
    )
    core = k8s.CoreV1Api(api)
    try:
        core.create_namespaced_secret(mg.NAMESPACE, body)
    except k8s.ApiException as error:
        if error.status != 409:
            raise
        core.replace_namespaced_secret(name, mg.NAMESPACE, body)


@dataclass
class Installed:
    """mirrorgate running against the control plane, registered through the base manifests."""

    server: mg.Mirrorgate
    configuration: dict[str, Any]
    """The Pod webhooks (manifests/base's MutatingWebhookConfiguration)."""
    registry: RegistryStack
    control_plane: ControlPlane
    validators: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The policy's validators (manifests/base's ValidatingWebhookConfiguration)."""


def pod(
    installed: Installed, *, name: str = "web", labels: dict[str, str] | None = None
) -> k8s.V1Pod:
    """A Pod with an image on the test upstream (needs the credential) and a Docker Hub one."""
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels),
        spec=k8s.V1PodSpec(
            init_containers=[k8s.V1Container(name="init", image="busybox:1.36")],
            containers=[
                k8s.V1Container(name="app", image=installed.registry.upstream_image),
                k8s.V1Container(name="sidecar", image="docker.io/library/nginx:1.27"),
            ],
        ),
    )


@contextlib.contextmanager
def install_mirrorgate(
    control_plane: ControlPlane,
    registry: RegistryStack,
    kustomize: Path,
    workdir: Path,
    policy: str,
) -> Iterator[Installed]:
    """mirrorgate with the kubernetes credential store and the RBAC of manifests/base."""
    with control_plane.api_client() as api:
        mg.install_base(api, kustomize)
        central_credential(api, registry)
        # A short reconcile interval: a deleted copy is re-asserted within it.
        server = mg.start_mirrorgate(
            workdir,
            control_plane,
            policy=policy,
            args=["--store", "kubernetes", "--reconcile-interval", str(RECONCILE_INTERVAL)],
            redact=[registry.password],
        )
        configuration = mg.webhook_configuration(kustomize)
        mg.register(api, configuration, server, excluded_labels=mg.OWN_WEBHOOK_LABELS)
        validators = mg.webhook_configuration(kustomize, "ValidatingWebhookConfiguration")
        mg.register(api, validators, server, excluded_labels=mg.OWN_WEBHOOK_LABELS)
        try:
            yield Installed(
                server=server,
                configuration=configuration,
                registry=registry,
                control_plane=control_plane,
                validators=validators,
            )
        finally:
            mg.unregister(api, "mirrorgate")
            server.stop()


GRANTED_PREFIX = "granted-"


def node_policy(registry: RegistryStack) -> str:
    """The node cluster's policy: the mirror's credential only for `granted-*` namespaces."""
    return (
        f"mirrors:\n"
        f"  - source: {registry.upstream_host}\n"
        f"    mirror: {registry.host}\n"
        f"    credential: {CREDENTIAL}\n"
        f"credentials:\n"
        f"  {CREDENTIAL}: {{namespaces: ['{GRANTED_PREFIX}*']}}\n"
    )
