"""Policy-queue flood: six callers flood /validate-policy while another writes the policy.

Starts ``mirrorgate serve`` (this one, or ``--baseline-server``: the ``mirrorgate``
script of an earlier version, e.g. a worktree of main, run in the same sitting) on
loopback with its default limits. Six flooding processes, each from a loopback
address of its own (127.0.0.11-16: the server tells callers apart by address), each
keep four connections sending reviews of a valid 120 KB policy back to back. Beside
them a legitimate caller (127.0.0.2) sends one update of a 16 KB policy after another
(judged in the review worker, as the flood's), as the API server would for ``kubectl
apply``; the same caller alone just before is the baseline.

Targets (issue 29): 0 legitimate policy updates refused unjudged (HTTP 429 or a
"was not judged" denial), each answered within the webhook's 5 s; the flood's own
answers within 5 s too.

    python -m bench.policy_queue_bench [--check] [--seconds S] [--baseline-server PATH]

``run`` and ``report`` are what ``bench.abuse_bench`` calls to add it to its run.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import pathlib
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import orjson

from bench import results, server_bench
from bench.server_bench import Connection, http_request, percentile

__all__ = ["Flood", "main", "report", "run"]

FLOODERS = 6
CONNECTIONS_PER_FLOODER = 4
FLOOD_POLICY_BYTES = 120 * 1024
LEGITIMATE = "127.0.0.2"
WEBHOOK_TIMEOUT = 5.0
UPDATE_POLICY_BYTES = 16 * 1024
"""What the legitimate caller writes: a valid policy of this size, over the 8 KiB past
which a review is judged in the review worker, as the flood's are."""


class SourcedConnection(Connection):
    """A keep-alive HTTPS connection from a loopback address of its own."""

    def __init__(self, port: int, context: ssl.SSLContext, source: str) -> None:
        raw = socket.create_connection(
            (server_bench.HOST, port), timeout=30, source_address=(source, 0)
        )
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        self.buffer = bytearray()


def unjudged(status: int, answer: bytes) -> bool:
    """Whether the policy was refused without being judged (the queue was full)."""
    if status == 429:
        return True
    if status != 200:
        return False
    response = orjson.loads(answer).get("response", {})
    message = (response.get("status") or {}).get("message", "")
    return response.get("allowed") is False and "not judged" in message


def _abuse() -> Any:
    """bench.abuse_bench, imported when used: it may import this module at its top."""
    from bench import abuse_bench

    return abuse_bench


def _flooder(port: int, cafile: str, source: str, seconds: float, answers: Any) -> None:
    """One flooding caller: its connections, in threads, back to back (a process of its own)."""
    import threading

    policy, _ = _abuse().valid_rules(FLOOD_POLICY_BYTES)
    context = ssl.create_default_context(cafile=cafile)
    found: list[tuple[float, bool]] = []
    end = time.monotonic() + seconds

    def one(k: int) -> None:
        body = _abuse().policy_review_body(policy, f"flood-{k}")
        request = http_request("POST", "/validate-policy?timeout=5s", port, body)
        connection = SourcedConnection(port, context, source)
        try:
            while time.monotonic() < end:
                started = time.perf_counter()
                status, answer = connection.exchange(request)
                found.append((time.perf_counter() - started, unjudged(status, answer)))
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(k,)) for k in range(CONNECTIONS_PER_FLOODER)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    answers.put(found)


def _updates(port: int, context: ssl.SSLContext, until: float) -> list[tuple[float, bool, str]]:
    """The legitimate caller's updates until ``until``: latency, refused unjudged, outcome."""
    abuse = _abuse()
    policy, _ = abuse.valid_rules(UPDATE_POLICY_BYTES)
    connection = SourcedConnection(port, context, LEGITIMATE)
    found = []
    try:
        turn = 0
        while time.monotonic() < until:
            body = abuse.policy_review_body(policy, f"update-{turn}")
            started = time.perf_counter()
            status, answer = connection.exchange(
                http_request("POST", "/validate-policy?timeout=5s", port, body)
            )
            allowed = status == 200 and orjson.loads(answer)["response"]["allowed"] is True
            found.append(
                (time.perf_counter() - started, unjudged(status, answer), str(allowed).lower())
            )
            turn += 1
            time.sleep(0.05)
    finally:
        connection.close()
    return found


@dataclasses.dataclass
class Flood:
    server: str
    baseline: list[tuple[float, bool, str]]
    beside: list[tuple[float, bool, str]]
    flood: list[tuple[float, bool]]


def run(seconds: float, executable: str | None = None, name: str = "this") -> Flood:
    """The legitimate caller alone, then beside the flood, against ``executable``."""
    with tempfile.TemporaryDirectory(prefix="mirrorgate-policy-queue-") as tmp:
        workdir = pathlib.Path(tmp)
        context, server = _abuse().serve_plainly(workdir, executable)
        spawn = multiprocessing.get_context("spawn")
        answers = spawn.Queue()
        flooders = [
            spawn.Process(
                target=_flooder,
                args=(server.port, str(workdir / "ca.crt"), f"127.0.0.{11 + i}", seconds, answers),
            )
            for i in range(FLOODERS)
        ]
        try:
            baseline = _updates(server.port, context, time.monotonic() + min(seconds, 5.0))
            for flooder in flooders:
                flooder.start()
            time.sleep(2.0)  # the flooders have loaded Python and filled the queue
            beside = _updates(server.port, context, time.monotonic() + seconds - 3.0)
            flood = [answer for _ in flooders for answer in answers.get(timeout=120)]
            for flooder in flooders:
                flooder.join()
        finally:
            for flooder in flooders:
                if flooder.is_alive():
                    flooder.kill()
            server_bench.stop_servers([server])
    return Flood(name, baseline, beside, flood)


def _ms(values: Sequence[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:,.0f}" if values else "-"


def report(runs: Sequence[Flood], *, seconds: float) -> list[str]:
    """Print the table (one column per server); the targets the first run missed."""
    print(
        f"\nPolicy-queue flood: {FLOODERS} callers (each its own loopback address, "
        f"{CONNECTIONS_PER_FLOODER} connections) send reviews of a valid "
        f"{FLOOD_POLICY_BYTES >> 10} KB policy back to back for {seconds:.0f} s, beside one "
        f"caller writing a {UPDATE_POLICY_BYTES >> 10} KB policy; its baseline is the same "
        "caller alone just before (real HTTPS server, loopback, default limits)\n"
    )
    print("| measure | " + " | ".join(r.server for r in runs) + " | target |")
    print("| --- | " + " | ".join("---" for _ in runs) + " | --- |")

    def row(measure: str, cells: Sequence[str], target: str = "") -> None:
        print(f"| {measure} | " + " | ".join(cells) + f" | {target} |")

    def updates(found: Sequence[tuple[float, bool, str]]) -> str:
        latencies = [latency for latency, _, _ in found]
        return (
            f"{sum(1 for _, refused, _ in found if refused)} of {len(found)} refused unjudged; "
            f"p50 / max {_ms(latencies, 0.5)} / {max(latencies, default=0) * 1e3:,.0f} ms"
        )

    row("legitimate updates alone", [updates(r.baseline) for r in runs], "0 refused")
    row(
        "legitimate updates beside the flood",
        [updates(r.beside) for r in runs],
        f"0 refused unjudged, each within {WEBHOOK_TIMEOUT:.0f} s",
    )
    row(
        "flood reviews: judged / refused unjudged; p50 / max",
        [
            f"{sum(1 for _, refused in r.flood if not refused):,} / "
            f"{sum(1 for _, refused in r.flood if refused):,}; "
            f"{_ms([latency for latency, _ in r.flood], 0.5)} / "
            f"{max((latency for latency, _ in r.flood), default=0) * 1e3:,.0f} ms"
            for r in runs
        ],
        f"each within {WEBHOOK_TIMEOUT:.0f} s",
    )
    first = runs[0]
    missed = []
    if not first.beside or any(refused for _, refused, _ in first.beside):
        missed.append("policy-queue flood: legitimate updates refused unjudged")
    if any(latency > WEBHOOK_TIMEOUT for latency, _, _ in first.beside):
        missed.append("policy-queue flood: legitimate updates past the webhook's timeout")
    if any(latency > WEBHOOK_TIMEOUT for latency, _ in first.flood):
        missed.append("policy-queue flood: the flood's answers past the webhook's timeout")
    if any(outcome != "true" for _, refused, outcome in first.beside if not refused):
        missed.append("policy-queue flood: a legitimate update judged wrong")
    return missed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.policy_queue_bench")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the flood lasts")
    parser.add_argument(
        "--baseline-server", metavar="PATH", help="an earlier `mirrorgate` script, run too"
    )
    args = parser.parse_args(argv)
    runs = [run(args.seconds)]
    if args.baseline_server:
        runs.append(run(args.seconds, args.baseline_server, "baseline"))
    with results.capture("abuse-policy-queue", command="make bench-abuse"):
        missed = report(runs, seconds=args.seconds)
    for miss in missed:
        print(f"MISSED: {miss}", file=sys.stderr)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
