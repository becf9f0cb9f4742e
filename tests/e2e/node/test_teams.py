"""Two teams, one Harbor-like proxy source, a robot each: on a real node, with the
chart-installed image (issue 30's node scenarios).

The node's authenticated mirror (a pull-through cache of the upstream, as a Harbor proxy
project is) gets two more htpasswd users, a robot per team. A ClusterMirrorPolicy
defines each robot as a central credential granted to its team's namespace; each team
writes a MirrorPolicy in its namespace for the one source the Pods name (the upstream),
on the same mirror, with its robot. Each team's Pod is rewritten by its own rule, the
kubelet pulls with that team's robot, and the mirror's log says which user each pull
logged in as. A third namespace, with no MirrorPolicy, is unaffected: the cluster's rule
and the cluster's credential, as before. The replicas' probes log in with each team's
robot too (`mirrorgate_credential_valid`): a team's mirror and robot are probed like the
cluster's. One setup for the module, on the session's release.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness import nodepods
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.incluster import Release
from tests.e2e.harness.kube import create_namespace, namespace_name
from tests.e2e.harness.nodepods import Workload, push_workload
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import add_mirror_users
from tests.e2e.harness.suite import CREDENTIAL, GRANTED_PREFIX, central_credential

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.installed, pytest.mark.image]

GROUP, VERSION = policy.API_VERSION.split("/")
TEAMS = ("a", "b")
# distribution's text log (the mirror's, at debug): each request's handler lines carry the
# user it authenticated; logrus sorts the fields, so each is found on its own.
_URI = re.compile(r'\bhttp\.request\.uri="?(?P<uri>[^" ]+)')
_USER = re.compile(r'\bauth\.user\.name="?(?P<user>[^" ]+)')


@dataclass(frozen=True)
class Teams:
    namespaces: dict[str, str]
    """Each team's namespace, which holds its MirrorPolicy."""
    credentials: dict[str, str]
    """Each team's central credential (its robot's login at the mirror)."""
    users: dict[str, str]
    """Each team's robot: its username at the mirror."""
    plain: str
    """A third namespace, granted the cluster's credential, with no MirrorPolicy."""


def _accepted(api: k8s.ApiClient, namespace: str | None, name: str) -> str | None:
    """None once the leader says the object's current generation is Accepted."""
    custom = k8s.CustomObjectsApi(api)
    found: Any = (
        custom.get_cluster_custom_object(GROUP, VERSION, "clustermirrorpolicies", name)
        if namespace is None
        else custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "mirrorpolicies", name)
    )
    status = found.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    current = status.get("observedGeneration") == found["metadata"]["generation"]
    return None if current and conditions.get("Accepted") == "True" else f"{name}: {status}"


@pytest.fixture(scope="module")
def teams(node_installed: Release) -> Iterator[Teams]:
    registry = node_installed.registry
    suffix = secrets.token_hex(2)
    users = {t: f"robot-{t}-{suffix}" for t in TEAMS}
    passwords = {t: secrets.token_urlsafe(18) for t in TEAMS}
    add_mirror_users(registry, {users[t]: passwords[t] for t in TEAMS})
    credentials = {t: f"e2e-team-{t}-{suffix}" for t in TEAMS}
    grants = f"e2e-team-robots-{suffix}"
    with node_installed.control_plane.api_client() as api:
        custom = k8s.CustomObjectsApi(api)
        namespaces = {
            t: create_namespace(api, namespace_name(f"team-{t}"), ENFORCE_LABELS) for t in TEAMS
        }
        plain = create_namespace(api, f"{GRANTED_PREFIX}{namespace_name('plain')}", ENFORCE_LABELS)
        for team in TEAMS:
            central_credential(
                api,
                registry,
                name=credentials[team],
                username=users[team],
                password=passwords[team],
            )
        body = {
            "apiVersion": policy.API_VERSION,
            "kind": policy.CLUSTER_KIND,
            "metadata": {"name": grants},
            "spec": {
                "credentials": {credentials[t]: {"namespaces": [namespaces[t]]} for t in TEAMS}
            },
        }
        custom.create_cluster_custom_object(GROUP, VERSION, "clustermirrorpolicies", body)
        try:
            wait_until(
                functools.partial(_accepted, api, None, grants), timeout=60, what="the grants"
            )
            for team in TEAMS:
                rule = {
                    "source": registry.upstream_host,
                    "mirror": registry.host,
                    "credential": credentials[team],
                }
                custom.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespaces[team],
                    "mirrorpolicies",
                    {
                        "apiVersion": policy.API_VERSION,
                        "kind": policy.NAMESPACED_KIND,
                        "metadata": {"name": "harbor", "namespace": namespaces[team]},
                        "spec": {"mirrors": [rule]},
                    },
                )
            for team in TEAMS:
                wait_until(
                    functools.partial(_accepted, api, namespaces[team], "harbor"),
                    timeout=60,
                    what=f"team {team}'s MirrorPolicy",
                )
            yield Teams(namespaces, credentials, users, plain)
        finally:
            core = k8s.CoreV1Api(api)
            for name in (*namespaces.values(), plain):
                core.delete_namespace(name)
            custom.delete_cluster_custom_object(GROUP, VERSION, "clustermirrorpolicies", grants)
            for name in credentials.values():
                core.delete_namespaced_secret(name, mg.NAMESPACE)


def _users(text: str, repository: str) -> set[str]:
    """The users the mirror authenticated for requests of ``repository``, from its log."""
    found = set()
    for line in text.splitlines():
        uri, user = _URI.search(line), _USER.search(line)
        if uri and user and uri["uri"].startswith(f"/v2/{repository}/"):
            found.add(user["user"])
    return found


def _run(api: k8s.ApiClient, namespace: str, workload: Workload) -> dict[str, Any]:
    """A Pod naming ``workload`` as the team writes it (the upstream image), created, and
    running its process; the Pod as admitted."""
    name = f"p-{secrets.token_hex(3)}"
    created = k8s.CoreV1Api(api).create_namespaced_pod(
        namespace, nodepods.pod(name, [nodepods.container("hello", workload.image)])
    )
    admitted: dict[str, Any] = api.sanitize_for_serialization(created)  # type: ignore[no-untyped-call]
    nodepods.wait_running(api, namespace, name)
    assert nodepods.log(api, namespace, name, "hello").strip() == workload.greeting
    return admitted


def test_each_team_pulls_through_its_own_rule_with_its_own_robot(
    node_installed: Release, teams: Teams
) -> None:
    registry = node_installed.registry
    suffix = secrets.token_hex(2)
    workloads = {t: push_workload(registry, f"harbor-{suffix}/team-{t}") for t in TEAMS}
    with node_installed.control_plane.api_client() as api:
        for team in TEAMS:
            admitted = _run(api, teams.namespaces[team], workloads[team])
            (container,) = admitted["spec"]["containers"]
            assert container["image"] == (
                f"{registry.host}/{workloads[team].repository}:{workloads[team].tag}"
            )
            assert admitted["spec"]["imagePullSecrets"] == [
                {"name": f"mirrorgate-{teams.credentials[team]}"}
            ]
    log = registry.log_text("mirror")
    for team in TEAMS:
        assert _users(log, workloads[team].repository) == {teams.users[team]}, team


def test_a_namespace_without_a_mirror_policy_is_unaffected(
    node_installed: Release, teams: Teams
) -> None:
    """The third namespace keeps the cluster's rule and credential, and pulls as the
    cluster's user; no team robot is copied into it."""
    registry = node_installed.registry
    workload = push_workload(registry, f"harbor-{secrets.token_hex(2)}/plain")
    with node_installed.control_plane.api_client() as api:
        admitted = _run(api, teams.plain, workload)
        copies = {
            s.metadata.name
            for s in k8s.CoreV1Api(api).list_namespaced_secret(teams.plain).items
            if s.metadata is not None
        }
    assert admitted["spec"]["imagePullSecrets"] == [{"name": f"mirrorgate-{CREDENTIAL}"}]
    assert admitted["spec"]["containers"][0]["image"].startswith(f"{registry.host}/")
    assert _users(registry.log_text("mirror"), workload.repository) == {registry.username}
    assert not {f"mirrorgate-{c}" for c in teams.credentials.values()} & copies


def test_the_probes_log_in_with_each_team_s_robot(node_installed: Release, teams: Teams) -> None:
    """A robot only MirrorPolicies use is probed like the cluster's credentials, on the
    team's mirror, by every replica."""
    for team in TEAMS:
        node_installed.wait_gauge(
            "mirrorgate_credential_valid", 1.0, timeout=60, credential=teams.credentials[team]
        )
    assert max(node_installed.gauges("mirrorgate_mirror_hosts_unprobed")) == 0.0
