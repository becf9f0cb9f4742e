"""The real HTTPS server under abuse on loopback: what it holds, and whether it still answers.

Starts ``mirrorgate serve`` (the installed console script, its default
limits, the policy of :mod:`bench.server_bench`) and prints:

1. its RSS with 1,000 idle keep-alive TLS connections open (each has made
   one request, so only the idle timeout, 60 s, would close it), and again
   after they close;
2. the p50/p99 of an ordinary admission, over its own keep-alive connection,
   while those 1,000 connections are open;
3. the RSS growth after a flood of reviews each carrying a different 2.5 MB
   image (longer than any valid reference: each must be answered with a
   warning and kept in no memo), sent over a few keep-alive connections;
4. the entries of a file store after 20 ``mirrorgate credentials add``
   processes, released at the same instant, each added one to it.

Targets: <= 200 MB with 1,000 idle connections, <= 30 MB growth after the
flood, p99 <= 50 ms; all 21 entries (or every add not applied failed with a
message). Bounded in count and time; loopback only.

    python -m bench.abuse_bench [--check] [--idle N] [--flood N] [--time-cap SECONDS]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import pathlib
import secrets
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

import orjson

from bench import pods, results, server_bench
from bench.server_bench import Connection, http_request, percentile

__all__ = ["main"]

TARGETS = {"idle_rss_mb": 200.0, "flood_growth_mb": 30.0, "p99_ms": 50.0}
IMAGE_BYTES = int(2.5 * 1024 * 1024)
PLACEHOLDER = "IMAGE-PLACEHOLDER"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def settle(pid: int, seconds: float = 2.0) -> float:
    """RSS after ``seconds`` of quiet (the server frees what closes on its own schedule)."""
    time.sleep(seconds)
    return rss_mb(pid)


def in_threads(target: Callable[..., None], arguments: Sequence[tuple[object, ...]]) -> None:
    """Run ``target`` once per argument tuple, each in a thread of its own, and wait."""
    threads = [threading.Thread(target=target, args=args) for args in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def open_idle(port: int, context: ssl.SSLContext, count: int) -> list[Connection]:
    """``count`` keep-alive TLS connections, each after one GET /healthz (4 threads)."""
    opened: list[Connection] = []
    lock = threading.Lock()
    failures: list[str] = []

    def worker(share: int) -> None:
        for _ in range(share):
            try:
                connection = Connection(port, context)
                status, _ = connection.exchange(http_request("GET", "/healthz", port))
            except OSError as error:
                failures.append(repr(error))
                return
            if status != 200:
                failures.append(f"HTTP {status}")
            with lock:
                opened.append(connection)

    in_threads(worker, [(count // 4 + (i < count % 4),) for i in range(4)])
    if failures:
        raise SystemExit(f"opening idle connections failed: {failures[:3]}")
    return opened


def normal_latencies(port: int, context: ssl.SSLContext, count: int) -> list[float]:
    """Small admissions over one keep-alive connection, each checked for its patch."""
    requests = server_bench.bodies(server_bench.SIZES[0], port)
    tally = server_bench.Tally()
    connection = Connection(port, context)
    try:
        for i in range(count):
            payload, uid = requests[i % len(requests)]
            started = time.perf_counter()
            status, body = connection.exchange(payload)
            tally.latencies.append(time.perf_counter() - started)
            server_bench.check_response(status, body, uid, tally)
    finally:
        connection.close()
    if tally.errors:
        raise SystemExit(f"normal admissions failed: {tally.errors[:3]}")
    return tally.latencies


def flood_template() -> tuple[bytes, bytes]:
    """The review around the image: (before, after) the image's place."""
    body = pods.review_body([PLACEHOLDER], uid="flood-uid")
    before, _, after = body.partition(PLACEHOLDER.encode())
    return before, after


def flood(port: int, context: ssl.SSLContext, count: int, connections: int,
          deadline: float) -> int:
    """Reviews with unique 2.5 MB images; every answer must be allowed with a bounded warning."""
    before, after = flood_template()
    filler = b"a" * IMAGE_BYTES
    tickets = iter(range(count))
    lock = threading.Lock()
    sent = [0]
    failures: list[str] = []

    def worker() -> None:
        connection = Connection(port, context)
        try:
            while time.monotonic() < deadline:
                with lock:
                    ticket = next(tickets, None)
                if ticket is None:
                    return
                image = f"quay.io/prometheus/{ticket:08d}-".encode() + filler
                body = before + image + after
                status, answer = connection.exchange(http_request(
                    "POST", "/mutate?timeout=10s", port, body))
                response = orjson.loads(answer).get("response", {}) if status == 200 else {}
                warnings = response.get("warnings") or []
                if status != 200 or response.get("allowed") is not True or len(warnings) != 1 \
                        or len(warnings[0]) > 2_000 or "patch" in response:
                    failures.append(f"HTTP {status}: {answer[:200]!r}")
                    return
                with lock:
                    sent[0] += 1
        finally:
            connection.close()

    in_threads(worker, [()] * connections)
    if failures:
        raise SystemExit(f"flood answers were wrong: {failures[:3]}")
    return sent[0]


def release_together(processes: Sequence[subprocess.Popen[bytes]],
                     inputs: Sequence[bytes]) -> list[bytes]:
    """Give each process its standard input once all wait for it; their standard errors.

    Started one after the other, processes that load Python would otherwise
    reach their work one after the other too, and never meet. (A process
    given b"" is taken not to read its input, and not waited for.)
    """
    readers = [p for p, data in zip(processes, inputs, strict=True) if data]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
            pathlib.Path(f"/proc/{p.pid}/wchan").read_text().endswith("pipe_read")
            for p in readers):
        time.sleep(0.05)
    for process, data in zip(processes, inputs, strict=True):
        assert process.stdin is not None
        process.stdin.write(data)
        process.stdin.close()
    errors = []
    for process in processes:
        assert process.stderr is not None
        with process.stderr:
            errors.append(process.stderr.read())
        process.wait()
    return errors


def concurrent_credential_adds(count: int, python: str = sys.executable) -> dict[str, float]:
    """``count`` ``mirrorgate credentials add`` processes at once on a store of one entry.

    Each adds its own credential; what counts is how many entries the store
    holds afterwards (``count + 1`` when nothing is lost), and that every add
    not applied exited non-zero with a message.
    """
    from mirrorgate.webhook.credentials import filestore
    from mirrorgate.webhook.credentials.store import Credential

    with tempfile.TemporaryDirectory(prefix="mirrorgate-adds-") as tmp:
        key_text, store = filestore.generate_key(), str(pathlib.Path(tmp) / "store.json")
        key = base64.b64decode(key_text)
        first = Credential(name="first", registry="r.example", username="u",
                           password=secrets.token_urlsafe(12))
        filestore.write_store(store, key, filestore.StoreContents({}).replaced({"first": first}))
        started = time.monotonic()
        processes = [subprocess.Popen(
            [python, "-m", "mirrorgate.webhook.cli", "credentials", "add", f"add-{i}",
             "--registry", "r.example", "--username", "u", "--password-stdin", "--store", store],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp,
            env={**os.environ, filestore.KEY_ENV: key_text}) for i in range(count)]
        answers = release_together(processes, [f"{secrets.token_urlsafe(12)}\n".encode()
                                               for _ in processes])
        seconds = time.monotonic() - started
        entries = len(filestore.read_store(store, key).credentials)
    statuses = [process.returncode for process in processes]
    return {"entries": entries, "expected": count + 1, "exited_0": statuses.count(0),
            "failed": count - statuses.count(0), "seconds": seconds,
            "failed_silently": sum(1 for status, err in zip(statuses, answers, strict=True)
                                   if status != 0 and not err.strip())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.abuse_bench",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--idle", type=int, default=1000, help="idle connections to hold")
    parser.add_argument("--normal", type=int, default=2000, help="normal admissions timed")
    parser.add_argument("--flood", type=int, default=10_000, help="unique 2.5 MB reviews")
    parser.add_argument("--flood-connections", type=int, default=4)
    parser.add_argument("--time-cap", type=float, default=300.0, metavar="SECONDS",
                        help="upper bound of the flood (default: %(default)s)")
    parser.add_argument("--adds", type=int, default=20,
                        help="concurrent `credentials add` processes (default: %(default)s)")
    args = parser.parse_args(argv)
    adds = concurrent_credential_adds(args.adds)

    with tempfile.TemporaryDirectory(prefix="mirrorgate-abuse-") as tmp:
        workdir = pathlib.Path(tmp)
        context, tls_args = server_bench.serving_files(workdir, policy=server_bench.POLICY)
        port = server_bench.free_port()
        server = server_bench.start("mirrorgate", [
            str(pathlib.Path(sys.executable).parent / "mirrorgate"), "serve",
            "--policy", str(workdir / "policy.yaml"), *tls_args, "--port", str(port),
            # Its mirrors are fictional; bench.health_bench measures probing.
            "--no-health-probes"],
            port, workdir, context)
        pid = server.process.pid
        try:
            normal_latencies(port, context, 500)  # warm: memos, first-touch allocations
            baseline = settle(pid)
            quiet = normal_latencies(port, context, args.normal)

            started = time.monotonic()
            idle = open_idle(port, context, args.idle)
            opened_in = time.monotonic() - started
            with_idle = settle(pid, 1.0)
            loaded = normal_latencies(port, context, args.normal)
            still_open = sum(1 for c in idle if _alive(c))
            for connection in idle:
                connection.close()
            after_idle = settle(pid)

            before_flood = after_idle
            started = time.monotonic()
            sent = flood(port, context, args.flood, args.flood_connections,
                         started + args.time_cap)
            flood_seconds = time.monotonic() - started
            after_flood = settle(pid)
            admitted_after = normal_latencies(port, context, 200)
            errors = server.log.read_text().count('"level":"error"')
        finally:
            server_bench.stop_servers([server])

    growth = after_flood - before_flood
    p50, p99 = percentile(loaded, 0.5) * 1e3, percentile(loaded, 0.99) * 1e3
    with results.capture("abuse", command="make bench"):
        print("\nmirrorgate under abuse (real HTTPS server, loopback, default limits)\n")
        print("| measure | value | target |")
        print("| --- | ---: | ---: |")
        print(f"| RSS at rest (after 500 admissions) | {baseline:.1f} MB | |")
        print(f"| RSS with {args.idle:,} idle keep-alive TLS connections ({still_open:,} still "
              f"open after the timing; opened in {opened_in:.1f} s) | {with_idle:.1f} MB "
              f"| ≤ {TARGETS['idle_rss_mb']:.0f} MB |")
        print(f"| RSS after they closed | {after_idle:.1f} MB | |")
        print(f"| normal admission p50 / p99, no other clients | "
              f"{percentile(quiet, 0.5) * 1e3:.2f} / {percentile(quiet, 0.99) * 1e3:.2f} ms | |")
        print(f"| normal admission p50 / p99, {args.idle:,} idle connections open | "
              f"{p50:.2f} / {p99:.2f} ms | p99 ≤ {TARGETS['p99_ms']:.0f} ms |")
        print(f"| RSS growth after {sent:,} reviews with unique 2.5 MB images "
              f"({flood_seconds:.0f} s, {args.flood_connections} connections) | {growth:+.1f} MB "
              f"({before_flood:.1f} → {after_flood:.1f}) | ≤ {TARGETS['flood_growth_mb']:.0f} MB |")
        print(f"| {args.adds} concurrent `credentials add` to one store (real processes; "
              f"{adds['exited_0']} exited 0, {adds['failed']} failed with a message, in "
              f"{adds['seconds']:.1f} s) | {adds['entries']} entries | {adds['expected']} entries, "
              "or every add not applied fails with a message |")
        print(f"\nChecks: every flood answer allowed, unpatched, with one warning under 2,000 "
              f"characters; {len(admitted_after)} admissions after the flood patched correctly; "
              f"median normal latency {statistics.median(loaded) * 1e3:.2f} ms; "
              f"{errors} error log lines.")
        missed = []
        if with_idle > TARGETS["idle_rss_mb"]:
            missed.append("idle RSS")
        if growth > TARGETS["flood_growth_mb"]:
            missed.append("flood growth")
        if p99 > TARGETS["p99_ms"]:
            missed.append("p99")
        if adds["failed_silently"] or adds["entries"] != adds["expected"] - adds["failed"]:
            missed.append("concurrent adds")
        if sent < args.flood:
            print(f"(the flood stopped at the {args.time_cap:.0f} s cap after {sent:,} reviews)")
    if args.check and missed:
        print(f"FAIL: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


def _alive(connection: Connection) -> bool:
    """Whether the server still holds the connection (no EOF waiting on it)."""
    sock = connection.sock
    sock.setblocking(False)
    try:
        return bool(sock.recv(1)) or False
    except ssl.SSLWantReadError:
        return True
    except (OSError, ssl.SSLError):
        return False
    finally:
        with contextlib.suppress(OSError):
            sock.setblocking(True)


if __name__ == "__main__":
    sys.exit(main())
