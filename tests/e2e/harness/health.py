"""The short health-probe settings the health e2e tests run with, and their policies."""

from __future__ import annotations

from mirrorgate.webhook.credentials.store import Credential
from tests.e2e.harness.registry import RegistryStack

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
