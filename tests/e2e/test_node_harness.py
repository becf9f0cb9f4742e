"""The node harness itself: a node changes the host, and stopping it undoes every change.

This test starts and stops a node of its own, so it runs before any other
test of the session (conftest moves it first), while no session node holds
the machine lock. The session's node is checked the same way when it stops:
its teardown fails the run if the host is left changed.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.e2e import nodepods
from tests.e2e.kube import create_namespace
from tests.e2e.node import start_node
from tests.e2e.nodehost import NodeLockError, machine_lock
from tests.e2e.nodepods import push_workload
from tests.e2e.registry import RegistryStack

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.node_selftest]


def test_stopped_node_leaves_the_host_as_it_found_it(registry: RegistryStack,
                                                     tmp_path_factory: pytest.TempPathFactory
                                                     ) -> None:
    workload = push_workload(registry, "node/self-test")
    node = start_node(tmp_path_factory.mktemp("node-self-test"), registry)
    try:
        with pytest.raises(NodeLockError, match="only one node"), machine_lock(timeout=0):
            pass  # held by the running node, even against this very process
        with node.control_plane.api_client() as api:
            namespace = create_namespace(api, "self-test")
            secret = nodepods.upstream_pull_secret(api, namespace, registry)
            k8s.CoreV1Api(api).create_namespaced_pod(namespace, nodepods.pod(
                "app", [nodepods.container("app", workload.image)], pull_secrets=[secret]))
            nodepods.wait_running(api, namespace, "app")
        # While a Pod runs, the check sees the node's marks on the host: it can fail.
        changed = node.host.leftovers()
    finally:
        node.stop()  # raises if anything is left
    kinds = {entry.split()[0] for entry in changed}
    assert {"sysctl", "iptables", "network", "cgroup", "mount"} <= kinds, changed
    assert node.host.leftovers() == []
    with machine_lock(timeout=0):
        pass  # released
