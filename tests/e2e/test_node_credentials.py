"""Path-scoped, short-lived logins on a real node: the kubelet picks each project's robot.

The node cluster's registry has two robots, each allowed to pull only its own
project; their 15-second logins come from the real Go plugin through a
mirrorgate of this module's own (see test_credential_providers.py). One Pod
runs an image of each project: the real kubelet sends each pull the login of
the most specific key, and containerd pulls with it. A new Pod after each
refresh runs again with the new logins, and one robot's login does not pull
the other's project.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from tests.e2e import nodepods
from tests.e2e.conftest import Installed
from tests.e2e.fixtures_secrets import read_secret
from tests.e2e.kube import create_namespace, namespace_name
from tests.e2e.nodepods import push_workload
from tests.e2e.provider_setup import (
    TEAMS,
    Setup,
    create_pod,
    password_of,
    provider_setup,
    published_login,
    source,
    wait_published,
)

pytestmark = [pytest.mark.e2e, pytest.mark.node]


@pytest.fixture(scope="module")
def node_setup(node_installed: Installed,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with provider_setup(node_installed, tmp_path_factory.mktemp("node-providers")) as found:
        yield found


def test_the_kubelet_pulls_each_project_with_its_own_robot_across_refreshes(
        node_setup: Setup) -> None:
    setup = node_setup
    registry = setup.registry
    up = registry.upstream_host
    with setup.installed.control_plane.api_client() as api:
        for round_ in range(2):
            workloads = {t: push_workload(registry, f"{t}/hello", f"r{round_}") for t in TEAMS}
            before = {t: password_of(wait_published(api, setup, t)) for t in TEAMS}
            pod, warnings = create_pod(api, setup.namespace,
                                    [f"{source(t)}/hello:r{round_}" for t in TEAMS])
            assert warnings == []
            assert [c["image"] for c in pod["spec"]["containers"]] == \
                [workloads[t].image for t in TEAMS]
            assert [s["name"] for s in pod["spec"]["imagePullSecrets"]] == \
                [f"mirrorgate-{t}" for t in TEAMS]
            name = pod["metadata"]["name"]
            nodepods.wait_running(api, setup.namespace, name)
            containers = [c["name"] for c in pod["spec"]["containers"]]
            logs = [nodepods.log(api, setup.namespace, name, c).strip() for c in containers]
            assert logs == [workloads[t].greeting for t in TEAMS]
            for team in TEAMS:
                wait_published(api, setup, team, not_password=before[team])

        # One robot's login, alone, for the other project: the node is refused.
        other = create_namespace(api, namespace_name("robot-a-only"))
        published = published_login(api, setup, "team-a")
        assert published is not None
        k8s.CoreV1Api(api).create_namespaced_secret(other, k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name="robot-a"), type="kubernetes.io/dockerconfigjson",
            data=published["data"]))
        stranger = push_workload(registry, "team-b/hello", f"n{secrets.token_hex(2)}")
        own = push_workload(registry, "team-a/hello", f"n{secrets.token_hex(2)}")
        for name, workload in (("refused", stranger), ("allowed", own)):
            k8s.CoreV1Api(api).create_namespaced_pod(other, nodepods.pod(
                name, [nodepods.container("hello", workload.image)], pull_secrets=["robot-a"]))
        message = nodepods.wait_pull_failure(api, other, "refused", "hello")
        nodepods.wait_running(api, other, "allowed")
        copy = read_secret(api, setup.namespace, "mirrorgate-team-a")
    assert copy is not None
    assert stranger.image.startswith(f"{up}/team-b/")
    assert message  # the kubelet's own words for the refused pull
