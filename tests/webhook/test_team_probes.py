"""The probes cover the mirrors of MirrorPolicies, not only the cluster's, within a cap.

A team's rule on a mirror no cluster rule uses must be probed, or ``health`` (failover,
falling back to the original while the mirror is down) could not work for it. Tenants
write MirrorPolicies, so the hosts they add are capped, taken in turn from each
namespace, and what is past the cap is said (log, /readyz, a gauge).
"""

from __future__ import annotations

import json
import socket
from io import StringIO
from pathlib import Path
from typing import Any

from mirrorgate import policy
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.mirrorhealth import monitor, targets
from tests.webhook import reviews, scrape
from tests.webhook.test_probes import answer, https_server


def _closed_port() -> str:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port: int = closed.getsockname()[1]
    return f"127.0.0.1:{port}"


def _object(kind: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "rules"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": policy.API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def compose(cluster: dict[str, Any], teams: dict[str, list[dict[str, Any]]]) -> policy.Composition:
    """The cluster's spec and each namespace's MirrorPolicy rules, composed (all accepted)."""
    documents = [
        _object(policy.CLUSTER_KIND, cluster),
        *(_object(policy.NAMESPACED_KIND, {"mirrors": m}, ns) for ns, m in teams.items()),
    ]
    composition = policy.compose([policy.parse_object(d) for d in documents])
    assert not composition.refused, composition.refused
    return composition


def _monitor(
    composition: policy.Composition, metrics: Metrics, *, teams: bool = True, **kwargs: Any
) -> monitor.HealthMonitor:
    """The server's monitor: the cluster's policy, and (``teams``) the namespaces' rules."""
    return monitor.HealthMonitor(
        mirror_policy=lambda: composition.cluster,
        team_rules=(lambda: composition.team_rules) if teams else None,
        credentials=None,
        publish=lambda _: None,
        metrics=metrics,
        **kwargs,
    )


def test_a_team_mirror_that_is_down_makes_its_rule_fall_back(tmp_path: Path) -> None:
    """The cluster's mirror up, a team's own mirror a closed port: the team's Pods are left
    as written while it is down; without the team's rules the probes never saw it."""
    with https_server(None, tmp_path, answer(200)) as up:
        down = _closed_port()
        composition = compose(
            {
                "mirrors": [{"source": "docker.io", "mirror": f"http://{up}/hub"}],
                # Patient: on a loaded machine the loopback server may answer late.
                "health": {"interval": "30s", "timeout": "20s", "failureThreshold": 1},
            },
            {"team-a": [{"source": "quay.io", "mirror": f"http://{down}/quay"}]},
        )
        metrics = Metrics()
        watcher = _monitor(composition, metrics)
        cluster_only = _monitor(composition, Metrics(), teams=False)
        try:
            watcher.probe_round()
            cluster_only.probe_round()
        finally:
            watcher.stop()
            cluster_only.stop()
    assert watcher.health == policy.Health(down={down: "connection refused"})
    assert cluster_only.health == policy.HEALTHY  # the cause: the team's host never probed
    page = scrape.samples(metrics.render()[0].decode())
    assert page[("mirrorgate_mirror_up", frozenset({("mirror", f"{down}/quay")}))] == 0.0
    assert page[("mirrorgate_mirror_up", frozenset({("mirror", f"{up}/hub")}))] == 1.0
    assert page[("mirrorgate_mirror_hosts_unprobed", frozenset())] == 0.0
    pod = reviews.pod("quay.io/org/app:1", "nginx:1.27")
    planned = policy.plan(
        pod,
        namespace="team-a",
        mirror_policy=composition.policy_for("team-a"),
        health=watcher.health,
    )
    assert [r.new_image for r in planned.rewrites] == [f"{up}/hub/library/nginx:1.27"]
    assert planned.fallbacks == 1
    assert any(f"mirror {down}/quay of" in w and "is down" in w for w in planned.warnings)


def test_team_hosts_are_taken_in_turn_from_each_namespace_up_to_the_cap() -> None:
    """One namespace with many hosts cannot take the cap from the others; a host the cluster
    probes anyway costs nothing, nor does one a namespace shares with an earlier one."""
    composition = compose(
        {"mirrors": [{"source": "docker.io", "mirror": "cluster.example/hub"}]},
        {
            "a": [
                {"source": "quay.io", "mirror": "h1.example/q"},
                {"source": "ghcr.io", "mirror": "h2.example/g"},
                {"source": "gcr.io", "mirror": "h3.example/g"},
                {"source": "docker.io", "mirror": "cluster.example/a-hub"},
            ],
            "b": [{"source": "quay.io", "mirror": "h4.example/q"}],
            "c": [
                {"source": "quay.io", "mirror": "h1.example/c"},
                {"source": "ghcr.io", "mirror": "h5.example/g"},
            ],
        },
    )
    found = targets.probed_targets(composition.cluster, {}, composition.team_rules, cap=2)
    assert set(found.hosts) == {"cluster.example", "h1.example", "h4.example"}
    assert found.unprobed == {"h2.example": ("a",), "h3.example": ("a",), "h5.example": ("c",)}
    assert set(found.mirrors) == {
        "cluster.example/hub",
        "cluster.example/a-hub",
        "h1.example/q",
        "h1.example/c",
        "h4.example/q",
    }
    uncapped = targets.probed_targets(composition.cluster, {}, composition.team_rules)
    assert len(uncapped.hosts) == 6
    assert not uncapped.unprobed


def test_past_the_cap_is_logged_once_counted_and_listed(log_lines: StringIO) -> None:
    teams = {f"team-{i}": [{"source": "quay.io", "mirror": f"t{i}.example/q"}] for i in range(1, 5)}
    composition = compose({"mirrors": []}, teams)
    metrics = Metrics()
    watcher = _monitor(composition, metrics, probe=False, cap=1)
    watcher.probe_round()
    watcher.probe_round()
    warned = [
        json.loads(line)
        for line in log_lines.getvalue().splitlines()
        if "past the probes' cap" in line
    ]
    (line,) = warned
    why = (
        "3 mirror hosts of MirrorPolicies past the cap of 1 more than the cluster's: "
        "t2.example (team-2), t3.example (team-3), t4.example (team-4); not probed, so their "
        "rules rewrite as if the mirror were up (no failover, no fallback while it is down)"
    )
    assert (line["level"], line["why"]) == ("warning", why)
    assert watcher.problems() == {"mirror probes": why}
    page = scrape.samples(metrics.render()[0].decode())
    assert page[("mirrorgate_mirror_hosts_unprobed", frozenset())] == 3.0


def _credential(name: str, registry: str) -> Credential:
    return Credential(name=name, registry=registry, username="robot", password="s3cret-value")


def test_team_credentials_log_in_on_their_own_mirror_and_never_fail_the_cluster_s() -> None:
    """A team-only robot logs in on its team's mirror; one missing from the store fails; a
    team's rule naming the cluster's credential on another host does not fail it."""
    composition = compose(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": "harbor.example/hub", "credential": "shared"}
            ],
            "credentials": {
                "shared": {"namespaces": ["*"]},
                "robot-a": {"namespaces": ["team-a"]},
                "robot-b": {"namespaces": ["team-b"]},
            },
        },
        {
            "team-a": [
                {"source": "quay.io", "mirror": "harbor.example/a", "credential": "robot-a"}
            ],
            "team-b": [
                {"source": "quay.io", "mirror": "harbor.example/b", "credential": "robot-b"}
            ],
            "team-c": [{"source": "quay.io", "mirror": "other.example/c", "credential": "shared"}],
        },
    )
    store = {
        "shared": _credential("shared", "harbor.example"),
        "robot-a": _credential("robot-a", "harbor.example"),
    }
    found = targets.probed_targets(composition.cluster, store, composition.team_rules)
    assert dict(found.logins) == {
        "shared": ("harbor.example", "hub/mirrorgate-health"),
        "robot-a": ("harbor.example", "a/mirrorgate-health"),
    }
    assert dict(found.misconfigured) == {"robot-b": "not in the credential store"}
    assert set(found.hosts) == {"harbor.example", "other.example"}
