"""The real HTTPS server under load on loopback, against a floor server on the same stack.

Starts ``mirrorgate serve`` (the installed console script, generated
certificates, a policy without credentials so that no pull secret is
involved and every image of every Pod is rewritten) and the floor
(:mod:`bench.floor_app`: same uvicorn options and TLS context, parses the
review, answers one fixed patch). A lean client of its own, blocking TLS
sockets with HTTP/1.1 keep-alive in a few threads, posts AdmissionReviews
of three sizes to each, alternating the servers round by round.

The figure that matters is server CPU time per admission, read from
``/proc/<pid>/stat`` (utime + stime of the whole server process) before and
after a fixed number of requests: unlike requests/s it does not depend on
how much of this 2-core machine the client or a neighbour takes, only
(through caches) a little on what they do. Reported: medians over rounds,
and mirrorgate / floor ratios, judged on the median of per-round ratios
(targets: <= 1.3x small and medium, <= 1.2x large).

Every mirrorgate response is decoded and its patch's image rewrites
counted, so an error path cannot pass for a fast one; the server's sockets
are checked for outbound connections (there should be none: no cluster is
configured).

    python -m bench.server_bench [--check] [--rounds N] [--connections N]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import itertools
import os
import pathlib
import select
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import orjson

from bench import pods, results
from mirrorgate import certs

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # loopback only, by design
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MIN_TICKS = 10

# Every image is under a rule, none needs a credential: all rewritten.
POLICY = """\
mirrors:
  - source: docker.io
    mirror: mirror.corp.example/dockerhub
  - source: quay.io
    mirror: mirror.corp.example/quay
  - source: ghcr.io
    mirror: mirror.corp.example/ghcr
exclude:
  namespaces: [mirrorgate]
"""
IMAGES = (
    "nginx:1.25.3",
    "quay.io/prometheus/node-exporter:v1.7.0",
    "ghcr.io/fluxcd/source-controller:v1.2.4",
    "bitnami/redis:7.2.4",
    "quay.io/jetstack/cert-manager-controller:v1.13.3",
    "docker.io/grafana/loki:2.9.4",
    "ghcr.io/dexidp/dex:v2.37.0",
    "busybox@" + pods.DIGEST,
)


@dataclasses.dataclass(frozen=True)
class Size:
    name: str
    containers: int
    target_bytes: int
    requests: int
    """Measured requests per run; the time cap below bounds it too."""


# Sized so that even the floor's run uses >= ~0.5 s of server CPU: /proc
# counts in 10 ms ticks, so that keeps the rounding under 2%.
SIZES = (
    Size("small", 1, 0, 3000),
    Size("medium", 5, 8 * 1024, 2500),
    Size("large", 20, 60 * 1024, 800),
)
TARGETS = {"small": 1.3, "medium": 1.3, "large": 1.2}
UID_VARIANTS = 64
"""Distinct bodies per size, cycled: the uid echo is checked on every response."""


# --- client -----------------------------------------------------------------


class Connection:
    """One keep-alive HTTPS connection speaking just enough HTTP/1.1 for this server."""

    def __init__(self, port: int, context: ssl.SSLContext, source: str | None = None) -> None:
        raw = socket.create_connection(
            (HOST, port), timeout=30, source_address=(source, 0) if source else None
        )
        # As the API server's Go client does; without it the small bodies
        # would wait on Nagle and the latencies would measure that instead.
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        self.buffer = bytearray()

    def _fill(self) -> None:
        chunk = self.sock.recv(262144)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buffer += chunk

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        """Send one request, return (status, body)."""
        self.sock.sendall(request)
        return self._answer()

    def exchange_reading_early(self, request: bytes, piece: int = 1 << 16) -> tuple[int, bytes]:
        """As :meth:`exchange`, but sent as HTTP clients such as Go's send a body: an answer
        that arrives while the request is still being sent (a refusal) ends the sending."""
        view = memoryview(request)
        for start in range(0, len(view), piece):
            if self._answer_arrived():
                break
            self.sock.sendall(view[start : start + piece])
        return self._answer()

    def _answer_arrived(self) -> bool:
        """Whether answer bytes have come (read into the buffer), without waiting."""
        if not self.sock.pending() and not select.select([self.sock], [], [], 0)[0]:
            return False
        timeout = self.sock.gettimeout()
        self.sock.setblocking(False)
        try:
            chunk = self.sock.recv(262144)
        except ssl.SSLWantReadError:  # TLS records that carry no data (session tickets)
            return False
        finally:
            self.sock.settimeout(timeout)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buffer += chunk
        return True

    def _answer(self) -> tuple[int, bytes]:
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._fill()
        head = bytes(self.buffer[:end]).lower()
        del self.buffer[: end + 4]
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise ConnectionError("response without Content-Length")
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : stop if stop > 0 else len(head)])
        while len(self.buffer) < length:
            self._fill()
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return int(head[9:12]), body

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def http_request(method: str, path: str, port: int, body: bytes = b"") -> bytes:
    # What the API server sends, near enough (it also gzips nothing).
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        "User-Agent: kube-apiserver-admission\r\nAccept: application/json, */*\r\n"
        "Accept-Encoding: gzip\r\n"
    )
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


@dataclasses.dataclass
class Tally:
    latencies: list[float] = dataclasses.field(default_factory=list)
    rewrites: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)


def check_response(status: int, body: bytes, uid: str, tally: Tally) -> None:
    """Decode the answer; count its image rewrites; note anything but a patched 200."""
    if status != 200:
        tally.errors.append(f"HTTP {status}: {body[:200]!r}")
        return
    response = orjson.loads(body).get("response", {})
    if response.get("uid") != uid or response.get("allowed") is not True:
        tally.errors.append(f"bad response: {body[:200]!r}")
        return
    if "patch" not in response:
        tally.errors.append(f"no patch: {body[:200]!r}")
        return
    operations = orjson.loads(base64.b64decode(response["patch"]))
    tally.rewrites += sum(1 for op in operations if op["path"].endswith("/image"))


def drive(
    connections: Sequence[Connection],
    requests: Sequence[tuple[bytes, str]],
    count: int,
    deadline: float,
) -> tuple[Tally, int]:
    """``count`` requests over ``connections`` in parallel (closed loop); (tally, sent)."""
    tickets = itertools.count()  # next() on it is atomic under the GIL
    tallies = [Tally() for _ in connections]

    def worker(connection: Connection, tally: Tally) -> None:
        clock = time.perf_counter
        for ticket in tickets:
            if ticket >= count or clock() > deadline:
                return
            payload, uid = requests[ticket % len(requests)]
            started = clock()
            try:
                status, body = connection.exchange(payload)
            except OSError as error:
                tally.errors.append(f"{type(error).__name__}: {error}")
                return
            tally.latencies.append(clock() - started)
            check_response(status, body, uid, tally)

    threads = [
        threading.Thread(target=worker, args=pair, daemon=True)
        for pair in zip(connections, tallies, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = Tally()
    for tally in tallies:
        total.latencies += tally.latencies
        total.rewrites += tally.rewrites
        total.errors += tally.errors
    return total, len(total.latencies)


# --- servers ----------------------------------------------------------------


@dataclasses.dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: pathlib.Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def start(
    name: str, argv: list[str], port: int, workdir: pathlib.Path, context: ssl.SSLContext
) -> Server:
    log = workdir / f"{name}.log"
    with log.open("wb") as sink:
        # stderr to a file, as a container runtime collects it: mirrorgate's
        # one log line per admission is part of what it costs.
        process = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT
        )
    server = Server(name=name, port=port, process=process, log=log)
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited with {process.returncode}:\n{log.read_text()}")
        try:
            connection = Connection(port, context)
            status, _ = connection.exchange(http_request("GET", "/healthz", port))
            connection.close()
            if status == 200:
                return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"{name} did not become ready in 30 s:\n{log.read_text()}")
        time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def outbound_sockets(pid: int, listen_port: int) -> list[str]:
    """The process's TCP/UDP sockets not on its listening port: outbound connections."""
    inodes: set[str] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/{pid}/net/{table}", encoding="ascii") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[9] in inodes and int(fields[1].rsplit(":", 1)[1], 16) != listen_port:
                    found.append(f"{table} {fields[1]} -> {fields[2]}")
    return found


# --- the benchmark ----------------------------------------------------------


@dataclasses.dataclass
class Run:
    server: str
    size: str
    requests: int
    seconds: float
    cpu: float
    client_cpu: float
    latencies: list[float]
    rewrites: int

    @property
    def cpu_per_request(self) -> float:
        return self.cpu / self.requests

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def measure(
    server: Server,
    size: Size,
    requests: Sequence[tuple[bytes, str]],
    context: ssl.SSLContext,
    *,
    connections: int,
    warmup: int,
    time_cap: float,
) -> Run:
    pool = [Connection(server.port, context) for _ in range(connections)]
    try:
        # Handshakes, first-touch allocations and the policy memo happen here,
        # outside the measured window, as they do once per connection in life.
        warm, _ = drive(pool, requests, warmup, time.perf_counter() + time_cap)
        if warm.errors:
            raise SystemExit(f"{server.name}/{size.name} warm-up failed: {warm.errors[:3]}")
        cpu_before, client_before = cpu_seconds(server.process.pid), time.process_time()
        started = time.perf_counter()
        tally, sent = drive(pool, requests, size.requests, started + time_cap)
        seconds = time.perf_counter() - started
        cpu = cpu_seconds(server.process.pid) - cpu_before
        client_cpu = time.process_time() - client_before
        if tally.errors:
            raise SystemExit(
                f"{server.name}/{size.name}: {len(tally.errors)} bad responses, "
                f"e.g. {tally.errors[:3]}"
            )
        if cpu * CLOCK_TICKS < MIN_TICKS:
            # /proc counts in clock ticks (10 ms): a shorter run measures noise, or zero.
            raise SystemExit(
                f"{server.name}/{size.name}: {sent} requests used under "
                f"{MIN_TICKS} clock ticks of CPU, too few to measure; raise --scale"
            )
        if server.name == "mirrorgate":
            outbound = outbound_sockets(server.process.pid, server.port)
            if outbound:
                raise SystemExit(f"mirrorgate made outbound connections: {outbound}")
    finally:
        for connection in pool:
            connection.close()
    return Run(
        server=server.name,
        size=size.name,
        requests=sent,
        seconds=seconds,
        cpu=cpu,
        client_cpu=client_cpu,
        latencies=tally.latencies,
        rewrites=tally.rewrites,
    )


def bodies(size: Size, port: int) -> list[tuple[bytes, str]]:
    images = list(itertools.islice(itertools.cycle(IMAGES), size.containers))
    out = []
    for i in range(UID_VARIANTS):
        uid = f"7c9e6679-7425-40de-944b-e07fc1f9{i:04d}"
        body = pods.review_body(images, uid=uid, target_bytes=size.target_bytes)
        out.append((http_request("POST", "/mutate?timeout=10s", port, body), uid))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(
    runs: Sequence[Run], body_bytes: dict[str, int], *, rounds: int, connections: int
) -> dict[str, float]:
    """Print the Markdown tables; return mirrorgate / floor CPU ratios by size."""
    print(
        f"\nHTTPS admission on loopback: {connections} keep-alive connections, closed loop; "
        f"medians of {rounds} alternating rounds (p50/p99 over all rounds' requests)\n"
    )
    print("| body | server | req/s | p50 ms | p99 ms | server CPU µs / admission |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    cpu: dict[tuple[str, str], float] = {}
    for size in SIZES:
        for name in ("floor", "mirrorgate"):
            mine = [r for r in runs if r.server == name and r.size == size.name]
            latencies = [x for r in mine for x in r.latencies]
            cpu[(name, size.name)] = statistics.median(r.cpu_per_request for r in mine)
            label = (
                f"{size.name} ({size.containers} container"
                f"{'s' if size.containers != 1 else ''}, "
                f"{body_bytes[size.name] / 1024:.1f} KB)"
            )
            print(
                f"| {label} | {name} | {statistics.median(r.rate for r in mine):,.0f} | "
                f"{percentile(latencies, 0.5) * 1e3:.2f} | "
                f"{percentile(latencies, 0.99) * 1e3:.2f} | "
                f"{cpu[(name, size.name)] * 1e6:,.0f} |"
            )
    print(
        "\n| body | mirrorgate / floor CPU per admission: median of per-round ratios "
        "| ratio of medians | target | |"
    )
    print("| --- | ---: | ---: | ---: | --- |")
    ratios = {}
    for size in SIZES:
        ratio = cpu[("mirrorgate", size.name)] / cpu[("floor", size.name)]
        # The two runs of a round are back to back, so their ratio cancels
        # slow drifts in machine load that the medians of each may not.
        paired = statistics.median(
            m.cpu_per_request / f.cpu_per_request
            for m, f in zip(
                [r for r in runs if r.server == "mirrorgate" and r.size == size.name],
                [r for r in runs if r.server == "floor" and r.size == size.name],
                strict=True,
            )
        )
        ratios[size.name] = paired
        verdict = "met" if paired <= TARGETS[size.name] else "**missed**"
        print(
            f"| {size.name} | {paired:.2f}× | {ratio:.2f}× | ≤ {TARGETS[size.name]}× | {verdict} |"
        )
    return ratios


def stop_servers(servers: Sequence[Server]) -> None:
    """Terminate every server, then reap each (killing any that will not stop)."""
    for server in servers:
        server.process.terminate()
    for server in servers:
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def serving_files(workdir: pathlib.Path, *, policy: str) -> tuple[ssl.SSLContext, list[str]]:
    """Certificates and the policy in ``workdir``; the client context and the servers' flags."""
    ca = certs.CertificateAuthority.generate()
    serving = ca.issue_serving(dns_names=["localhost"], ips=[HOST])
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    (workdir / "tls.crt").write_bytes(serving.cert_pem)
    (workdir / "tls.key").write_bytes(serving.key_pem)
    (workdir / "policy.yaml").write_text(policy)
    context = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context, [
        "--tls-cert",
        str(workdir / "tls.crt"),
        "--tls-key",
        str(workdir / "tls.key"),
        "--host",
        HOST,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.server_bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    # Many short alternating rounds rather than a few long ones: neighbours'
    # load on this shared machine comes and goes within seconds, and a pair
    # of runs back to back sees the same of it.
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply the request counts (default: %(default)s)",
    )
    parser.add_argument(
        "--time-cap",
        type=float,
        default=6.0,
        metavar="SECONDS",
        help="upper bound of one measured run (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="mirrorgate's --log-level; `warning` drops the per-admission log "
        "line, to see what it costs (default: %(default)s, as deployed)",
    )
    args = parser.parse_args(argv)
    sizes = [dataclasses.replace(s, requests=max(50, int(s.requests * args.scale))) for s in SIZES]

    with tempfile.TemporaryDirectory(prefix="mirrorgate-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        context, tls_args = serving_files(workdir, policy=POLICY)

        mirrorgate_port, floor_port = free_port(), free_port()
        servers: list[Server] = []
        try:
            servers.append(
                start(
                    "mirrorgate",
                    [
                        str(pathlib.Path(sys.executable).parent / "mirrorgate"),
                        "serve",
                        "--policy",
                        str(workdir / "policy.yaml"),
                        *tls_args,
                        "--port",
                        str(mirrorgate_port),
                        "--log-level",
                        args.log_level,
                        # Its mirrors are fictional; bench.health_bench measures probing.
                        "--no-health-probes",
                    ],
                    mirrorgate_port,
                    workdir,
                    context,
                )
            )
            servers.append(
                start(
                    "floor",
                    [sys.executable, "-m", "bench.floor_app", *tls_args, "--port", str(floor_port)],
                    floor_port,
                    workdir,
                    context,
                )
            )
            by_name = {s.name: s for s in servers}
            requests = {
                (s.name, size.name): bodies(size, s.port) for s in servers for size in sizes
            }
            body_bytes = {size.name: len(requests[("floor", size.name)][0][0]) for size in sizes}

            runs: list[Run] = []
            for round_ in range(args.rounds):
                for size in sizes:
                    # ABBA: which server goes first flips every round, so a
                    # drift in machine load weighs on both alike.
                    order = ("floor", "mirrorgate") if round_ % 2 == 0 else ("mirrorgate", "floor")
                    for name in order:
                        run = measure(
                            by_name[name],
                            size,
                            requests[(name, size.name)],
                            context,
                            connections=args.connections,
                            warmup=max(50, size.requests // 10),
                            time_cap=args.time_cap,
                        )
                        if name == "mirrorgate" and run.rewrites != run.requests * size.containers:
                            raise SystemExit(
                                f"mirrorgate rewrote {run.rewrites} images in "
                                f"{run.requests} {size.name} reviews; expected "
                                f"{size.containers} each"
                            )
                        runs.append(run)
                        print(
                            f"round {round_ + 1} {size.name:6} {name:10} "
                            f"{run.requests:5} req  {run.rate:7,.0f} req/s  "
                            f"server {run.cpu_per_request * 1e6:6,.0f} µs/req  "
                            f"client {run.client_cpu / run.requests * 1e6:5,.0f} µs/req",
                            file=sys.stderr,
                            flush=True,
                        )
            mirrorgate_log = by_name["mirrorgate"].log.read_text()
        finally:
            stop_servers(servers)

    with results.capture("server", command="make bench"):
        ratios = report(runs, body_bytes, rounds=args.rounds, connections=args.connections)
        if args.log_level != "info":
            print(f"\n(mirrorgate ran with --log-level {args.log_level}, not as deployed)")
        checked = [r for r in runs if r.server == "mirrorgate"]
        problems = [
            line
            for line in mirrorgate_log.splitlines()
            if '"level":"error"' in line or '"level":"warning"' in line
        ]
        print(
            f"\nChecks: {sum(r.rewrites for r in checked):,} image rewrites counted in "
            f"{sum(r.requests for r in checked):,} mirrorgate responses (every one patched, "
            f"uid echoed); no outbound sockets on the mirrorgate process (standalone: no "
            f"cluster configured); {len(problems)} warning/error log lines."
        )
    return exit_status(
        [name for name, ratio in ratios.items() if ratio > TARGETS[name]], check=args.check
    )


def exit_status(missed: Sequence[str], *, check: bool) -> int:
    """1 when ``--check`` was asked for and a target was ``missed`` (named on stderr)."""
    if check and missed:
        print(f"FAIL: CPU ratio target missed for {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
