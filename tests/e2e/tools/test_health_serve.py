"""`mirrorgate serve` alone, probing a real TLS mirror on loopback that the tests stop and start.

The mirror is Debian's docker-registry (htpasswd over TLS, a pull-through
cache of a token-auth upstream), the server a real `mirrorgate serve`
process with a file credential store and no cluster. Everything is read from
the outside: /mutate, /metrics, /readyz and the server's log.

Probe settings are short (interval 300ms, timeout 250ms, failureThreshold 2,
successThreshold 1); the waits below are generous multiples of the
contract's bound, because this machine is shared and slow at times: the
timings are recorded, not asserted tightly.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.mirrorhealth import probes
from tests.e2e.harness.health import (
    DOWN_BOUND,
    LOGIN,
    PATIENCE,
    UP_BOUND,
    credential,
    health_policy,
)
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import (
    RegistryStack,
    set_mirror_password,
    start_mirror,
    stop_mirror,
)
from tests.e2e.harness.standalone import Standalone, start_standalone, write_store

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(
    own_registry: RegistryStack,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Standalone]:
    workdir = tmp_path_factory.mktemp("health-serve")
    store = write_store(workdir, [credential(own_registry)])
    with start_standalone(
        workdir,
        policy=health_policy(own_registry),
        args=store,
        env={"SSL_CERT_FILE": str(own_registry.ca_path)},
        redact=[own_registry.password],
    ) as running:
        yield running


def _mirror_up(server: Standalone, stack: RegistryStack, expected: float) -> str | None:
    value = server.gauge("mirrorgate_mirror_up", mirror=f"{stack.host}/hub")
    return None if value == expected else f"mirror_up is {value}"


def _credential_valid(server: Standalone, expected: float) -> str | None:
    value = server.gauge("mirrorgate_credential_valid", credential=LOGIN)
    return None if value == expected else f"credential_valid is {value}"


def test_probe_answers_against_the_real_registries(own_registry: RegistryStack) -> None:
    """The probes alone: Basic on the mirror, the token flow on the upstream, both ways."""
    context = probes.tls_context(str(own_registry.ca_path))
    stack = own_registry
    assert probes.check_mirror(stack.host, context=context, timeout=5) == (True, "HTTP 401")
    assert (
        probes.check_login(
            stack.host, stack.username, stack.password, repository="x/y", context=context, timeout=5
        ).verdict
        == "valid"
    )
    wrong = probes.check_login(
        stack.host, stack.username, "wrong", repository="x/y", context=context, timeout=5
    )
    assert wrong == ("invalid", "login refused by /v2/ (HTTP 401)")
    # The upstream advertises a Bearer realm (the token server): a token scoped to
    # a repository, for the right password only.
    assert (
        probes.check_login(
            stack.upstream_host,
            stack.upstream_username,
            stack.upstream_password,
            repository="library/hello",
            context=context,
            timeout=5,
        ).verdict
        == "valid"
    )
    refused = probes.check_login(
        stack.upstream_host,
        stack.upstream_username,
        "wrong",
        repository="library/hello",
        context=context,
        timeout=5,
    )
    assert refused.verdict == "invalid"
    assert "token realm" in refused.reason
    # The system trust store does not know the test CA: a TLS failure, not "up".
    untrusted = probes.check_mirror(stack.host, context=probes.tls_context(None), timeout=5)
    assert not untrusted.ok
    assert untrusted.reason.startswith("TLS verification failed")
    assert stack.password not in repr((wrong, refused, untrusted))


def test_mirror_down_then_up(server: Standalone, own_registry: RegistryStack) -> None:
    """Stop the mirror: fallback rules leave images as written, keep rules rewrite; restart."""
    stack = own_registry
    wait_until(lambda: _mirror_up(server, stack, 1.0), timeout=PATIENCE, what="mirror up")
    images, warnings = server.images_after("nginx:1.25", "quay.io/org/app:1")
    assert images == [f"{stack.host}/hub/library/nginx:1.25", f"{stack.host}/quay/org/app:1"]
    assert warnings == []
    status, ready = server.readyz()
    assert (status, [k for k in ready["problems"] if k.startswith("mirror ")]) == (200, [])
    # On a loaded machine a probe can time out before the outage, a transition of its own
    # with its own pair of lines: only the lines from here on belong to this outage.
    earlier_down, earlier_up = (
        len(server.log_messages("mirror down")),
        len(server.log_messages("mirror up")),
    )

    stop_mirror(stack)
    try:

        def left_as_written() -> str | None:
            now, _ = server.images_after("nginx:1.25")
            return None if now == ["nginx:1.25"] else f"still {now}"

        seconds = wait_until(left_as_written, timeout=PATIENCE, what="fallback")
        print(f"fallback after {seconds:.2f} s (contract: {DOWN_BOUND:.2f} s)")
        images, warnings = server.images_after("nginx:1.25", "quay.io/org/app:1")
        assert images == ["nginx:1.25", f"{stack.host}/quay/org/app:1"]
        assert len(warnings) == 2
        assert warnings[0].startswith(
            f"containers/c0: image 'nginx:1.25' left as written: mirror {stack.host}/hub of "
            f"mirrors[0] is down: "
        )
        assert warnings[0].endswith("(onMirrorDown: fallback)")
        assert warnings[1].startswith(
            f"containers/c1: image 'quay.io/org/app:1' rewritten although mirror "
            f"{stack.host}/quay of mirrors[1] is down: "
        )
        assert server.gauge("mirrorgate_mirror_up", mirror=f"{stack.host}/hub") == 0.0
        assert server.gauge("mirrorgate_mirror_up", mirror=f"{stack.host}/quay") == 0.0
        assert server.gauge("mirrorgate_images_left_for_health_total") == 2.0
        status, ready = server.readyz()
        assert status == 200  # fails open
        assert ready["ready"] is True
        assert ready["problems"][f"mirror {stack.host}"].startswith("down: ")
    finally:
        start_mirror(stack)

    def rewritten() -> str | None:
        now, _ = server.images_after("nginx:1.25")
        return None if now == [f"{stack.host}/hub/library/nginx:1.25"] else f"still {now}"

    seconds = wait_until(rewritten, timeout=PATIENCE, what="rewrites resume")
    print(f"rewrites resumed after {seconds:.2f} s (contract: {UP_BOUND:.2f} s)")
    wait_until(lambda: _mirror_up(server, stack, 1.0), timeout=PATIENCE, what="gauge back")
    status, ready = server.readyz()
    assert (status, [k for k in ready["problems"] if k.startswith("mirror ")]) == (200, [])
    # One line per transition, however many probes failed in between.
    wait_until(
        lambda: None if server.log_messages("mirror up") else "no line yet",
        timeout=PATIENCE,
        what="the 'mirror up' log line",
    )
    down = server.log_messages("mirror down")[earlier_down:]
    up = server.log_messages("mirror up")[earlier_up:]
    assert [entry["mirror"] for entry in down] == [stack.host]
    assert [entry["mirror"] for entry in up] == [stack.host]


def test_password_changed_at_the_mirror_only(
    server: Standalone, own_registry: RegistryStack
) -> None:
    """credential_valid drops to 0 and the credential's images stay as written, with a warning."""
    stack = own_registry
    wait_until(lambda: _credential_valid(server, 1.0), timeout=PATIENCE, what="login valid")
    set_mirror_password(stack, secrets.token_urlsafe(18))
    try:
        wait_until(
            lambda: _credential_valid(server, 0.0), timeout=PATIENCE, what="credential_valid 0"
        )
        images, warnings = server.images_after("ghcr.io/org/tool:2")
        assert images == ["ghcr.io/org/tool:2"]
        assert warnings == [
            f"containers/c0: image 'ghcr.io/org/tool:2' left as written: credential "
            f"'{LOGIN}' of mirrors[2] cannot log in to mirror {stack.host}/ghcr: login refused "
            "by /v2/ (HTTP 401) (onMirrorDown: fallback)"
        ]
        # The mirror itself is still up: only the credential's rules fall back.
        assert server.gauge("mirrorgate_mirror_up", mirror=f"{stack.host}/ghcr") == 1.0
        assert server.images_after("nginx:1")[0] == [f"{stack.host}/hub/library/nginx:1"]
        status, ready = server.readyz()
        assert status == 200
        assert ready["problems"][f"credential {LOGIN}"] == "login refused by /v2/ (HTTP 401)"
        assert [e["credential"] for e in server.log_messages("credential cannot log in")] == [LOGIN]
    finally:
        set_mirror_password(stack, stack.password)
    wait_until(lambda: _credential_valid(server, 1.0), timeout=PATIENCE, what="login again")
    # Standalone, no pull secret can be made: the image is left as written for that
    # reason now, not for health.
    _, warnings = server.images_after("ghcr.io/org/tool:2")
    assert "cannot log in" not in " ".join(warnings)
    assert stack.password not in server.process.log_path.read_text()


def test_store_problems_are_reported_and_warned(
    own_registry: RegistryStack, tmp_path: Path
) -> None:
    """A credential missing from the store, or for another host: /readyz, the log, a warning."""
    stack = own_registry
    extra = (
        f"  - source: gcr.io\n    mirror: {stack.host}/gcr\n    credential: absent\n"
        f"  - source: registry.k8s.io\n    mirror: {stack.host}/k8s\n"
        f"    credential: elsewhere\n"
    )
    store = write_store(
        tmp_path,
        [
            credential(stack),
            Credential(name="elsewhere", registry="other.example:5000", username="u", password="p"),
        ],
    )
    with start_standalone(
        tmp_path / "server",
        policy=health_policy(stack, extra_rule=extra),
        args=[*store, "--no-health-probes"],
        env={"SSL_CERT_FILE": str(stack.ca_path)},
    ) as running:

        def reported() -> str | None:
            problems = running.readyz()[1]["problems"]
            return None if "credential elsewhere" in problems else f"problems: {problems}"

        wait_until(reported, timeout=PATIENCE, what="store problems in /readyz")
        status, ready = running.readyz()
        assert status == 200
        assert ready["problems"] == {
            "credential absent": "not in the credential store",
            "credential elsewhere": f"is for registry 'other.example:5000', not "
            f"'{stack.host}', the mirror host of mirrors[4]",
        }
        images, warnings = running.images_after("gcr.io/p/app:1")
        assert images == ["gcr.io/p/app:1"]
        assert warnings == [
            f"containers/c0: image 'gcr.io/p/app:1' left as written: credential 'absent' of "
            f"mirrors[3] cannot log in to mirror {stack.host}/gcr: not in the credential store "
            "(onMirrorDown: fallback)"
        ]
        assert running.gauge("mirrorgate_credential_valid", credential="absent") == 0.0
        logged = {
            e["credential"] for e in running.log_messages("credential cannot serve its mirror")
        }
        assert logged == {"absent", "elsewhere"}
        # Probing is off: no mirror was probed, so no gauge claims anything of it.
        assert running.gauge("mirrorgate_mirror_up", mirror=f"{stack.host}/hub") is None


@pytest.mark.parametrize("trust", ["none", "ca-file"])
def test_trust_comes_from_ssl_cert_file_or_the_ca_file(
    own_registry: RegistryStack, tmp_path: Path, trust: str
) -> None:
    """Without SSL_CERT_FILE the system store refuses the test CA; a policy caFile trusts it."""
    stack = own_registry
    ca_file = str(stack.ca_path) if trust == "ca-file" else ""
    with start_standalone(
        tmp_path, policy=health_policy(stack, ca_file=ca_file), args=["--store", "none"]
    ) as running:
        expected = 1.0 if trust == "ca-file" else 0.0
        wait_until(
            lambda: _mirror_up(running, stack, expected),
            timeout=PATIENCE,
            what=f"mirror_up {expected}",
        )
        problems = running.readyz()[1]["problems"]
        if trust == "none":
            assert problems[f"mirror {stack.host}"].startswith("down: TLS verification failed")
            assert running.images_after("nginx")[0] == ["nginx"]
        else:
            assert f"mirror {stack.host}" not in problems
            assert running.images_after("nginx")[0] == [f"{stack.host}/hub/library/nginx"]
