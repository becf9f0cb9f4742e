"""Pods on the real node: the test workload, waiting for Running or a failed pull, logs.

Reusable by every test on the node cluster (the scenarios, the Pod-start
benchmark, in-cluster tests). Every wait names the Pod's state on timeout.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from tests.e2e.harness import dockerconfig
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import Access, RegistryStack
from tests.e2e.harness.testimages import push_upstream, workload_image

RUNNING_TIMEOUT = 120.0
PULL_FAILED = frozenset({"ErrImagePull", "ImagePullBackOff"})
# containerd 2's words (transfer service) for a pull a registry refused for want of a
# credential: it asked (401) and the node had none to give.
NO_CREDENTIAL = "authorization failed: no basic auth credentials"
UPSTREAM_SECRET = "upstream-pull"
CONTAINERD = "containerd/"


@dataclass(frozen=True)
class Workload:
    """A test image on the upstream: what a Pod names, and the line it prints."""

    repository: str
    tag: str
    image: str
    greeting: str


def push_workload(registry: RegistryStack, repository: str, tag: str = "1") -> Workload:
    """Push a `hello` image of its own (its own digest) to the upstream as `repository:tag`."""
    greeting = f"hello from {repository}:{tag}"
    image = push_upstream(registry, repository, tag, workload_image(greeting))
    return Workload(repository=repository, tag=tag, image=image, greeting=greeting)


def by_node(log: list[Access], workload: Workload, *, agent: str = CONTAINERD) -> list[Access]:
    """The requests for `workload`'s repository that came from `agent`."""
    return [a for a in log if a.is_for(workload.repository) and a.agent.startswith(agent)]


def manifest_statuses(log: list[Access]) -> set[int]:
    return {a.status for a in log if "/manifests/" in a.path}


def container(
    name: str,
    image: str,
    *,
    once: bool = False,
    listen: bool = False,
    started_at: bool = False,
    pull_policy: str = "IfNotPresent",
) -> k8s.V1Container:
    env = []
    if started_at:  # first line: started_at_unix_ns=N (see images/hello/main.go)
        env.append(k8s.V1EnvVar(name="STARTED_AT", value="1"))
    if once:
        env.append(k8s.V1EnvVar(name="ONCE", value="1"))  # print and exit: an initContainer
    if listen:
        env.append(k8s.V1EnvVar(name="LISTEN", value=":8080"))
    return k8s.V1Container(name=name, image=image, env=env or None, image_pull_policy=pull_policy)


def pod(
    name: str,
    containers: Sequence[k8s.V1Container],
    *,
    init_containers: Sequence[k8s.V1Container] = (),
    pull_secrets: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    service_account: str | None = None,
) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=dict(labels or {}) or None),
        spec=k8s.V1PodSpec(
            service_account_name=service_account,
            containers=list(containers),
            init_containers=list(init_containers) or None,
            image_pull_secrets=[k8s.V1LocalObjectReference(name=s) for s in pull_secrets] or None,
            # The workload exits on SIGTERM; no reason to wait 30 s at deletion.
            termination_grace_period_seconds=2,
        ),
    )


def create_pull_secret(
    api: k8s.ApiClient, namespace: str, name: str, host: str, username: str, password: str
) -> str:
    """A user's own `kubernetes.io/dockerconfigjson` Secret for `host` (not mirrorgate's)."""
    payload = json.dumps(dockerconfig.encode(host, username, password)).encode()
    k8s.CoreV1Api(api).create_namespaced_secret(
        namespace,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name=name),
            type="kubernetes.io/dockerconfigjson",
            data={".dockerconfigjson": base64.b64encode(payload).decode()},
        ),
    )
    return name


def upstream_pull_secret(api: k8s.ApiClient, namespace: str, registry: RegistryStack) -> str:
    """The Secret a Pod needs to pull from the (authenticated) upstream directly."""
    return create_pull_secret(
        api,
        namespace,
        UPSTREAM_SECRET,
        registry.upstream_host,
        registry.upstream_username,
        registry.upstream_password,
    )


def read(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    found = k8s.CoreV1Api(api).read_namespaced_pod(name, namespace)
    result: dict[str, Any] = api.sanitize_for_serialization(found)  # type: ignore[no-untyped-call]
    return result


def _statuses(stored: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = stored.get("status", {})
    return [
        *status.get("initContainerStatuses", []),
        *status.get("containerStatuses", []),
        *status.get("ephemeralContainerStatuses", []),
    ]


def describe(stored: Mapping[str, Any]) -> str:
    """Phase and each container's state: enough to tell a pull failure from a crash."""
    parts = [f"phase={stored.get('status', {}).get('phase')}"]
    for status in _statuses(stored):
        parts.append(f"{status['name']}: {json.dumps(status.get('state'))}")
    return "; ".join(parts)


def wait_running(
    api: k8s.ApiClient, namespace: str, name: str, timeout: float = RUNNING_TIMEOUT
) -> dict[str, Any]:
    """Wait until the Pod is Running with every container started; returns the Pod."""
    seen: dict[str, Any] = {}

    def running() -> str | None:
        seen.update(read(api, namespace, name))
        statuses = seen.get("status", {}).get("containerStatuses", [])
        if (
            seen["status"].get("phase") == "Running"
            and statuses
            and all("running" in s.get("state", {}) for s in statuses)
        ):
            return None
        return describe(seen)

    wait_until(running, timeout=timeout, what=f"Pod {namespace}/{name} Running", interval=0.2)
    return seen


def wait_pull_failure(
    api: k8s.ApiClient, namespace: str, name: str, container: str, timeout: float = RUNNING_TIMEOUT
) -> str:
    """Wait until `container` waits on a failed pull; returns the kubelet's message."""
    message: list[str] = []

    def failed() -> str | None:
        stored = read(api, namespace, name)
        for status in _statuses(stored):
            waiting = status.get("state", {}).get("waiting") or {}
            if status["name"] == container and waiting.get("reason") in PULL_FAILED:
                message.append(waiting.get("message", ""))
                return None
            if status["name"] == container and "running" in status.get("state", {}):
                raise AssertionError(
                    f"{namespace}/{name}: {container} is running, expected a failed pull"
                )
        return describe(stored)

    wait_until(failed, timeout=timeout, what=f"a failed pull in {namespace}/{name}", interval=0.2)
    return message[-1]


def log(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    container: str | None = None,
    timeout: float = 30.0,
) -> str:
    """The container's log through the API server (which fetches it from the kubelet).

    Waits for a first line: a container reported running may not have written yet.
    """
    text: list[str] = [""]

    def written() -> str | None:
        text[0] = k8s.CoreV1Api(api).read_namespaced_pod_log(name, namespace, container=container)
        return None if text[0].strip() else "empty log"

    wait_until(
        written, timeout=timeout, what=f"log of {namespace}/{name} {container or ''}", interval=0.2
    )
    return text[0]


def events(api: k8s.ApiClient, namespace: str, name: str) -> list[str]:
    """The Pod's events (reason: message), oldest first: the kubelet's account of a pull."""
    found = (
        k8s.CoreV1Api(api)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        .items
    )
    found.sort(key=lambda e: e.last_timestamp or e.event_time or 0)
    return [f"{e.reason}: {e.message}" for e in found]


def run_deployment(
    api: k8s.ApiClient, namespace: str, workload: Workload, replicas: int = 2
) -> tuple[list[dict[str, Any]], list[str]]:
    """A Deployment `hello` of `workload`: waits for its Pods to run; returns them
    as stored, and each one's log (the controllers make the Pods, not the test)."""
    labels = {"app": "hello"}
    k8s.AppsV1Api(api).create_namespaced_deployment(
        namespace,
        k8s.V1Deployment(
            metadata=k8s.V1ObjectMeta(name="hello"),
            spec=k8s.V1DeploymentSpec(
                replicas=replicas,
                selector=k8s.V1LabelSelector(match_labels=labels),
                template=k8s.V1PodTemplateSpec(
                    metadata=k8s.V1ObjectMeta(labels=labels),
                    spec=pod("x", [container("hello", workload.image)]).spec,
                ),
            ),
        ),
    )
    core = k8s.CoreV1Api(api)

    def names() -> list[str]:
        return sorted(
            str(p.metadata.name)
            for p in core.list_namespaced_pod(namespace, label_selector="app=hello").items
            if p.metadata
        )

    wait_until(
        lambda: None if len(names()) == replicas else f"{len(names())} Pods",
        timeout=60,
        what=f"the Deployment's {replicas} Pods",
        interval=0.2,
    )
    pods = [wait_running(api, namespace, name) for name in names()]
    return pods, [log(api, namespace, name) for name in names()]
