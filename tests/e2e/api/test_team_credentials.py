"""One source, one robot per team, on the real API server (issue 30, item 2).

A rule's ``credential`` lists two central credentials for the suite's
authenticated mirror; each team's namespace is granted one. A Pod gets the
copy of its own team's robot, and no namespace ever holds the other team's;
when a team's grant is withdrawn the leader's reconciler deletes its copy and
leaves the other team's alone. The session server holds the Lease, so its
policy file is rewritten (and restored afterwards), as in test_pull_secrets.
"""

from __future__ import annotations

import contextlib

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import (
    ENFORCE_LABELS,
    identity_pid,
    labels_of,
    lease_holder,
    list_secrets,
    pod_dict,
    read_secret,
    rewrite_policy,
)
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import Installed, MakeNamespace, central_credential

pytestmark = pytest.mark.e2e

ROBOTS = ("e2e-robot-a", "e2e-robot-b")
CONVERGE = 30.0


def _generated(api: k8s.ApiClient, namespace: str) -> list[str]:
    """The names of the pull secrets mirrorgate made in ``namespace``."""
    return sorted(
        s["metadata"]["name"]
        for s in list_secrets(api, namespace)
        if s["metadata"]["name"].startswith(policy.PULL_SECRET_PREFIX)
    )


def test_each_team_pulls_with_its_own_robot_and_only_its_copy_exists(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    registry = installed.registry
    original = installed.server.policy_path.read_text()
    with installed.control_plane.api_client() as api:
        assert identity_pid(lease_holder(api)) == installed.server.process.pid
        team_a, team_b = make_namespace(ENFORCE_LABELS), make_namespace(ENFORCE_LABELS)
        teams = (
            f"mirrors:\n"
            f"  - source: {registry.upstream_host}\n"
            f"    mirror: {registry.host}\n"
            f"    credential: [{ROBOTS[0]}, {ROBOTS[1]}]\n"
            f"credentials:\n"
            f"  {ROBOTS[0]}: {{namespaces: [{team_a}]}}\n"
            f"  {ROBOTS[1]}: {{namespaces: [{team_b}]}}\n"
        )
        for robot in ROBOTS:
            central_credential(api, registry, name=robot)
        try:
            rewrite_policy(installed.server, teams)
            stored = {
                namespace: kube.create_pod(
                    api, namespace, pod_dict("web", registry.upstream_image)
                )[0]
                for namespace in (team_a, team_b)
            }
            copies = {namespace: _generated(api, namespace) for namespace in (team_a, team_b)}
            labels = labels_of(read_secret(api, team_b, policy.pull_secret_name(ROBOTS[1])))
            # Team b's grant withdrawn: its copy goes, team a's stays.
            rewrite_policy(installed.server, teams.replace(f"[{team_b}]", "[e2e-nobody]"))
            wait_until(
                lambda: (
                    None
                    if read_secret(api, team_b, policy.pull_secret_name(ROBOTS[1])) is None
                    else "team b's copy still exists"
                ),
                timeout=CONVERGE,
                what="the withdrawn team's copy deleted",
                interval=0.1,
            )
            after = {namespace: _generated(api, namespace) for namespace in (team_a, team_b)}
        finally:
            rewrite_policy(installed.server, original)
            core = k8s.CoreV1Api(api)
            for robot in ROBOTS:
                with contextlib.suppress(k8s.ApiException):
                    core.delete_namespaced_secret(robot, mg.NAMESPACE)
    for namespace, robot in ((team_a, ROBOTS[0]), (team_b, ROBOTS[1])):
        spec = stored[namespace]["spec"]
        assert spec["containers"][0]["image"].startswith(registry.host + "/")
        assert spec["imagePullSecrets"] == [{"name": policy.pull_secret_name(robot)}]
        assert copies[namespace] == [policy.pull_secret_name(robot)]
    assert labels["mirrorgate.io/credential"] == ROBOTS[1]
    assert after == {team_a: [policy.pull_secret_name(ROBOTS[0])], team_b: []}
