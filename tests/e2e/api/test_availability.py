"""Availability counted by the API server, on the API server alone (no node).

The measurement the node's availability test relies on, shown able to fail:
concurrent creators keep a rate, and the API server's own counters see a
webhook that cannot be reached, under Ignore (fail-open) and under Fail
(rejected), where the client sees nothing or only an error.
"""

from __future__ import annotations

import copy
import secrets
import socket
from dataclasses import dataclass

import pytest
from kubernetes import client as k8s

from tests.e2e.harness import apiload
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.suite import Installed, MakeNamespace, pod

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class _Dead:
    """A webhook endpoint where nothing listens."""

    url: str
    ca_pem: bytes


def _held(installed: Installed, name: str) -> k8s.V1Pod:
    """The suite's Pod, held by a scheduling gate (stored, never run)."""
    body = pod(installed, name=name)
    assert body.spec is not None
    body.spec.scheduling_gates = [k8s.V1PodSchedulingGate(name="mirrorgate.io/e2e-hold")]
    return body


def test_sixteen_creators_keep_20_pods_per_second_counted_by_the_api_server(
    installed: Installed, make_namespace: MakeNamespace, e2e_figures: dict[str, str]
) -> None:
    """16 concurrent creators at 20 Pods/s for 10 s through the session's mirrorgate:
    at least 18/s achieved, nothing failed open or rejected by the API server's count,
    every Pod stored rewritten, and the API server's p99 within 100 ms."""
    plane = installed.control_plane
    namespace = make_namespace(ENFORCE_LABELS)
    with plane.api_client() as api:
        before = apiload.api_server_samples(api)
        load = apiload.Load(plane.api_client, namespace, lambda name: _held(installed, name))
        load.run()
        after = apiload.api_server_samples(api)
    counts = apiload.WebhookCounts.between(before, after, mg.ENFORCE_WEBHOOK)
    failed = [o for o in load.outcomes if o.error is not None]
    unrewritten = [
        o for o in load.outcomes if o.error is None and o.image != installed.registry.mirror_image
    ]
    e2e_figures["availability (API server only, host-process mirrorgate)"] = (
        f"{len(load.outcomes)} Pods, {load.achieved_rate:.1f}/s achieved, "
        f"fail-open {counts.fail_open}, rejected {counts.rejected}, "
        f"unrewritten {len(unrewritten)}, admission p99 <= {counts.p99_bound_s * 1000:g} ms"
    )
    assert failed == []
    assert load.achieved_rate >= 18.0
    assert counts.admissions == len(load.outcomes)
    assert (counts.fail_open, counts.rejected, len(unrewritten)) == (0, 0, 0)


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
def test_an_unreachable_webhook_is_counted_though_the_client_may_see_nothing(
    installed: Installed, make_namespace: MakeNamespace, policy: str
) -> None:
    """A configuration of its own pointing at a closed port: under Ignore every create
    succeeds, unrewritten, and only fail-open counts it; under Fail every create is
    refused and rejection counts it."""
    plane = installed.control_plane
    name = f"e2e-dead-{secrets.token_hex(3)}"
    configuration = copy.deepcopy(installed.configuration)
    (enforce,) = [w for w in configuration["webhooks"] if w["name"] == mg.ENFORCE_WEBHOOK]
    enforce["namespaceSelector"] = {"matchLabels": {"e2e.mirrorgate.io/failure": name}}
    configuration["webhooks"] = [enforce]
    namespace = make_namespace({"e2e.mirrorgate.io/failure": name, **ENFORCE_LABELS})
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        dead = _Dead(
            url=f"https://127.0.0.1:{closed.getsockname()[1]}", ca_pem=installed.server.ca_pem
        )
        with plane.api_client() as api:
            mg.register(api, configuration, dead, name=name, failure_policy=policy)
            try:
                before = apiload.api_server_samples(api)
                load = apiload.Load(
                    plane.api_client, namespace, lambda n: _held(installed, n), minimum_s=2.0
                )
                load.run()
                after = apiload.api_server_samples(api)
            finally:
                mg.unregister(api, name)
    counts = apiload.WebhookCounts.between(before, after, mg.ENFORCE_WEBHOOK)
    created = [o for o in load.outcomes if o.error is None]
    assert len(load.outcomes) >= 30
    if policy == "Ignore":
        assert len(created) == len(load.outcomes)
        assert all(o.image == installed.registry.upstream_image for o in created)
        assert (counts.fail_open, counts.rejected) == (len(load.outcomes), 0)
    else:
        assert created == []
        assert (counts.fail_open, counts.rejected) == (0, len(load.outcomes))
