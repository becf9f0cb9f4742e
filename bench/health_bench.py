"""What background health probing costs admission: mirrorgate with probes on against probes off.

Two ``mirrorgate serve`` processes on the same policy, whose three mirrors are
paths on one real TLS mirror on loopback (Debian's docker-registry, from the
e2e suite's helpers): one probes it (``health.interval`` 1s, ten times the
default rate), the other runs with ``--no-health-probes``. The lean client
of :mod:`bench.server_bench` posts AdmissionReviews of three sizes to each,
alternating the servers round by round (ABBA), and server CPU per admission
is read from ``/proc/<pid>/stat``. Target: probes on ≤ 1.05× probes off
(median of per-round ratios).

No admission makes a network call, shown two ways: the mirror's access log
counts every request mirrorgate sends it (its probes carry the user agent
``mirrorgate-health``) during the measured windows, to compare with the
probe rounds those windows allow and with the admissions answered; and the
probes-off server has no outbound socket after each window.

    python -m bench.health_bench [--check] [--rounds N] [--scale X]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

from bench import results, server_bench
from bench.server_bench import (
    SIZES,
    Run,
    Server,
    Size,
    free_port,
    measure,
    serving_files,
    start,
)
from tests.e2e.harness.registry import RegistryStack, start_registry_stack

INTERVAL = 1.0
TARGET = 1.05
ON, OFF = "probes-on", "probes-off"


def bench_policy(mirror: str) -> str:
    return (
        f"health: {{interval: {int(INTERVAL * 1000)}ms, timeout: 500ms}}\n"
        f"mirrors:\n"
        f"  - source: docker.io\n    mirror: {mirror}/dockerhub\n"
        f"  - source: quay.io\n    mirror: {mirror}/quay\n"
        f"  - source: ghcr.io\n    mirror: {mirror}/ghcr\n"
        f"exclude:\n  namespaces: [mirrorgate]\n"
    )


def probe_requests(stack: RegistryStack) -> int:
    """Requests the mirror has logged from mirrorgate's probes so far."""
    total = 0
    for process in stack.processes:
        if process.name == "registry-mirror":
            process.log_tail(1)
            total += process.log_path.read_text(errors="replace").count('"mirrorgate-health"')
    return total


@dataclasses.dataclass
class Window:
    seconds: float = 0.0
    admissions: int = 0
    probes: int = 0
    rounds: int = 0
    """Probe rounds that can start within the windows: one per interval, plus one each."""


def report(
    runs: Sequence[Run], sizes: Sequence[Size], window: Window, *, rounds: int, connections: int
) -> list[str]:
    """Print the Markdown report; return the sizes that missed the target."""
    print(
        f"Health probing on (interval {INTERVAL:g}s, one mirror host) against off: "
        f"{connections} connections, {rounds} alternating rounds\n"
    )
    print(
        "| body | probes off µs | probes on µs | on / off (median of per-round ratios) | target |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    missed = []
    for size in sizes:
        on = [r for r in runs if r.server == ON and r.size == size.name]
        off = [r for r in runs if r.server == OFF and r.size == size.name]
        paired = statistics.median(
            a.cpu_per_request / b.cpu_per_request for a, b in zip(on, off, strict=True)
        )
        if paired > TARGET:
            missed.append(size.name)
        print(
            f"| {size.name} | {statistics.median(r.cpu_per_request for r in off) * 1e6:,.0f} | "
            f"{statistics.median(r.cpu_per_request for r in on) * 1e6:,.0f} | {paired:.3f}× | "
            f"≤ {TARGET}× |"
        )
    print(
        f"\nNo network call per admission: during the {window.seconds:.1f} s in which the "
        f"probing server answered {window.admissions:,} admissions (warm-ups included), "
        f"the mirror logged "
        f"{window.probes} requests from mirrorgate's probes (at most {window.rounds} probe "
        f"rounds fit in that time); the probes-off server had no outbound socket."
    )
    return missed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.health_bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=4)
    # /proc counts CPU in 10 ms ticks: at make bench's request counts a medium
    # run is about 25 ticks, so one tick more or less is a 4% ratio. Four times
    # the requests keep the rounding near 1%, which a 1.05x target needs.
    parser.add_argument("--scale", type=float, default=4.0)
    parser.add_argument("--time-cap", type=float, default=6.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    sizes = [dataclasses.replace(s, requests=max(50, int(s.requests * args.scale))) for s in SIZES]
    with tempfile.TemporaryDirectory(prefix="mirrorgate-health-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        stack = start_registry_stack(workdir / "registry")
        servers: list[Server] = []
        try:
            context, tls_args = serving_files(workdir, policy=bench_policy(stack.host))
            # The servers inherit it: the probing one trusts the mirror's CA.
            os.environ["SSL_CERT_FILE"] = str(stack.ca_path)
            program = str(pathlib.Path(sys.executable).parent / "mirrorgate")
            for name, extra in ((ON, []), (OFF, ["--no-health-probes"])):
                port = free_port()
                servers.append(
                    start(
                        name,
                        [
                            program,
                            "serve",
                            "--policy",
                            str(workdir / "policy.yaml"),
                            *tls_args,
                            "--port",
                            str(port),
                            *extra,
                        ],
                        port,
                        workdir,
                        context,
                    )
                )
            by_name = {s.name: s for s in servers}
            requests = {
                (s.name, size.name): server_bench.bodies(size, s.port)
                for s in servers
                for size in sizes
            }
            runs: list[Run] = []
            window = Window()
            for round_ in range(args.rounds):
                for size in sizes:
                    order = (OFF, ON) if round_ % 2 == 0 else (ON, OFF)
                    for name in order:
                        server = by_name[name]
                        warmup = max(50, size.requests // 10)
                        before, began = probe_requests(stack), time.monotonic()
                        run = measure(
                            server,
                            size,
                            requests[(name, size.name)],
                            context,
                            connections=args.connections,
                            warmup=warmup,
                            time_cap=args.time_cap,
                        )
                        if run.rewrites != run.requests * size.containers:
                            raise SystemExit(
                                f"{name} rewrote {run.rewrites} images in "
                                f"{run.requests} reviews: a mirror was not up"
                            )
                        if name == ON:
                            # The whole call: the warm-up's admissions count too.
                            seconds = time.monotonic() - began
                            window.seconds += seconds
                            window.admissions += run.requests + warmup
                            window.probes += probe_requests(stack) - before
                            window.rounds += int(seconds / INTERVAL) + 1
                        else:
                            outbound = server_bench.outbound_sockets(
                                server.process.pid, server.port
                            )
                            if outbound:
                                raise SystemExit(f"{OFF} made outbound connections: {outbound}")
                        runs.append(run)
                        print(
                            f"round {round_ + 1} {size.name:6} {name:10} {run.requests:5} req "
                            f"server {run.cpu_per_request * 1e6:6,.0f} µs/req",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            server_bench.stop_servers(servers)
            stack.stop()

    with results.capture("health", command="make bench-health"):
        missed = report(runs, sizes, window, rounds=args.rounds, connections=args.connections)
    if window.probes > window.rounds:
        print(f"FAIL: {window.probes} probe requests in {window.rounds} rounds", file=sys.stderr)
        return 1
    return server_bench.exit_status(missed, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
