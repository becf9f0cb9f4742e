"""Admission with generated pull secrets, against a real etcd + kube-apiserver on loopback.

Everything runs for this benchmark alone and is stopped at the end: etcd and
kube-apiserver (``tests.e2e.harness.controlplane``, with an audit log of every request
made by mirrorgate's ServiceAccount), ``mirrorgate serve`` as ``make bench``
starts it plus ``--kubeconfig`` (a client certificate for
``system:serviceaccount:mirrorgate:mirrorgate``, so the RBAC of
``manifests/base`` is all it gets), ``--namespace mirrorgate`` and
``--store kubernetes`` (the central credential is the Secret
``mirrorgate/bench-mirror``; no registry exists, none is contacted), and the
floor app of :mod:`bench.floor_app`. The policy is ``make bench``'s with every
mirror needing that credential, granted to every namespace.

Part 1, steady-state cost. The AdmissionReviews of ``make bench`` (small,
medium, large; namespace ``team-a``, labelled ``mirrorgate.io/mode=enforce``)
are posted straight to ``/mutate`` once the Secret ``mirrorgate-bench-mirror``
exists there (made by a warm-up admission, then read back through the API).
Server CPU per admission, mirrorgate vs floor, in alternating rounds, exactly
as :mod:`bench.server_bench` measures it (its functions, its targets). A
third server in the same rounds, mirrorgate exactly as ``make bench`` runs it
(no cluster, no credential), shows what the pull-secret path adds on its own,
paired round by round so that the machine's load weighs on both alike. That
the steady-state path calls no Kubernetes API is checked three ways over the
timed window: ``mirrorgate_pull_secret_writes_total`` does not move; the API
server's audit log holds no get/create/patch/delete of a Secret by
mirrorgate's identity (its updates are the leader's periodic re-assertion of
each copy, listed apart); every image of every response is rewritten (each
needs the credential, so a rewrite means the pull secret was there). Other
requests of that identity in the window (Lease renewals every 5 s, informer
re-watches every 60 s) are background work and are listed, not hidden.

Part 2, what a Pod waits for. mirrorgate is registered with the
MutatingWebhookConfiguration of ``manifests/base``; N new namespaces labelled
``enforce`` and N unlabelled ones (no webhook is called for those: the
baseline) each get a first and a second Pod through ``create_namespaced_pod``,
and so do N more enforce namespaces whose Pod's image is under a rule of a
credential with ``delivery: kubelet`` (``bench-kubelet``), interleaved so that
drift weighs on all six series alike. A first Pod in an enforce namespace
includes mirrorgate creating ``mirrorgate-bench-mirror`` synchronously; a
second one finds it in the informer cache; a ``delivery: kubelet`` Pod needs
no Secret at all (no API call on its admission path), and none is made. Sequential, one
request at a time: this is latency, not throughput. With N=40 the p99 is the
largest sample; it is labelled so. Even without any webhook a first Pod is
slow here (~50-90 ms against ~6 ms for the next): the API server's
LimitRanger plugin looks a namespace with no LimitRange up live (a namespace
that has one is fast from its first Pod); both series pay it alike.

    python -m bench.secrets_bench [--check] [--rounds N] [--namespaces N]
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import pathlib
import secrets
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import orjson
from kubernetes import client as k8s

from bench import pods, results, server_bench
from bench.server_bench import HOST, Connection, Run, Server, http_request
from mirrorgate import policy
from tests.e2e.harness import controlplane, dockerconfig
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import built_binary
from tests.e2e.harness.kube import create_namespace

CREDENTIAL = "bench-mirror"
SECRET = policy.pull_secret_name(CREDENTIAL)
MIRROR_HOST = "mirror.corp.example"
# A credential the node's plugin delivers: its images are rewritten, no Secret is made.
KUBELET_CREDENTIAL = "bench-kubelet"
KUBELET_SOURCE = "registry.kubelet.example"
MODE_LABEL = "mirrorgate.io/mode"
MANAGED_BY = "app.kubernetes.io/managed-by"
# The namespace pods.pod() writes into make bench's bodies: reused as they are.
STEADY_NAMESPACE = "team-a"

# make bench's policy with a credential on every rule: each image needs the pull secret.
POLICY = f"""\
mirrors:
  - source: docker.io
    mirror: {MIRROR_HOST}/dockerhub
    credential: {CREDENTIAL}
  - source: quay.io
    mirror: {MIRROR_HOST}/quay
    credential: {CREDENTIAL}
  - source: ghcr.io
    mirror: {MIRROR_HOST}/ghcr
    credential: {CREDENTIAL}
  - source: {KUBELET_SOURCE}
    mirror: {MIRROR_HOST}/kubelet
    credential: {KUBELET_CREDENTIAL}
credentials:
  {CREDENTIAL}: {{namespaces: ['*']}}
  {KUBELET_CREDENTIAL}: {{namespaces: ['*'], delivery: kubelet}}
exclude:
  namespaces: [mirrorgate]
"""

# Metadata level, mirrorgate's identity only: every request it makes is one
# event, and nobody else's requests (the bench's own) slow the API server.
AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["{mg.SERVICE_ACCOUNT_USER}"]
  - level: None
"""
# The floor, mirrorgate with pull secrets, and mirrorgate exactly as make bench
# runs it (no cluster, no credential): the last two in the same rounds show
# what the pull-secret path adds, whatever the machine's load does to both.
SERVERS = ("floor", "mirrorgate", "standalone")
SECRET_VERBS = frozenset({"get", "create", "update", "patch", "delete"})


# --- a control plane with an audit log -----------------------------------------


def start_audited_control_plane(
    workdir: pathlib.Path,
) -> tuple[controlplane.ControlPlane, pathlib.Path]:
    """``start_control_plane`` as the e2e suite runs it, plus an audit log."""
    workdir.mkdir(parents=True, exist_ok=True)
    audit_policy = workdir / "audit-policy.yaml"
    audit_policy.write_text(AUDIT_POLICY)
    audit_log = workdir / "audit.log"
    plane = controlplane.start_control_plane(
        workdir / "controlplane",
        apiserver_args=[
            f"--audit-policy-file={audit_policy}",
            f"--audit-log-path={audit_log}",
            # Each event is written before the response goes out: the log is
            # complete the moment a timed window closes.
            "--audit-log-mode=blocking",
        ],
    )
    return plane, audit_log


@dataclasses.dataclass(frozen=True)
class AuditEvent:
    verb: str
    resource: str
    namespace: str
    name: str
    received: float
    """requestReceivedTimestamp as a Unix time."""


def audit_events(path: pathlib.Path) -> list[AuditEvent]:
    """mirrorgate's requests in the audit log, one per auditID (a watch has two stages)."""
    seen: set[str] = set()
    found: list[AuditEvent] = []
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        event = orjson.loads(line)
        if (
            event.get("user", {}).get("username") != mg.SERVICE_ACCOUNT_USER
            or event["auditID"] in seen
        ):
            continue
        seen.add(event["auditID"])
        ref = event.get("objectRef") or {}
        received = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"])
        found.append(
            AuditEvent(
                verb=event["verb"],
                resource=ref.get("resource", ""),
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                received=received.timestamp(),
            )
        )
    return found


def between(events: Sequence[AuditEvent], start: float, end: float) -> list[AuditEvent]:
    return [e for e in events if start <= e.received <= end]


def secret_calls(events: Sequence[AuditEvent]) -> list[AuditEvent]:
    return [e for e in events if e.resource == "secrets" and e.verb in SECRET_VERBS]


def tally(events: Sequence[AuditEvent]) -> str:
    counts: dict[str, int] = {}
    for event in events:
        key = f"{event.verb} {event.resource}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"


# --- mirrorgate over HTTPS -----------------------------------------------------


def get(server: Server, context: ssl.SSLContext, path: str) -> tuple[int, bytes]:
    connection = Connection(server.port, context)
    try:
        return connection.exchange(http_request("GET", path, server.port))
    finally:
        connection.close()


def wait_ready(server: Server, context: ssl.SSLContext, timeout: float = 30.0) -> None:
    """/readyz, not only /healthz: the informers must have synced before the first admission."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = get(server, context, "/readyz")
        if status == 200:
            return
        if time.monotonic() > deadline or server.process.poll() is not None:
            raise SystemExit(f"mirrorgate not ready: {body[:300]!r}\n{server.log.read_text()}")
        time.sleep(0.1)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """What :func:`tests.e2e.harness.mirrorgate.register` reads of a server: where, and its CA."""

    url: str
    ca_pem: bytes


def pull_secret_writes(server: Server, context: ssl.SSLContext) -> dict[str, float]:
    """``mirrorgate_pull_secret_writes_total`` by action, from mirrorgate's /metrics."""
    status, body = get(server, context, "/metrics")
    if status != 200:
        raise SystemExit(f"/metrics answered {status}")
    writes = {}
    prefix = "mirrorgate_pull_secret_writes_total{"
    for line in body.decode().splitlines():
        if line.startswith(prefix):
            labels, value = line[len(prefix) :].split("} ")
            writes[labels.split('"')[1]] = float(value)
    return writes


def pull_secret_names(body: bytes) -> list[str]:
    """The Secret names a response's patch adds to spec.imagePullSecrets."""
    response = orjson.loads(body)["response"]
    operations = orjson.loads(base64.b64decode(response.get("patch", "W10=")))
    names = []
    for op in operations:
        if op["path"] == "/spec/imagePullSecrets":
            names += [entry["name"] for entry in op["value"]]
        elif op["path"] == "/spec/imagePullSecrets/-":
            names.append(op["value"]["name"])
    return names


def outbound_not_to(pid: int, listen_port: int, allowed_port: int) -> list[str]:
    """mirrorgate's outbound sockets that lead anywhere but the API server."""
    return [
        s
        for s in server_bench.outbound_sockets(pid, listen_port)
        if int(s.rsplit(":", 1)[1], 16) != allowed_port
    ]


# --- part 1: steady state --------------------------------------------------------


@dataclasses.dataclass
class SteadyState:
    runs: list[Run]
    body_bytes: dict[str, int]
    writes_before: dict[str, float]
    writes_after: dict[str, float]
    window: list[AuditEvent]
    seconds: float


def steady_state(
    args: argparse.Namespace,
    by_name: Mapping[str, Server],
    context: ssl.SSLContext,
    api: k8s.ApiClient,
    audit_log: pathlib.Path,
    apiserver_port: int,
) -> SteadyState:
    sizes = [
        dataclasses.replace(s, requests=max(50, int(s.requests * args.scale)))
        for s in server_bench.SIZES
    ]
    requests = {
        (name, size.name): server_bench.bodies(size, server.port)
        for name, server in by_name.items()
        for size in sizes
    }
    body_bytes = {size.name: len(requests[("floor", size.name)][0][0]) for size in sizes}
    mirrorgate = by_name["mirrorgate"]

    # One admission per size before anything is timed: the first makes the
    # Secret (mirrorgate's only write of part 1); each must add it to the Pod.
    for size in sizes:
        connection = Connection(mirrorgate.port, context)
        try:
            payload, _ = requests[("mirrorgate", size.name)][0]
            status, body = connection.exchange(payload)
        finally:
            connection.close()
        if status != 200 or pull_secret_names(body) != [SECRET]:
            raise SystemExit(
                f"{size.name} warm-up: no imagePullSecrets op for {SECRET}: "
                f"HTTP {status} {body[:300]!r}"
            )
    metadata = k8s.CoreV1Api(api).read_namespaced_secret(SECRET, STEADY_NAMESPACE).metadata
    labels = (metadata.labels if metadata is not None else None) or {}
    if labels.get(MANAGED_BY) != "mirrorgate":
        raise SystemExit(f"{STEADY_NAMESPACE}/{SECRET} is not mirrorgate's: {labels}")

    writes_before = pull_secret_writes(mirrorgate, context)
    started = time.time()
    runs: list[Run] = []
    for round_ in range(args.rounds):
        for size in sizes:
            # ABC CBA: the order flips every round, as in make bench.
            order = SERVERS if round_ % 2 == 0 else SERVERS[::-1]
            for name in order:
                # measure() demands no outbound socket of a server named
                # "mirrorgate": right for the standalone one, while this one
                # keeps its watches open to the API server (checked below).
                measured_as = {"standalone": "mirrorgate", "mirrorgate": "mirrorgate-k8s"}
                server = dataclasses.replace(by_name[name], name=measured_as.get(name, name))
                run = server_bench.measure(
                    server,
                    size,
                    requests[(name, size.name)],
                    context,
                    connections=args.connections,
                    warmup=max(50, size.requests // 10),
                    time_cap=args.time_cap,
                )
                run = dataclasses.replace(run, server=name)
                if name != "floor" and run.rewrites != run.requests * size.containers:
                    raise SystemExit(
                        f"{name} rewrote {run.rewrites} images in "
                        f"{run.requests} {size.name} reviews; expected "
                        f"{size.containers} each (pull secret unavailable?)"
                    )
                if name == "mirrorgate":
                    stray = outbound_not_to(mirrorgate.process.pid, mirrorgate.port, apiserver_port)
                    if stray:
                        raise SystemExit(f"mirrorgate connected elsewhere: {stray}")
                runs.append(run)
                print(
                    f"round {round_ + 1} {size.name:6} {name:10} "
                    f"{run.requests:5} req  {run.rate:7,.0f} req/s  "
                    f"server {run.cpu_per_request * 1e6:6,.0f} µs/req",
                    file=sys.stderr,
                    flush=True,
                )
    ended = time.time()
    writes_after = pull_secret_writes(mirrorgate, context)
    time.sleep(0.2)  # blocking audit mode: written already; this is only slack for clocks
    window = between(audit_events(audit_log), started, ended)
    return SteadyState(
        runs=runs,
        body_bytes=body_bytes,
        writes_before=writes_before,
        writes_after=writes_after,
        window=window,
        seconds=ended - started,
    )


# --- part 2: Pod creation through the API server ---------------------------------


@dataclasses.dataclass
class Latencies:
    baseline_first: list[float] = dataclasses.field(default_factory=list)
    baseline_second: list[float] = dataclasses.field(default_factory=list)
    webhook_first: list[float] = dataclasses.field(default_factory=list)
    webhook_second: list[float] = dataclasses.field(default_factory=list)
    kubelet_first: list[float] = dataclasses.field(default_factory=list)
    kubelet_second: list[float] = dataclasses.field(default_factory=list)
    secret_creates: int = 0
    other_secret_calls: list[AuditEvent] = dataclasses.field(default_factory=list)
    new_namespaces: list[str] = dataclasses.field(default_factory=list)
    kubelet_namespaces: list[str] = dataclasses.field(default_factory=list)


def pod_body(namespace: str, name: str, images: Sequence[str]) -> dict[str, Any]:
    """make bench's Pod, made creatable: a fixed name and the namespace's `default` SA."""
    body = pods.pod(images, namespace=namespace)
    body["metadata"].pop("generateName")
    body["metadata"]["name"] = name
    body["spec"]["serviceAccountName"] = "default"  # the only ServiceAccount there is
    del body["status"]
    return body


def create_pod(core: k8s.CoreV1Api, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds the API server took to admit and store ``body``, and the stored Pod."""
    namespace = body["metadata"]["namespace"]
    started = time.perf_counter()
    # Raw response: decoding into generated models costs milliseconds of
    # client CPU that would blur the difference being measured.
    # (The client takes plain dicts at run time and then returns the urllib3
    # response; its annotations say V1Pod for both.)
    response: Any = core.create_namespaced_pod(namespace, body, _preload_content=False)  # type: ignore[arg-type]
    seconds = time.perf_counter() - started
    return seconds, cast("dict[str, Any]", orjson.loads(response.data))


def check_pod(stored: Mapping[str, Any], *, rewritten: bool, secret: bool = True) -> None:
    """Rewritten (with the pull secret attached, unless ``secret`` is false: the kubelet
    delivers it), or untouched."""
    spec = stored["spec"]
    images = [c["image"] for c in spec["containers"]]
    secrets_ = [s["name"] for s in spec.get("imagePullSecrets") or []]
    where = f"{stored['metadata']['namespace']}/{stored['metadata']['name']}"
    if rewritten and (
        secrets_ != ([SECRET] if secret else [])
        or not all(i.startswith(f"{MIRROR_HOST}/") for i in images)
    ):
        raise SystemExit(f"{where} was not rewritten: {images} {secrets_}")
    if not rewritten and (secrets_ or any(i.startswith(f"{MIRROR_HOST}/") for i in images)):
        raise SystemExit(f"{where} was touched without a webhook: {images} {secrets_}")


def first_pods(
    args: argparse.Namespace,
    api: k8s.ApiClient,
    kustomize: pathlib.Path,
    endpoint: mg.Endpoint,
    audit_log: pathlib.Path,
) -> Latencies:
    core = k8s.CoreV1Api(api)
    images = list(server_bench.IMAGES[: args.containers])
    # Namespaces are made up front and untimed: the figure is the Pod's wait.
    enforce = [
        create_namespace(api, f"bench-new-{i:03d}", {MODE_LABEL: "enforce"})
        for i in range(args.namespaces + 1)
    ]
    plain = [create_namespace(api, f"bench-plain-{i:03d}") for i in range(args.namespaces + 1)]
    kubelet = [
        create_namespace(api, f"bench-kubelet-{i:03d}", {MODE_LABEL: "enforce"})
        for i in range(args.namespaces + 1)
    ]
    # The same Pod, its images under the kubelet-delivered credential's rule.
    kubelet_images = [f"{KUBELET_SOURCE}/{image.rpartition('/')[2]}" for image in images]
    mg.register(api, mg.webhook_configuration(kustomize), endpoint)
    time.sleep(1.0)  # the API server picks up webhook configurations from an informer

    # (namespace, images, rewritten, pull secret attached) of each kind.
    kinds = {
        "plain": (plain, images, False, False),
        "enforce": (enforce, images, True, True),
        "kubelet": (kubelet, kubelet_images, True, False),
    }
    # Index 0 of each is a warm-up (connections from the API server to
    # mirrorgate, mirrorgate's first create of part 2): run, checked, not kept.
    for namespaces, pod_images, rewritten, secret in kinds.values():
        for name in ("first", "second"):
            stored = create_pod(core, pod_body(namespaces[0], name, pod_images))[1]
            check_pod(stored, rewritten=rewritten, secret=secret)

    out = Latencies(new_namespaces=enforce[1:], kubelet_namespaces=kubelet[1:])
    series = {
        ("plain", "first"): out.baseline_first,
        ("enforce", "first"): out.webhook_first,
        ("kubelet", "first"): out.kubelet_first,
        ("plain", "second"): out.baseline_second,
        ("enforce", "second"): out.webhook_second,
        ("kubelet", "second"): out.kubelet_second,
    }
    order = list(kinds)
    started = time.time()
    for i in range(1, args.namespaces + 1):
        # First Pods always precede second ones; which kind goes first rotates.
        turn = order[i % 3 :] + order[: i % 3]
        for name in ("first", "second"):
            bodies = [(kind, pod_body(kinds[kind][0][i], name, kinds[kind][1])) for kind in turn]
            for kind, body in bodies:
                seconds, stored = create_pod(core, body)
                check_pod(stored, rewritten=kinds[kind][2], secret=kinds[kind][3])
                series[(kind, name)].append(seconds)
    ended = time.time()
    time.sleep(0.2)
    calls = secret_calls(between(audit_events(audit_log), started, ended))
    out.secret_creates = sum(1 for e in calls if e.verb == "create")
    out.other_secret_calls = [e for e in calls if e.verb != "create"]
    for namespace in out.new_namespaces:
        found = (
            k8s.CoreV1Api(api)
            .list_namespaced_secret(namespace, label_selector=f"{MANAGED_BY}=mirrorgate")
            .items
        )
        if [s.metadata.name for s in found if s.metadata is not None] != [SECRET]:
            raise SystemExit(f"{namespace}: generated Secrets {found!r}")
    for namespace in out.kubelet_namespaces:
        found = k8s.CoreV1Api(api).list_namespaced_secret(namespace).items
        if found:
            raise SystemExit(f"{namespace}: Secrets under delivery: kubelet {found!r}")
    return out


def admission_durations(log: str, lat: Latencies) -> dict[str, list[float]]:
    """mirrorgate's own time per admission (its log's duration_ms), by Pod name, and
    ``kubelet first`` / ``kubelet second`` for the namespaces of the kubelet delivery."""
    kinds = {
        **dict.fromkeys(lat.new_namespaces, ""),
        **dict.fromkeys(lat.kubelet_namespaces, "kubelet "),
    }
    found: dict[str, list[float]] = {
        key: [] for key in ("first", "second", "kubelet first", "kubelet second")
    }
    for line in log.splitlines():
        if '"msg":"admission"' not in line:
            continue
        entry = orjson.loads(line)
        prefix = kinds.get(entry.get("namespace"))
        if prefix is not None:
            found.setdefault(prefix + entry["pod"], []).append(entry["duration_ms"] / 1e3)
    return found


# --- report -------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def report_steady(state: SteadyState, args: argparse.Namespace) -> dict[str, float]:
    print("\n### Steady state: admission with pull secrets (Secret already in the namespace)")
    ratios = server_bench.report(
        state.runs, state.body_bytes, rounds=args.rounds, connections=args.connections
    )
    print(
        "\n| body | mirrorgate with pull secrets / as in make bench (no cluster, no "
        "credential), CPU per admission: median of per-round ratios | added µs "
        "(median of per-round differences) |"
    )
    print("| --- | ---: | ---: |")
    for size in server_bench.SIZES:
        mine = {
            name: [
                r.cpu_per_request for r in state.runs if r.server == name and r.size == size.name
            ]
            for name in ("mirrorgate", "standalone")
        }
        pairs = list(zip(mine["mirrorgate"], mine["standalone"], strict=True))
        paired = statistics.median(a / b for a, b in pairs)
        added = statistics.median(a - b for a, b in pairs)
        print(f"| {size.name} | {paired:.2f}× | {added * 1e6:+,.0f} |")
    moved = {
        k: state.writes_after.get(k, 0) - state.writes_before.get(k, 0)
        for k in {*state.writes_before, *state.writes_after}
    }
    secret_window = secret_calls(state.window)
    admissions = sum(r.requests for r in state.runs if r.server == "mirrorgate")
    print(
        f"\n| over the timed window ({state.seconds:.0f} s, {admissions:,} mirrorgate "
        "admissions) | count |"
    )
    print("| --- | ---: |")
    print(f"| `mirrorgate_pull_secret_writes_total` change | {sum(moved.values()):g} |")
    # The leader re-asserts every copy once per --reconcile-interval (30 s): a PUT
    # of unchanged contents, background work that no admission waits for.
    reasserted = [e for e in secret_window if e.verb == "update"]
    print(
        f"| Secret get/create/patch/delete by mirrorgate (API server audit log) "
        f"| {len(secret_window) - len(reasserted)} |"
    )
    print(
        f"| Secret update by mirrorgate (the leader's periodic re-assertion) | {len(reasserted)} |"
    )
    print(f"| any request by mirrorgate (audit log) | {len(state.window)} |")
    print(
        f"\nmirrorgate's requests in the window, all background: {tally(state.window)} "
        "(Lease renewal every 5 s; re-assertion of each copy every 30 s; informer "
        "watches re-opened every 60 s)."
    )
    return ratios


def report_latency(
    lat: Latencies, durations: Mapping[str, list[float]], args: argparse.Namespace
) -> None:
    n = args.namespaces
    pct = server_bench.percentile
    print(
        f"\n### Pod creation through the API server ({n} namespaces of each kind, "
        f"{args.containers}-container Pod, sequential)\n"
    )
    print(f"| Pod | namespace | p50 ms | p90 ms | p99 ms (= max of {n}) |")
    print("| --- | --- | ---: | ---: | ---: |")
    rows = (
        ("first", "no webhook (baseline)", lat.baseline_first),
        ("first", "mirrorgate, Secret created", lat.webhook_first),
        ("first", "mirrorgate, delivery: kubelet (no Secret)", lat.kubelet_first),
        ("second", "no webhook (baseline)", lat.baseline_second),
        ("second", "mirrorgate, Secret cached", lat.webhook_second),
        ("second", "mirrorgate, delivery: kubelet (no Secret)", lat.kubelet_second),
    )
    for pod, kind, series in rows:
        print(
            f"| {pod} | {kind} | {ms(pct(series, 0.5))} | {ms(pct(series, 0.9))} | "
            f"{ms(pct(series, 0.99))} |"
        )
    print(
        "\n| Pod | added by mirrorgate, p50 | p50 ratio | added, p99 (max) "
        "| mirrorgate's own time p50 / max ms |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for pod, webhook, baseline, own in (
        ("first (new namespace)", lat.webhook_first, lat.baseline_first, durations["first"]),
        (
            "first, delivery: kubelet",
            lat.kubelet_first,
            lat.baseline_first,
            durations["kubelet first"],
        ),
        ("second", lat.webhook_second, lat.baseline_second, durations["second"]),
    ):
        print(
            f"| {pod} | +{ms(pct(webhook, 0.5) - pct(baseline, 0.5))} ms | "
            f"{pct(webhook, 0.5) / pct(baseline, 0.5):.2f}× | "
            f"+{ms(pct(webhook, 0.99) - pct(baseline, 0.99))} ms | "
            f"{ms(pct(own, 0.5)) if own else '?'} / {ms(max(own)) if own else '?'} |"
        )
    extra = (
        f"; other Secret calls: {tally(lat.other_secret_calls)}"
        if lat.other_secret_calls
        else "; no other Secret call"
    )
    print(
        "\n| first Pod of a new enforce namespace | p50 ms | p99 ms (max) |\n| --- | ---: | ---: |"
    )
    for kind, series in (
        ("delivery: pullSecret (Secret created)", lat.webhook_first),
        ("delivery: kubelet (no Secret)", lat.kubelet_first),
    ):
        print(f"| {kind} | {ms(pct(series, 0.5))} | {ms(pct(series, 0.99))} |")
    ratio = pct(lat.kubelet_first, 0.5) / pct(lat.webhook_first, 0.5)
    print(f"| kubelet / pullSecret, p50 | {ratio:.2f}× | |")
    print(
        f"\nAudit log over the timed Pods: {lat.secret_creates} Secret creates by mirrorgate "
        f"for {n} new namespaces of a pullSecret credential and {n} of a kubelet one{extra}. "
        "Every Pod checked: images rewritten in enforce namespaces, with imagePullSecrets "
        "for pullSecret and none for kubelet (whose namespaces hold no Secret), untouched "
        "in the others."
    )


# --- main -------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.secrets_bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a CPU ratio target is missed"
    )
    # As make bench; with three servers a round takes ~8 s, and the whole
    # run stays near 2 minutes.
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply make bench's request counts (default: %(default)s)",
    )
    parser.add_argument("--time-cap", type=float, default=6.0, metavar="SECONDS")
    parser.add_argument(
        "--namespaces",
        type=int,
        default=40,
        help="new namespaces per kind in part 2 (default: %(default)s)",
    )
    parser.add_argument(
        "--containers",
        type=int,
        default=1,
        choices=range(1, 9),
        help="containers of part 2's Pod (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    kustomize = built_binary("kustomize")

    with tempfile.TemporaryDirectory(prefix="mirrorgate-secrets-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        context, tls_args = server_bench.serving_files(workdir, policy=POLICY)

        plane, audit_log = start_audited_control_plane(workdir / "cluster")
        servers: list[Server] = []
        try:
            apiserver_port = int(plane.url.rsplit(":", 1)[1])
            api = plane.api_client()
            mg.install_base(api, kustomize)
            # What `kubectl create secret docker-registry NAME ...` makes, for both
            # credentials (the kubelet-delivered one is in the store too, for the
            # plugin's endpoint; admission never reads it); a throwaway password,
            # since no registry ever sees it.
            for name in (CREDENTIAL, KUBELET_CREDENTIAL):
                payload = orjson.dumps(
                    dockerconfig.encode(MIRROR_HOST, name, secrets.token_urlsafe(16))
                )
                k8s.CoreV1Api(api).create_namespaced_secret(
                    mg.NAMESPACE,
                    k8s.V1Secret(
                        metadata=k8s.V1ObjectMeta(name=name, namespace=mg.NAMESPACE),
                        type="kubernetes.io/dockerconfigjson",
                        data={".dockerconfigjson": base64.b64encode(payload).decode()},
                    ),
                )
            create_namespace(api, STEADY_NAMESPACE, {MODE_LABEL: "enforce"})
            kubeconfig = plane.kubeconfig_for(mg.SERVICE_ACCOUNT_USER, mg.SERVICE_ACCOUNT_GROUPS)

            mirrorgate_port, floor_port, standalone_port = (
                server_bench.free_port() for _ in range(3)
            )
            # As make bench starts it (console script, default reload interval,
            # stderr to a file), plus the cluster flags.
            servers.append(
                server_bench.start(
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
                        "info",
                        "--kubeconfig",
                        str(kubeconfig),
                        "--namespace",
                        mg.NAMESPACE,
                        "--store",
                        "kubernetes",
                        # Its mirrors are fictional; bench.health_bench measures probing.
                        "--no-health-probes",
                    ],
                    mirrorgate_port,
                    workdir,
                    context,
                )
            )
            servers.append(
                server_bench.start(
                    "floor",
                    [sys.executable, "-m", "bench.floor_app", *tls_args, "--port", str(floor_port)],
                    floor_port,
                    workdir,
                    context,
                )
            )
            (workdir / "standalone.yaml").write_text(server_bench.POLICY)
            servers.append(
                server_bench.start(
                    "standalone",
                    [
                        str(pathlib.Path(sys.executable).parent / "mirrorgate"),
                        "serve",
                        "--policy",
                        str(workdir / "standalone.yaml"),
                        *tls_args,
                        "--port",
                        str(standalone_port),
                        "--log-level",
                        "info",
                        "--no-health-probes",
                    ],
                    standalone_port,
                    workdir,
                    context,
                )
            )
            by_name = {s.name: s for s in servers}
            wait_ready(by_name["mirrorgate"], context)
            ready = time.monotonic() - began
            print(f"cluster and servers ready in {ready:.0f} s", file=sys.stderr)

            state = steady_state(args, by_name, context, api, audit_log, apiserver_port)
            part1 = time.monotonic() - began
            endpoint = Endpoint(
                url=f"https://{HOST}:{mirrorgate_port}", ca_pem=(workdir / "ca.crt").read_bytes()
            )
            latencies = first_pods(args, api, kustomize, endpoint, audit_log)
            writes = pull_secret_writes(by_name["mirrorgate"], context)
        finally:
            server_bench.stop_servers(servers)
            plane.stop()
        log = by_name["mirrorgate"].log.read_text()

    problems = [
        line
        for line in log.splitlines()
        if '"level":"error"' in line or '"level":"warning"' in line
    ]
    with results.capture("secrets", command="make bench-secrets"):
        ratios = report_steady(state, args)
        report_latency(latencies, admission_durations(log, latencies), args)
        print(
            f"\nmirrorgate over the whole run: pull secret writes {writes}; "
            f"{len(problems)} warning/error log lines. Total {time.monotonic() - began:.0f} s "
            f"(start-up {ready:.0f} s, steady state {part1 - ready:.0f} s)."
        )
    for line in problems[:5]:
        print(f"  {line[:300]}", file=sys.stderr)
    return server_bench.exit_status(
        [name for name, ratio in ratios.items() if ratio > server_bench.TARGETS[name]],
        check=args.check,
    )


if __name__ == "__main__":
    sys.exit(main())
