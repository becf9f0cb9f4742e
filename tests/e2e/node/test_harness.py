"""The node harness itself: a node changes the host, and stopping it undoes every change.

This test starts and stops a node of its own, so it runs before any other
test of the session (conftest moves it first), while no session node holds
the machine lock. The session's node is checked the same way when it stops:
its teardown fails the run if the host is left changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.e2e.harness import nodepods
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.kube import create_namespace
from tests.e2e.harness.node import start_node
from tests.e2e.harness.nodehost import (
    JOURNAL_PATH,
    HostState,
    NodeLockError,
    machine_lock,
    recover_unfinished,
)
from tests.e2e.harness.nodepods import push_workload

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.node_selftest]


def test_stopped_node_leaves_the_host_as_it_found_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    node = start_node(tmp_path_factory.mktemp("node-self-test"))
    try:
        registry = node.registry
        workload = push_workload(registry, "node/self-test")
        with pytest.raises(NodeLockError, match="only one node"), machine_lock(timeout=0):
            pass  # held by the running node, even against this very process
        with node.control_plane.api_client() as api:
            namespace = create_namespace(api, "self-test")
            secret = nodepods.upstream_pull_secret(api, namespace, registry)
            k8s.CoreV1Api(api).create_namespaced_pod(
                namespace,
                nodepods.pod(
                    "app", [nodepods.container("app", workload.image)], pull_secrets=[secret]
                ),
            )
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


def test_a_second_suite_waits_for_the_node_lock_then_says_who_holds_it() -> None:
    """Another process asking for the lock waits, then fails naming the holder's PID."""
    waiter = [
        sys.executable,
        "-c",
        "from tests.e2e.harness.nodehost import machine_lock\n"
        "with machine_lock(timeout=2):\n    pass\n",
    ]
    with machine_lock():
        refused = subprocess.run(waiter, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "waiting for" in refused.stdout  # it said so while it waited
    assert f"another e2e node (pid {os.getpid()})" in refused.stderr
    assert "only one node may run per machine" in refused.stderr
    # Released: the next one gets it at once.
    assert subprocess.run(waiter, cwd=REPO_ROOT, timeout=60, capture_output=True).returncode == 0


def test_a_node_killed_before_it_restored_the_host_is_undone_by_the_next(tmp_path: Path) -> None:
    """A run killed mid-node (SIGKILL, a session's end) leaves its journal: the next node,
    holding the lock, restores the host the killed one found before capturing its own."""
    chain = "MIRRORGATE-SELFTEST"
    with machine_lock(timeout=0):
        assert recover_unfinished() == []  # no journal: nothing to undo
        found = HostState.capture(tmp_path)
        found.journal()
        # What the killed node did: a chain of its own, a rule jumping to it.
        subprocess.run(["iptables", "-w", "5", "-N", chain], check=True)
        subprocess.run(["iptables", "-w", "5", "-A", "FORWARD", "-j", chain], check=True)
        try:
            undone = recover_unfinished()
        finally:
            subprocess.run(
                ["iptables", "-w", "5", "-D", "FORWARD", "-j", chain],
                check=False,
                capture_output=True,
            )
            subprocess.run(["iptables", "-w", "5", "-X", chain], check=False, capture_output=True)
        assert undone == [f"iptables -t filter chain {chain}"]
        assert (
            chain
            not in subprocess.run(
                ["iptables", "-w", "5", "-S"], check=True, capture_output=True, text=True
            ).stdout
        )
        assert not JOURNAL_PATH.exists()
        assert recover_unfinished() == []
