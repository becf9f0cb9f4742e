"""The short health-probe settings the health e2e tests run with, and their policies."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client as k8s

from mirrorgate.webhook.credentials.store import Credential
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import metric, metrics_text
from tests.e2e.harness.kube import create_pod
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import RegistryStack, stop_mirror

INTERVAL, TIMEOUT, FAILURES, SUCCESSES = 0.3, 0.25, 2, 1
DOWN_BOUND = FAILURES * INTERVAL + TIMEOUT
UP_BOUND = SUCCESSES * INTERVAL + TIMEOUT
# Generous: the contract's bound times ten, plus scheduling noise on a busy machine
# with the API server in the loop.
PATIENCE = 10 * DOWN_BOUND + 15
LOGIN = "mirror-login"
# The policy's `health` block with the settings above.
HEALTH = (
    f"health: {{interval: {int(INTERVAL * 1000)}ms, timeout: {int(TIMEOUT * 1000)}ms, "
    f"failureThreshold: {FAILURES}, successThreshold: {SUCCESSES}}}\n"
)


def health_policy(stack: RegistryStack, *, extra_rule: str = "", ca_file: str = "") -> str:
    ca = f"    caFile: {ca_file}\n" if ca_file else ""
    return (
        f"{HEALTH}"
        f"mirrors:\n"
        f"  - source: docker.io\n    mirror: {stack.host}/hub\n{ca}"
        f"  - source: quay.io\n    mirror: {stack.host}/quay\n    onMirrorDown: keep\n{ca}"
        f"  - source: ghcr.io\n    mirror: {stack.host}/ghcr\n    credential: {LOGIN}\n{ca}"
        f"{extra_rule}"
        f"credentials:\n  {LOGIN}: {{namespaces: ['*']}}\n"
        f"  absent: {{namespaces: ['*']}}\n  elsewhere: {{namespaces: ['*']}}\n"
    )


def credential(stack: RegistryStack, password: str | None = None) -> Credential:
    return Credential(
        name=LOGIN,
        registry=stack.host,
        username=stack.username,
        password=stack.password if password is None else password,
    )


class Scenario:
    """This module's mirrorgate, its registration, and a namespace it serves."""

    def __init__(
        self, api: k8s.ApiClient, server: mg.Mirrorgate, stack: RegistryStack, namespace: str
    ) -> None:
        self.api, self.server, self.stack, self.namespace = api, server, stack, namespace

    def create(
        self, body: k8s.V1Pod | None = None, *, dry_run: bool = False
    ) -> tuple[dict[str, Any], list[str]]:
        """Create `body`, by default a Pod of the upstream image (the policy's to rewrite)."""
        body = body or k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(generate_name="health-"),
            spec=k8s.V1PodSpec(
                containers=[k8s.V1Container(name="app", image=self.stack.upstream_image)]
            ),
        )
        return create_pod(self.api, self.namespace, body, dry_run=dry_run)

    def app_image(self) -> str:
        return str(self.create(dry_run=True)[0]["spec"]["containers"][0]["image"])

    def gauge(self, name: str, **labels: str) -> float:
        return metric(metrics_text(self.server), name, **labels)

    def wait_gauge(self, name: str, value: float, **labels: str) -> None:
        def check() -> str | None:
            found = self.gauge(name, **labels)
            return None if found == value else f"{name}{labels} = {found}"

        wait_until(
            check,
            timeout=PATIENCE,
            what=f"{name} {value}",
            interval=0.1,
            alive=self.server.process.exited,
        )


def timed_stop(stack: RegistryStack) -> tuple[float, float]:
    """Stop the mirror; returns when it began stopping (monotonic) and how long it took."""
    began = time.monotonic()
    stop_mirror(stack)
    return began, time.monotonic() - began
