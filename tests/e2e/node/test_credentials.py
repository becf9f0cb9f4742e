"""Path-scoped, short-lived logins on a real node: the kubelet picks each project's robot.

The node cluster's registry has two robots, each allowed to pull only its own
project; their 15-second logins come from the real Go plugin, which reaches
the installed replicas as users deliver plugins: an image of theirs, copied
into the replicas' plugin directory by the chart's credentialProviders
initContainer (tests/e2e/harness/incluster.py). One Pod
runs an image of each project: the real kubelet sends each pull the login of
the most specific key, and containerd pulls with it. A new Pod after each
refresh runs again with the new logins, and one robot's login does not pull
the other's project.
"""

from __future__ import annotations

import re
import secrets

import pytest
from kubernetes import client as k8s

from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness import nodepods
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS, read_secret
from tests.e2e.harness.incluster import PROVIDERS_REPOSITORY, Release
from tests.e2e.harness.kube import create_namespace, namespace_name
from tests.e2e.harness.nodepods import push_workload
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.provider_setup import (
    TEAMS,
    create_pod,
    password_of,
    published_login,
    source,
    wait_published,
)
from tests.e2e.harness.suite import GRANTED_PREFIX

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.installed, pytest.mark.image]


def test_the_kubelet_pulls_each_project_with_its_own_robot_across_refreshes(
    node_installed: Release,
) -> None:
    registry = node_installed.registry
    up = registry.upstream_host
    with node_installed.control_plane.api_client() as api:
        # The plugins came from the image the values name, through the initContainer.
        deployment = api.sanitize_for_serialization(
            k8s.AppsV1Api(api).read_namespaced_deployment("mirrorgate", mg.NAMESPACE)
        )
        [copier] = [
            c
            for c in deployment["spec"]["template"]["spec"]["initContainers"]
            if c["name"] == "credential-providers"
        ]
        assert (copier["name"], copier["image"].partition("@")[0]) == (
            "credential-providers",
            f"{up}/{PROVIDERS_REPOSITORY}:1",
        )
        assert copier["image"].partition("@")[2].startswith("sha256:")
        namespace = create_namespace(
            api, f"{GRANTED_PREFIX}{namespace_name('providers')}", ENFORCE_LABELS
        )
        for round_ in range(2):
            workloads = {t: push_workload(registry, f"{t}/hello", f"r{round_}") for t in TEAMS}
            before = {t: password_of(wait_published(api, mg.NAMESPACE, t)) for t in TEAMS}
            if round_ == 0:  # the other replica's store has each published login, too
                for team in TEAMS:
                    node_installed.wait_gauge(
                        "mirrorgate_credential_valid", 1.0, timeout=60, credential=team
                    )
            pod, warnings = create_pod(
                api, namespace, [f"{source(t)}/hello:r{round_}" for t in TEAMS]
            )
            assert warnings == []
            assert [c["image"] for c in pod["spec"]["containers"]] == [
                workloads[t].image for t in TEAMS
            ]
            assert [s["name"] for s in pod["spec"]["imagePullSecrets"]] == [
                f"mirrorgate-{t}" for t in TEAMS
            ]
            name = pod["metadata"]["name"]
            nodepods.wait_running(api, namespace, name)
            containers = [c["name"] for c in pod["spec"]["containers"]]
            logs = [nodepods.log(api, namespace, name, c).strip() for c in containers]
            assert logs == [workloads[t].greeting for t in TEAMS]
            for team in TEAMS:
                wait_published(api, mg.NAMESPACE, team, not_password=before[team])

        # One robot's login, alone, for the other project: the node is refused.
        other = create_namespace(api, namespace_name("robot-a-only"))
        published = published_login(api, mg.NAMESPACE, "team-a")
        assert published is not None
        k8s.CoreV1Api(api).create_namespaced_secret(
            other,
            k8s.V1Secret(
                metadata=k8s.V1ObjectMeta(name="robot-a"),
                type="kubernetes.io/dockerconfigjson",
                data=published["data"],
            ),
        )
        stranger = push_workload(registry, "team-b/hello", f"n{secrets.token_hex(2)}")
        own = push_workload(registry, "team-a/hello", f"n{secrets.token_hex(2)}")
        for name, workload in (("refused", stranger), ("allowed", own)):
            k8s.CoreV1Api(api).create_namespaced_pod(
                other,
                nodepods.pod(
                    name, [nodepods.container("hello", workload.image)], pull_secrets=["robot-a"]
                ),
            )
        message = nodepods.wait_pull_failure(api, other, "refused", "hello")
        nodepods.wait_running(api, other, "allowed")
        copy = read_secret(api, namespace, "mirrorgate-team-a")
    assert copy is not None
    assert stranger.image.startswith(f"{up}/team-b/")
    assert message  # the kubelet's own words for the refused pull


def test_the_plugins_run_in_the_plugin_host_without_mirrorgates_identity(
    node_installed: Release,
) -> None:
    """Each run of the test plugin (--report) says what it sees: in the chart's plugin
    host, no ServiceAccount token file and no KUBERNETES_ variable, though the replicas
    themselves reach the API with both (extraEnv sets KUBERNETES_SERVICE_HOST for them)."""

    def reports() -> list[str]:
        return [
            e["stderr"]
            for e in node_installed.log_entries()
            if e.get("msg") == "credential provider said" and "report:" in e.get("stderr", "")
        ]

    wait_until(lambda: None if reports() else "no run reported yet", timeout=60, what="a report")
    for said in reports():
        match = re.search(r"report: env=(\S*) token=(\S+)", said)
        assert match, said
        names = match.group(1).split(",")
        assert match.group(2) == "absent", said
        assert not [n for n in names if n.startswith(("KUBERNETES_", "MIRRORGATE_STORE"))], said
        assert {"TOKEN_URL", "CA_FILE", "SSL_CERT_FILE"} <= set(names), said
    with node_installed.control_plane.api_client() as api:
        deployment = api.sanitize_for_serialization(
            k8s.AppsV1Api(api).read_namespaced_deployment("mirrorgate", mg.NAMESPACE)
        )
    spec = deployment["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    [host] = [c for c in spec["initContainers"] if c["name"] == "plugin-host"]
    assert "kube-api-access" not in {m["name"] for m in host["volumeMounts"]}
