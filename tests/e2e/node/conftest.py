"""The node's fixtures (need `@pytest.mark.node`, which implies `e2e`; started only when used):
node_cluster    session  Node: a separate cluster with a real kubelet, containerd,
                         controller-manager and scheduler (see tests/e2e/harness/node.py)
node_installed  session  Release: mirrorgate installed on the node cluster from its
                         image with `helm install` (tests/e2e/harness/incluster.py), with
                         the policy of `node_policy` (granted namespaces: `granted-*`);
                         needs `@pytest.mark.image` too
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness.components import FIGURES, TIMINGS, running
from tests.e2e.harness.incluster import Release, installed_release
from tests.e2e.harness.node import Node, start_node


@pytest.fixture(scope="session")
def node_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    """A one-node cluster of its own (kubelet, containerd, controllers, registries on its
    bridge), under the machine lock.

    Its teardown fails the session if the host is left changed (sysctls,
    iptables chains, cgroups, mounts, network namespaces, fixed paths).
    """
    with running(request.config, start_node, tmp_path_factory.mktemp("node")) as node:
        request.config.stash.setdefault(TIMINGS, {}).update(
            {
                **{f"node_{k}": v for k, v in node.control_plane.timings.items()},
                **{f"node_{k}": v for k, v in node.timings.items()},
            }
        )
        # Printed as "node runtime: containerd vX.Y.Z" under "e2e figures".
        request.config.stash.setdefault(FIGURES, {})["node runtime"] = (
            f"containerd {node.runtime.version}"
        )
        yield node


@pytest.fixture(scope="session")
def node_installed(
    node_cluster: Node, helm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    """mirrorgate installed on the node cluster from its image by `helm install` of its chart
    (tests/e2e/harness/incluster.py): the policy of `node_policy`, probes on, enforce."""
    with installed_release(node_cluster, helm, tmp_path_factory.mktemp("node-release")) as found:
        yield found
