"""`serve --mirror-ca`: the private CAs the probes trust, replaced while the server runs.

A real TLS mirror on loopback (Debian's docker-registry, its certificate from the
test stack's CA) and a second CA of its own: the bundle file is swapped between
them, atomically as the kubelet swaps a mounted ConfigMap, and the probes follow
each swap without a restart, read from the outside (/metrics and the log).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mirrorgate.certs import CertificateAuthority
from tests.e2e.harness.health import HEALTH, PATIENCE
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.standalone import Standalone, start_standalone

pytestmark = pytest.mark.e2e


def _swap(path: Path, pem: bytes) -> None:
    temporary = path.with_name(f".{path.name}.new")
    temporary.write_bytes(pem)
    os.replace(temporary, path)


def _mirror_up(server: Standalone, mirror: str, expected: float) -> str | None:
    value = server.gauge("mirrorgate_mirror_up", mirror=mirror)
    return None if value == expected else f"mirror_up is {value}"


def test_a_replaced_bundle_is_what_the_probes_trust(
    own_registry: RegistryStack, tmp_path: Path
) -> None:
    stack = own_registry
    mirror = f"{stack.host}/hub"
    other = CertificateAuthority.generate(common_name="another private CA").cert_pem
    bundle = tmp_path / "mirror-ca.crt"
    _swap(bundle, other)  # at start: a CA that did not sign the mirror's certificate
    with start_standalone(
        tmp_path / "serve",
        policy=f"{HEALTH}mirrors:\n  - source: docker.io\n    mirror: {mirror}\n",
        args=["--mirror-ca", str(bundle), "--reload-interval", "0.2"],
    ) as server:
        wait_until(lambda: _mirror_up(server, mirror, 0.0), timeout=PATIENCE, what="down")
        (down,) = server.log_messages("mirror down")
        assert "TLS verification failed" in down["reason"]

        # Both CAs, the mirror's second: a bundle of several is read whole.
        _swap(bundle, other + stack.ca_path.read_bytes())
        seconds = wait_until(lambda: _mirror_up(server, mirror, 1.0), timeout=PATIENCE, what="up")
        print(f"mirror up {seconds:.2f} s after the bundle was replaced")
        # The probe may see the new trust before the reload's log line is written.
        wait_until(
            lambda: None if server.log_messages("mirror CA bundle reloaded") else "not logged",
            timeout=PATIENCE,
            what="reload logged",
        )
        assert len(server.log_messages("mirror CA bundle reloaded")) == 1

        # A file that is no bundle is refused and the last good one stays in force.
        _swap(bundle, b"not a certificate\n")
        wait_until(
            lambda: (
                None
                if server.log_messages("mirror CA bundle refused; the previous one stays in force")
                else "not refused yet"
            ),
            timeout=PATIENCE,
            what="refusal",
        )
        assert _mirror_up(server, mirror, 1.0) is None

        # The other CA alone again: the mirror's CA is gone from the trust, not kept.
        _swap(bundle, other)
        wait_until(lambda: _mirror_up(server, mirror, 0.0), timeout=PATIENCE, what="down again")
        assert server.process.exited() is None
