"""Mirror and credential health on the node cluster: the kubelet and containerd pull.

The same scenarios as tests/e2e/api/test_health.py, where "left as written" means the
Pod pulls from the upstream and runs, and "rewritten" means it pulls through the mirror,
or, with ``keep`` and the mirror down, fails to.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from tests.e2e.harness import nodepods
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.health import PATIENCE, Scenario, timed_stop
from tests.e2e.harness.incluster import Release, installed_policy
from tests.e2e.harness.kube import create_namespace, namespace_name
from tests.e2e.harness.nodepods import Workload, by_node, manifest_statuses, push_workload
from tests.e2e.harness.registry import set_mirror_password, start_mirror, stop_mirror
from tests.e2e.harness.suite import CREDENTIAL as NODE_CREDENTIAL
from tests.e2e.harness.suite import GRANTED_PREFIX

pytestmark = pytest.mark.e2e

RULE = "ClusterMirrorPolicy mirrorgate spec.mirrors[0]"
"""The rule as messages name it: the chart renders the policy as that ClusterMirrorPolicy."""


# On the node cluster: the same contract, with the kubelet and containerd pulling, against
# mirrorgate installed by its chart (`node_installed`): two replicas, each probing the
# node's own mirror (its private CA given through mirrorCA) on its own, so a state is
# waited for on both before a Pod depends on it. Its policy (tests/e2e/harness/incluster.py)
# sends the upstream to the mirror with onMirrorDown: fallback; `keep` is set by
# `helm upgrade` for its scenario.

NODE, INSTALLED, IMAGE = pytest.mark.node, pytest.mark.installed, pytest.mark.image


class NodeScenario(Scenario):
    """The session's release, the node's registries, and a granted, enforced namespace."""

    def __init__(self, api: k8s.ApiClient, release: Release, namespace: str) -> None:
        self.api, self.release, self.stack, self.namespace = (
            api,
            release,
            release.registry,
            namespace,
        )

    def gauge(self, name: str, **labels: str) -> float:
        found = self.release.gauges(name, **labels)
        assert len(set(found)) == 1, f"replicas differ on {name}{labels}: {found}"
        return found[0]

    def wait_gauge(self, name: str, value: float, **labels: str) -> None:
        self.release.wait_gauge(name, value, timeout=PATIENCE, **labels)


@pytest.fixture(scope="module")
def node_scenario(node_installed: Release) -> Iterator[NodeScenario]:
    with node_installed.control_plane.api_client() as api:
        namespace = create_namespace(
            api, f"{GRANTED_PREFIX}{namespace_name('health')}", ENFORCE_LABELS
        )
        # The user's own Secret for the upstream: what a Pod left as written pulls with.
        nodepods.upstream_pull_secret(api, namespace, node_installed.registry)
        running = NodeScenario(api, node_installed, namespace)
        running.wait_gauge("mirrorgate_mirror_up", 1.0, mirror=running.stack.host)
        running.wait_gauge("mirrorgate_credential_valid", 1.0, credential=NODE_CREDENTIAL)
        yield running


def node_pod(scenario: NodeScenario, hint: str) -> tuple[Workload, str, dict[str, Any], list[str]]:
    """A fresh workload on the upstream and a Pod of it (with the upstream Secret), created.

    Returns the workload, the Pod's name, the Pod as admitted, and the warnings.
    """
    workload = push_workload(scenario.stack, f"health/{hint}-{secrets.token_hex(3)}")
    name = f"{hint}-{secrets.token_hex(3)}"
    created, warnings = scenario.create(
        nodepods.pod(
            name,
            [nodepods.container("app", workload.image)],
            pull_secrets=[nodepods.UPSTREAM_SECRET],
        )
    )
    return workload, name, created, warnings


def runs(scenario: Scenario, name: str, workload: Workload) -> float:
    """Wait for the Pod to run and print its workload's line; returns the seconds it took."""
    started = time.monotonic()
    nodepods.wait_running(scenario.api, scenario.namespace, name)
    assert nodepods.log(scenario.api, scenario.namespace, name).strip() == workload.greeting
    return time.monotonic() - started


@NODE
@INSTALLED
@IMAGE
def test_node_mirror_stopped_pods_run_from_upstream_then_through_the_restarted_mirror(
    node_scenario: NodeScenario,
) -> None:
    """Down: a new Pod is left as written and the node pulls it from the upstream and runs it.

    Restarted: rewrites resume, and a new Pod pulls through the mirror and runs.
    """
    scenario, stack = node_scenario, node_scenario.stack
    began, stopping = timed_stop(stack)
    try:
        scenario.wait_gauge("mirrorgate_mirror_up", 0.0, mirror=stack.host)
        print(
            f"\nnode: both replicas saw the mirror down {time.monotonic() - began:.2f} s "
            f"after it began stopping (stopping took {stopping:.2f} s)"
        )
        down, name, created, warnings = node_pod(scenario, "down")
        assert created["spec"]["containers"][0]["image"] == down.image
        assert created["spec"]["imagePullSecrets"] == [{"name": nodepods.UPSTREAM_SECRET}]
        (warning,) = warnings
        assert warning.startswith(
            f"containers/app: image '{down.image}' left as written: "
            f"mirror {stack.host} of {RULE} is down: "
        )
        seconds = runs(scenario, name, down)
        print(f"node: Pod left as written running after {seconds:.2f} s")
    finally:
        start_mirror(stack)
    assert 200 in manifest_statuses(by_node(stack.access_log("upstream"), down))
    assert by_node(stack.access_log("mirror"), down) == []  # the mirror was down throughout

    restarted = time.monotonic()
    scenario.wait_gauge("mirrorgate_mirror_up", 1.0, mirror=stack.host)
    print(f"node: both replicas saw the mirror up after {time.monotonic() - restarted:.2f} s")
    up, name, created, warnings = node_pod(scenario, "up")
    assert created["spec"]["containers"][0]["image"] == f"{stack.host}/{up.repository}:{up.tag}"
    assert {"name": policy.pull_secret_name(NODE_CREDENTIAL)} in created["spec"]["imagePullSecrets"]
    assert warnings == []
    seconds = runs(scenario, name, up)
    print(f"node: rewritten Pod running after {seconds:.2f} s")
    assert 200 in manifest_statuses(by_node(stack.access_log("mirror"), up))
    assert by_node(stack.access_log("upstream"), up) == []  # the node went to the mirror only


@NODE
@INSTALLED
@IMAGE
def test_node_password_changed_at_the_mirror_pod_runs_from_upstream(
    node_scenario: NodeScenario,
) -> None:
    """credential_valid 0: the Pod is left as written, with a warning, and runs from upstream."""
    scenario, stack = node_scenario, node_scenario.stack
    scenario.wait_gauge("mirrorgate_credential_valid", 1.0, credential=NODE_CREDENTIAL)
    set_mirror_password(stack, secrets.token_urlsafe(18))
    try:
        scenario.wait_gauge("mirrorgate_credential_valid", 0.0, credential=NODE_CREDENTIAL)
        workload, name, created, warnings = node_pod(scenario, "password")
        assert created["spec"]["containers"][0]["image"] == workload.image
        assert warnings == [
            f"containers/app: image '{workload.image}' left as written: credential "
            f"'{NODE_CREDENTIAL}' of {RULE} cannot log in to mirror {stack.host}: login "
            "refused by /v2/ (HTTP 401) (onMirrorDown: fallback)"
        ]
        # Through the private CA given as mirrorCA: the mirror itself is up.
        assert scenario.gauge("mirrorgate_mirror_up", mirror=stack.host) == 1.0
        seconds = runs(scenario, name, workload)
        print(f"\nnode: Pod left as written (credential invalid) running after {seconds:.2f} s")
    finally:
        set_mirror_password(stack, stack.password)
    assert 200 in manifest_statuses(by_node(stack.access_log("upstream"), workload))
    assert by_node(stack.access_log("mirror"), workload) == []
    scenario.wait_gauge("mirrorgate_credential_valid", 1.0, credential=NODE_CREDENTIAL)


@NODE
@INSTALLED
@IMAGE
def test_node_keep_rewrites_while_the_mirror_is_down_and_the_pull_fails(
    node_scenario: NodeScenario,
) -> None:
    """keep: the Pod names the down mirror, so the node cannot pull it (what keep means)."""
    scenario, stack = node_scenario, node_scenario.stack
    # As an operator changes it: `helm upgrade`; the replicas reload the ConfigMap.
    keep = installed_policy(stack)
    keep["mirrors"][0]["onMirrorDown"] = "keep"
    scenario.release.set_policy(keep)
    stop_mirror(stack)
    try:
        scenario.wait_gauge("mirrorgate_mirror_up", 0.0, mirror=stack.host)
        workload, name, created, warnings = node_pod(scenario, "keep")
        mirrored = f"{stack.host}/{workload.repository}:{workload.tag}"
        assert created["spec"]["containers"][0]["image"] == mirrored
        (warning,) = warnings
        assert warning.startswith(
            f"containers/app: image '{workload.image}' rewritten "
            f"although mirror {stack.host} of {RULE} is down: "
        )
        message = nodepods.wait_pull_failure(scenario.api, scenario.namespace, name, "app")
        print(f"\nnode: keep, mirror down: pull failed: {message[:200]}")
    finally:
        start_mirror(stack)
        scenario.release.set_policy(installed_policy(stack))
    assert stack.host in message, message
    assert by_node(stack.access_log("upstream"), workload) == []  # no fallback on the node
    scenario.wait_gauge("mirrorgate_mirror_up", 1.0, mirror=stack.host)
