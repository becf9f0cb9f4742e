"""Secretless pulls: the kubelet plugin's round trip and the credential endpoint's throughput.

A real etcd and kube-apiserver, mirrorgate with ``--kubelet-port`` and the
kubernetes credential store, tokens from TokenRequest bound to a Pod on a
node, and a kubelet certificate from the API server's client CA, as
tests/e2e/api/test_kubelet_credentials.py sets them up.

* **Round trip**: the real plugin binary run as the kubelet runs it (a
  process per pull, the request on stdin), from its start to its exit with
  the login on stdout. *warm*: the token's verdict is kept (the kubelet's
  second pull for a Pod); *cold*: every run carries a token never seen, so
  each costs a TokenReview. Alternating, the two in the same rounds.
* **Throughput on one core**: the server pinned to one CPU
  (``sched_setaffinity``), kept-alive connections posting the request with a
  warm verdict as fast as answered, every answer checked to be the login.

    python -m bench.kubelet_bench [--pulls N] [--seconds S]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import secrets
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from bench import results, server_bench
from tests.e2e.harness import controlplane
from tests.e2e.harness import kubeletcreds as kc
from tests.e2e.harness.kube import create_namespace

MIRROR = "mirror.bench.example"
IMAGE = f"{MIRROR}/hub/library/nginx:1.27"
POLICY = kc.hub_policy(MIRROR, "bench-*")
PASSWORD = f"pw-{secrets.token_hex(8)}"


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms | {_percentile(values, 0.99) * 1000:.1f} ms"


def _pull(setup: kc.CredentialServer, cert: pathlib.Path, token: str) -> float:
    started = time.perf_counter()
    done = kc.run_plugin(setup, cert, token, IMAGE)
    took = time.perf_counter() - started
    if done.returncode != 0 or PASSWORD not in done.stdout:
        raise SystemExit(f"kubelet_bench: the plugin got no login: {done.stderr}")
    return took


def round_trips(
    setup: kc.CredentialServer, cert: pathlib.Path, namespace: str, pulls: int
) -> tuple[list[float], list[float]]:
    """(warm, cold) plugin round trips, alternating."""
    fresh = kc.pod_tokens(setup.plane, namespace, "node-a", image=IMAGE, count=pulls + 1)
    kept = fresh.pop()
    _pull(setup, cert, kept)  # its verdict kept from here on
    warm, cold = [], []
    for token in fresh:
        warm.append(_pull(setup, cert, kept))
        cold.append(_pull(setup, cert, token))
    return warm, cold


def throughput(
    setup: kc.CredentialServer, cert: pathlib.Path, token: str, seconds: float, clients: int = 4
) -> tuple[float, int]:
    """Logins answered per second by the server pinned to one CPU, and how many: the lean
    keep-alive client of bench.server_bench (one write per request, TCP_NODELAY)."""
    context = ssl.create_default_context(cafile=str(setup.server.ca_path))
    context.load_cert_chain(cert)
    port = int(setup.url.rsplit(":", 1)[1].split("/", 1)[0])
    request = server_bench.http_request(
        "POST", "/kubelet-credentials", port, kc.credential_request(IMAGE, token).encode()
    )
    counts = [0] * clients
    stop = time.monotonic() + seconds
    failures: list[str] = []

    def client(index: int) -> None:
        connection = server_bench.Connection(port, context)
        try:
            while time.monotonic() < stop:
                status, body = connection.exchange(request)
                if status != 200 or PASSWORD.encode() not in body:
                    failures.append(f"HTTP {status}: {body[:200]!r}")
                    return
                counts[index] += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - started
    if failures:
        raise SystemExit(f"kubelet_bench: {failures[0]}")
    return sum(counts) / took, sum(counts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pulls", type=int, default=100, help="round trips of each kind")
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput window")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kubelet-bench-") as work:
        workdir = pathlib.Path(work)
        plane = controlplane.start_control_plane(workdir / "controlplane")
        try:
            setup = kc.start_credential_server(
                plane,
                workdir,
                policy=POLICY,
                credential="hub-robot",
                registry=MIRROR,
                username="robot",
                password=PASSWORD,
            )
            try:
                with plane.api_client() as api:
                    namespace = create_namespace(
                        api, f"bench-{secrets.token_hex(3)}", {"mirrorgate.io/mode": "enforce"}
                    )
                cert = kc.kubelet_pem(plane, workdir / "node-a.pem", "system:node:node-a")
                (first,) = kc.pod_tokens(plane, namespace, "node-a", image=IMAGE)
                deadline = time.monotonic() + 30
                while kc.run_plugin(setup, cert, first, IMAGE).returncode != 0:
                    if time.monotonic() > deadline:
                        raise SystemExit("kubelet_bench: the namespace never became enforced")
                    time.sleep(0.2)
                warm, cold = round_trips(setup, cert, namespace, args.pulls)
                cpus = sorted(os.sched_getaffinity(0))
                os.sched_setaffinity(setup.server.process.pid, {cpus[0]})
                if len(cpus) > 1:  # the clients off the server's CPU
                    os.sched_setaffinity(0, set(cpus[1:]))
                rate, answered = throughput(setup, cert, first, args.seconds)
            finally:
                setup.server.stop()
        finally:
            plane.stop()
    report = f"""\
| plugin round trip ({args.pulls} pulls each) | p50 | p99 |
| --- | --- | --- |
| warm verdict (kept) | {_ms(warm)} |
| cold verdict (a TokenReview each) | {_ms(cold)} |

Endpoint throughput, the server pinned to one CPU and the clients off it, warm
verdicts, 4 kept-alive clients: **{rate:,.0f} logins/s** ({answered:,} in
{args.seconds:.0f} s, every answer the login). A round trip is mostly the plugin's
own process start and TLS handshake (a new connection per pull, as the kubelet
runs it); a cold verdict adds the API server's TokenReview."""
    print(report)
    results.record("kubelet", report, command="python -m bench.kubelet_bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
