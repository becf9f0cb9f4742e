"""A restart never turns a policy into an outage, and a refused policy is visible.

Against the real API server, with mirrorgate's ServiceAccount: a replica keeps
the policy it accepted in ConfigMap mirrorgate-policy-accepted; a replica that
starts on a policy it must refuse serves that one (ready, not crash-looping),
and /readyz, the policy-info metric and a Warning Event on the policy
ConfigMap say what was refused and what is served.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import write_atomically
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import Installed, e2e_policy
from tests.webhook import policies

pytestmark = pytest.mark.e2e

ACCEPTED = "mirrorgate-policy-accepted"


def version(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def accepted(api: k8s.ApiClient) -> str | None:
    try:
        found = k8s.CoreV1Api(api).read_namespaced_config_map(ACCEPTED, mg.NAMESPACE)
    except k8s.ApiException as error:
        if error.status == 404:
            return None
        raise
    return (found.data or {}).get("policy.yaml")


def make_policy_object(api: k8s.ApiClient, text: str) -> str:
    """A policy ConfigMap (labelled, so the session's webhook judges it); its name."""
    name = f"e2e-policy-{secrets.token_hex(3)}"
    k8s.CoreV1Api(api).create_namespaced_config_map(
        mg.NAMESPACE,
        {  # type: ignore[arg-type]
            "metadata": {"name": name, "labels": {"mirrorgate.io/policy": "true"}},
            "data": {"policy.yaml": text},
        },
    )
    return name


def refusals(api: k8s.ApiClient, name: str) -> list[str]:
    """The messages of PolicyRejected Events on ConfigMap ``name``."""
    events = k8s.CoreV1Api(api).list_namespaced_event(
        mg.NAMESPACE, field_selector=f"involvedObject.name={name},reason=PolicyRejected"
    )
    return [e.message or "" for e in events.items]


def readyz(server: mg.Mirrorgate) -> tuple[int, dict[str, Any]]:
    with server.client() as http:
        answer = http.get("/readyz")
    return answer.status_code, answer.json()


def test_a_replica_started_on_a_refused_policy_serves_the_last_accepted_one(
    installed: Installed, tmp_path: Path
) -> None:
    """Replica A accepts a policy; replica B starts on an invalid one (written past the
    webhook): B is ready and serves A's, /readyz and an Event name the errors. A reload of
    A's file to a bad policy is reported the same way; a good one clears it."""
    plane = installed.control_plane
    good = e2e_policy(installed.registry, extra=f"# replica A {secrets.token_hex(3)}\n")
    with plane.api_client() as api:
        policy_object = make_policy_object(api, good)
        first = mg.start_mirrorgate(tmp_path / "a", plane, policy=good)
        try:
            wait_until(
                lambda: None if accepted(api) == good else "not yet kept",
                timeout=20,
                what="replica A's policy kept as the accepted one",
            )
        finally:
            first.stop()

        second = mg.start_mirrorgate(tmp_path / "b", plane, policy=policies.INVALID_POLICY)
        try:
            status, body = readyz(second)
            with second.client() as http:
                metrics = http.get("/metrics").text
            wait_until(
                lambda: None if refusals(api, policy_object) else "no Event yet",
                timeout=20,
                what="a PolicyRejected Event on the policy ConfigMap",
            )
            events = refusals(api, policy_object)
        finally:
            second.stop()
        kept = accepted(api)
    assert status == 200, body
    assert body["policy"] == version(good)
    problem = body["problems"]["policy"]
    assert "invalid policy (3 errors)" in problem
    assert all(f"{path}: " in problem for path in policies.INVALID_POLICY_PATHS), problem
    assert f"serving the last accepted policy {version(good)}" in problem
    assert (
        f'mirrorgate_policy_info{{mode="namespace-label",version="{version(good)}"}} 1.0' in metrics
    )
    assert any(
        f"serving policy {version(good)}" in e and "mirrors[0].source: " in e for e in events
    ), events
    assert kept == good  # the refused policy never replaced the accepted one


def test_a_refused_reload_is_listed_on_readyz_and_as_an_event(
    installed: Installed, tmp_path: Path
) -> None:
    plane = installed.control_plane
    good = e2e_policy(installed.registry, extra=f"# reload {secrets.token_hex(3)}\n")
    with plane.api_client() as api:
        policy_object = make_policy_object(api, good)
        server = mg.start_mirrorgate(tmp_path, plane, policy=good)
        try:
            assert "policy" not in readyz(server)[1]["problems"]
            write_atomically(server.policy_path, f"mode: enforce\n{good}")

            def listed() -> str | None:
                return None if "policy" in readyz(server)[1]["problems"] else "not listed"

            wait_until(listed, timeout=20, what="the refused policy on /readyz")
            status, body = readyz(server)
            wait_until(
                lambda: None if refusals(api, policy_object) else "no Event yet",
                timeout=20,
                what="a PolicyRejected Event",
            )
            events = refusals(api, policy_object)
            write_atomically(server.policy_path, good.replace("# reload", "# reloaded"))
            wait_until(
                lambda: None if "policy" not in readyz(server)[1]["problems"] else "still listed",
                timeout=20,
                what="the problem cleared",
            )
        finally:
            server.stop()
    assert status == 200
    assert body["policy"] == version(good)
    assert (
        "mode: the policy no longer sets the mode; remove this line" in body["problems"]["policy"]
    )
    assert f"still serving policy {version(good)}" in body["problems"]["policy"]
    assert any("mode: the policy no longer sets the mode" in e for e in events), events
