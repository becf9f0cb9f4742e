"""A rollout of mirrorgate's Deployment on the node under an admission load: the held
Pods the load creates, and when a rollout is over (the availability and upgrade tests)."""

from __future__ import annotations

from kubernetes import client as k8s

from tests.e2e.harness import apiload
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.incluster import replicas, rolled_out
from tests.e2e.harness.kube import create_namespace, namespace_name
from tests.e2e.harness.node import Node
from tests.e2e.harness.suite import GRANTED_PREFIX

# Stored, never scheduled: the load measures admission, not the node.
HOLD = "mirrorgate.io/e2e-hold"


def held(name: str, image: str) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="c", image=image)],
            scheduling_gates=[k8s.V1PodSchedulingGate(name=HOLD)],
        ),
    )


def held_load(
    api: k8s.ApiClient, node: Node, hint: str, image: str, *, minimum_s: float
) -> apiload.Load:
    """16 creators at 20/s of Pods of ``image``, held, in a new opted-in, granted namespace."""
    namespace = create_namespace(api, f"{GRANTED_PREFIX}{namespace_name(hint)}", ENFORCE_LABELS)
    return apiload.Load(
        node.control_plane.api_client,
        namespace,
        lambda name: held(name, image),
        minimum_s=minimum_s,
    )


def old_replicas_stopped(api: k8s.ApiClient, image: str) -> str | None:
    """Every mirrorgate Pod not running ``image`` is gone or its container has ended
    (the Pod object may outlive it while the node tears its sandbox down)."""
    for replica in replicas(api, terminating=True):
        assert replica.spec is not None
        if replica.spec.containers[0].image == image:
            continue
        statuses = (replica.status.container_statuses if replica.status else None) or []
        if not statuses or any(s.state is None or s.state.terminated is None for s in statuses):
            return f"old replica {replica.metadata.name if replica.metadata else '?'} runs"
    return None


def deployment_done(api: k8s.ApiClient, image: str) -> str | None:
    deployment = k8s.AppsV1Api(api).read_namespaced_deployment("mirrorgate", mg.NAMESPACE)
    if deployment.spec.template.spec.containers[0].image != image:  # type: ignore[union-attr]
        return "not this image"
    return rolled_out(api)
