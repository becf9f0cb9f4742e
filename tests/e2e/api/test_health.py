"""Mirror and credential health end to end: the real API server, a real mirror stopped and started.

A mirrorgate of this module's own (kubernetes credential store, probes on)
is registered for namespaces carrying a suite label of its own, in front of
a registry stack of its own (``own_registry``), so stopping that mirror and
changing its password disturbs no other test.

The Pods are created for real, not as dry runs. The same scenarios run
again on the node cluster (tests/e2e/node/test_health.py): there a
real kubelet and containerd pull each Pod's image, so "left as written"
means the Pod pulls from the upstream and runs, and "rewritten" means it
pulls through the mirror, or, with ``keep`` and the mirror down, fails to.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from mirrorgate.webhook import cli
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import (
    register_for_suite,
    rewrite_policy,
    suite_namespace,
)
from tests.e2e.harness.health import DOWN_BOUND, HEALTH, PATIENCE, UP_BOUND, Scenario, timed_stop
from tests.e2e.harness.kube import create_namespace, namespace_name
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import RegistryStack, set_mirror_password, start_mirror, stop_mirror
from tests.e2e.harness.suite import Installed, central_credential

pytestmark = pytest.mark.e2e

CREDENTIAL = "health-mirror"


def _policy(stack: RegistryStack, on_mirror_down: str = "fallback") -> str:
    return (
        f"{HEALTH}"
        f"mirrors:\n"
        f"  - source: {stack.upstream_host}\n"
        f"    mirror: {stack.host}\n"
        f"    credential: {CREDENTIAL}\n"
        f"    onMirrorDown: {on_mirror_down}\n"
        f"credentials:\n  {CREDENTIAL}: {{namespaces: ['*']}}\n"
    )


@contextlib.contextmanager
def serving(installed: Installed, stack: RegistryStack, workdir: Path) -> Iterator[Scenario]:
    """A mirrorgate with probes on, registered with `installed`'s API server for a namespace."""
    suite = f"health-{secrets.token_hex(4)}"
    with installed.control_plane.api_client() as api:
        central_credential(api, stack, name=CREDENTIAL)
        server = mg.start_mirrorgate(
            workdir,
            installed.control_plane,
            policy=_policy(stack),
            args=["--store", "kubernetes"],
            env={"SSL_CERT_FILE": str(stack.ca_path)},
            redact=[stack.password],
            health_probes=True,
        )
        name = f"mirrorgate-e2e-{suite}"
        try:
            register_for_suite(api, installed.configuration, server, name=name, suite=suite)
            # Opted in (the server makes pull secrets only in enforce namespaces) and
            # ours by the suite label; the session's webhook also sees it, but its
            # policy covers none of this module's images.
            namespace = suite_namespace(api, "health", suite)
            running = Scenario(api, server, stack, namespace)
            wait_until(
                lambda: None if running.app_image() == stack.mirror_image else "not yet",
                timeout=PATIENCE,
                what="webhook in force",
                interval=0.2,
            )
            # Probed healthy, not merely unprobed yet (which also rewrites): the first
            # result decides at once, so a mirror stopped before it is "down" at once
            # and the failureThreshold path would go unmeasured.
            running.wait_gauge("mirrorgate_mirror_up", 1.0, mirror=stack.host)
            running.wait_gauge("mirrorgate_credential_valid", 1.0, credential=CREDENTIAL)
            yield running
        finally:
            mg.unregister(api, name)
            server.stop()


@pytest.fixture(scope="module")
def scenario(
    installed: Installed, own_registry: RegistryStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenario]:
    with serving(installed, own_registry, tmp_path_factory.mktemp("health")) as running:
        yield running


def test_mirror_stopped_then_restarted(scenario: Scenario) -> None:
    """Down: new Pods keep the upstream image (fallback); restarted: rewrites resume."""
    stack = scenario.stack
    created, warnings = scenario.create()
    assert [c["image"] for c in created["spec"]["containers"]] == [stack.mirror_image]
    assert created["spec"]["imagePullSecrets"] == [{"name": policy.pull_secret_name(CREDENTIAL)}]
    assert warnings == []

    began, stopping = timed_stop(stack)
    try:
        wait_admitted_as(scenario, stack.upstream_image, "fallback to the upstream")
        print(
            f"fallback {time.monotonic() - began:.2f} s after the mirror began stopping "
            f"(stopping took {stopping:.2f} s; contract: {DOWN_BOUND:.2f} s)"
        )
        created, warnings = scenario.create()
        # On the node this Pod pulls from the upstream and runs (test_node_mirror_*).
        assert [c["image"] for c in created["spec"]["containers"]] == [stack.upstream_image]
        assert "imagePullSecrets" not in created["spec"]  # the down mirror's credential: unused
        (warning,) = warnings
        assert warning.startswith(
            f"containers/app: image '{stack.upstream_image}' left as written: mirror "
            f"{stack.host} of mirrors[0] is down: "
        )
        assert warning.endswith("(onMirrorDown: fallback)")
        assert scenario.gauge("mirrorgate_mirror_up", mirror=stack.host) == 0.0
        assert scenario.gauge("mirrorgate_images_left_for_health_total") >= 1.0
    finally:
        start_mirror(stack)
    seconds = wait_until(
        lambda: None if scenario.app_image() == stack.mirror_image else "still as written",
        timeout=PATIENCE,
        what="rewrites resume",
        interval=0.1,
    )
    print(f"rewrites resumed after {seconds:.2f} s (contract: {UP_BOUND:.2f} s)")
    created, warnings = scenario.create()
    # On the node this Pod pulls through the mirror again (test_node_mirror_*).
    assert created["spec"]["containers"][0]["image"] == stack.mirror_image
    assert warnings == []
    scenario.wait_gauge("mirrorgate_mirror_up", 1.0, mirror=stack.host)


def test_password_changed_at_the_mirror_only(scenario: Scenario) -> None:
    """credential_valid drops to 0; the credential's images stay as written, with a warning."""
    stack = scenario.stack
    scenario.wait_gauge("mirrorgate_credential_valid", 1.0, credential=CREDENTIAL)
    set_mirror_password(stack, secrets.token_urlsafe(18))
    try:
        scenario.wait_gauge("mirrorgate_credential_valid", 0.0, credential=CREDENTIAL)
        created, warnings = scenario.create()
        assert [c["image"] for c in created["spec"]["containers"]] == [stack.upstream_image]
        assert warnings == [
            f"containers/app: image '{stack.upstream_image}' left as written: credential "
            f"'{CREDENTIAL}' of mirrors[0] cannot log in to mirror {stack.host}: login refused "
            "by /v2/ (HTTP 401) (onMirrorDown: fallback)"
        ]
        assert scenario.gauge("mirrorgate_mirror_up", mirror=stack.host) == 1.0
    finally:
        set_mirror_password(stack, stack.password)
    scenario.wait_gauge("mirrorgate_credential_valid", 1.0, credential=CREDENTIAL)
    assert scenario.app_image() == stack.mirror_image
    assert stack.password not in Path(scenario.server.process.log_path).read_text()


def test_keep_rewrites_while_the_mirror_is_down(scenario: Scenario) -> None:
    """onMirrorDown: keep (air-gapped clusters): rewrites and pull secrets go on, with a warning."""
    stack = scenario.stack
    rewrite_policy(scenario.server, _policy(stack, "keep"))
    stop_mirror(stack)
    try:
        scenario.wait_gauge("mirrorgate_mirror_up", 0.0, mirror=stack.host)
        created, warnings = scenario.create()
        assert [c["image"] for c in created["spec"]["containers"]] == [stack.mirror_image]
        assert created["spec"]["imagePullSecrets"] == [
            {"name": policy.pull_secret_name(CREDENTIAL)}
        ]
        (warning,) = warnings
        assert warning.startswith(
            f"containers/app: image '{stack.upstream_image}' rewritten although mirror "
            f"{stack.host} of mirrors[0] is down: "
        )
    finally:
        start_mirror(stack)
        rewrite_policy(scenario.server, _policy(stack))
    scenario.wait_gauge("mirrorgate_mirror_up", 1.0, mirror=stack.host)


def test_audit_command_shows_health_beside_each_planned_rewrite(
    scenario: Scenario, installed: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mirrorgate audit` probes the mirrors of planned rewrites once and shows their health."""
    stack = scenario.stack
    # A namespace no webhook serves: its Pod keeps the upstream image, which the
    # audit then plans to rewrite.
    namespace = create_namespace(scenario.api, namespace_name("health-audit"))
    k8s.CoreV1Api(scenario.api).create_namespaced_pod(
        namespace,
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name="written"),
            spec=k8s.V1PodSpec(
                containers=[k8s.V1Container(name="app", image=stack.upstream_image)]
            ),
        ),
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(stack.ca_path))  # the command's own trust store

    def run(*extra: str) -> tuple[int, str]:
        """`mirrorgate audit` of the namespace with the scenario's policy: code and output."""
        out = io.StringIO()
        code = cli.main(
            [
                "audit",
                "--policy",
                str(scenario.server.policy_path),
                "--kubeconfig",
                str(installed.control_plane.kubeconfig),
                "-n",
                namespace,
                *extra,
            ],
            out=out,
            err=io.StringIO(),
        )
        return code, out.getvalue()

    def audit(*extra: str) -> dict[str, Any]:
        code, out = run("-o", "json", *extra)
        assert code == 0
        (report,) = json.loads(out)["namespaces"]
        (image,) = report["images"]
        return dict(image)

    assert audit()["outcome"] == "rewrite"
    assert audit()["health"] == "up"
    assert audit("--no-health")["health"] is None
    _, table = run()
    assert f"→ {stack.mirror_image}\n" in table
    assert "(health: up)\n" in table
    stop_mirror(stack)
    try:
        found = audit()
    finally:
        start_mirror(stack)
    assert found["outcome"] == "rewrite"
    assert found["health"].startswith(f"mirror {stack.host} of mirrors[0] is down: ")


def test_readyz_stays_ready_and_lists_nothing_when_healthy(scenario: Scenario) -> None:
    # The module's earlier tests stop and restart the mirror: wait for the probes to have
    # seen it back, as the contract is about a healthy mirror, not about probe timing.
    wait_until(
        lambda: (
            None
            if scenario.gauge("mirrorgate_mirror_up", mirror=scenario.stack.host) == 1.0
            else "mirror not up yet"
        ),
        timeout=PATIENCE,
        what="mirror up again",
    )
    with scenario.server.client() as http:
        response = http.get("/readyz")
    assert response.status_code == 200
    problems = response.json()["problems"]
    assert not [k for k in problems if k.startswith(("mirror ", "credential "))], problems


def wait_admitted_as(scenario: Scenario, image: str, what: str) -> float:
    return wait_until(
        lambda: None if scenario.app_image() == image else f"not {image}",
        timeout=PATIENCE,
        what=what,
        interval=0.1,
    )
