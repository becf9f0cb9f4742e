"""Where mirrorgate's per-admission CPU goes, on the in-process ASGI path (no TLS, no socket).

TLS, HTTP parsing and the event loop cost mirrorgate and the floor the same
(`make bench` runs both under one uvicorn configuration), so the difference
between them lives in the application. This calls both ASGI apps directly
with the bodies `make bench` posts and reports:

* CPU µs per admission for the floor, mirrorgate, and mirrorgate with its
  per-admission log line and/or metrics switched off at run time (an
  ablation: the deltas are what those features cost per request);
* a cProfile of mirrorgate: the top functions by own time and by
  cumulative time, in µs per admission.

    python -m bench.profile_server [--requests N] [--size small|medium|large]

Nothing outside this process is changed: the switches are attribute
assignments on this process's objects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import itertools
import logging
import pathlib
import pstats
import sys
import tempfile
import time
import timeit
from collections.abc import Awaitable, Callable, Coroutine, Iterator, MutableMapping
from typing import Any

import orjson

from bench import floor_app, pods, server_bench
from mirrorgate import certs, policy
from mirrorgate.webhook import admission, logs, patch, review
from mirrorgate.webhook.admission import Decision
from mirrorgate.webhook.commands.serve import settings, wiring

Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]


async def call(app: ASGIApp, body: bytes) -> bytes:
    """One POST /mutate through the app, as uvicorn would make it; returns the body."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "https",
        "path": "/mutate",
        "raw_path": b"/mutate",
        "query_string": b"timeout=10s",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8443"),
            (b"user-agent", b"kube-apiserver-admission"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8443),
        "state": {},
    }
    delivered = False
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return b"".join(chunks)


def cpu_per_call(app: ASGIApp, bodies: list[bytes], count: int) -> float:
    """CPU seconds per admission over ``count`` calls (after a warm-up)."""

    async def loop(n: int) -> None:
        for body in itertools.islice(itertools.cycle(bodies), n):
            await call(app, body)

    asyncio.run(loop(100))
    started = time.thread_time()
    asyncio.run(loop(count))
    return (time.thread_time() - started) / count


@contextlib.contextmanager
def mirrorgate_app(workdir: pathlib.Path) -> Iterator[wiring.Server]:
    ca = certs.CertificateAuthority.generate()
    serving = ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])
    (workdir / "tls.crt").write_bytes(serving.cert_pem)
    (workdir / "tls.key").write_bytes(serving.key_pem)
    (workdir / "policy.yaml").write_text(server_bench.POLICY)
    yield wiring.build(
        settings.Settings(
            policy=str(workdir / "policy.yaml"),
            tls_cert=str(workdir / "tls.crt"),
            tls_key=str(workdir / "tls.key"),
        )
    )


def run_to_end(coroutine: Coroutine[Any, Any, admission.Decision]) -> admission.Decision:
    """Finish a coroutine that never suspends (admit without credentials) without a loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: admission.Decision = done.value
        return result
    raise AssertionError("admit suspended")


def stage_costs(built: wiring.Server, body: bytes) -> list[tuple[str, float]]:
    """CPU µs of each step of one admission, each timed alone in a hot loop.

    Hot loops flatter: caches stay warm that the server's interleaving of
    TLS, HTTP parsing and the event loop cools. Read these as a lower bound
    and for their proportions; the ASGI table above is the sum as it runs.
    """
    rules = built.runtime.policy.policy
    secrets = built.runtime.secrets
    rev = review.decode(body)
    obj = rev.request["object"]
    namespace = obj["metadata"]["namespace"]
    decision = run_to_end(admission.admit(rev, rules=rules, mode="enforce", secrets=secrets))
    plan = policy.plan(obj, namespace=namespace, policy=rules)
    encoded = patch.encoded_patch(obj, plan)
    logger = logging.getLogger("mirrorgate")
    fields = {
        "uid": rev.uid,
        "namespace": namespace,
        "pod": decision.name,
        "endpoint": "mutate",
        "mode": "enforce",
        "outcome": decision.outcome,
        "rewrites": decision.rewrites,
        "warnings": 0,
        "dry_run": False,
        "policy": built.runtime.policy.version,
        "duration_ms": 0.412,
    }
    steps: list[tuple[str, Callable[[], object]]] = [
        ("orjson.loads (the floor pays it too)", lambda: orjson.loads(body)),
        ("review.decode (loads + checks)", lambda: review.decode(body)),
        (
            "admission.admit, all of it",
            lambda: run_to_end(
                admission.admit(
                    review.Review(rev.api_version, rev.request),
                    rules=rules,
                    mode="enforce",
                    secrets=secrets,
                )
            ),
        ),
        ("  policy.plan", lambda: policy.plan(obj, namespace=namespace, policy=rules)),
        ("    policy.find_image_sites", lambda: policy.find_image_sites(obj)),
        (
            "  patch.build_patch (the patch JSON and base64 build it)",
            lambda: patch.build_patch(obj, plan),
        ),
        ("  patch.encoded_patch (memoised per plan)", lambda: patch.encoded_patch(obj, plan)),
        ("  admission._audit_log_annotations", lambda: admission._audit_log_annotations(plan)),
        ("  review.patched", lambda: review.patched(rev, encoded)),
        (
            "the admission log line (logger.info)",
            lambda: logger.info("admission", extra={"fields": fields}),
        ),
        ("metrics.record", lambda: built.runtime.metrics.record("mutate", decision, 0.000412)),
        ("orjson.dumps(response)", lambda: orjson.dumps(decision.body)),
    ]
    costs = []
    for name, step in steps:
        number = max(
            20,
            int(
                0.02
                / max(
                    1e-7, min(timeit.repeat(step, number=20, repeat=1, timer=time.thread_time)) / 20
                )
            ),
        )
        best = min(timeit.repeat(step, number=number, repeat=5, timer=time.thread_time))
        costs.append((name, best / number * 1e6))
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_server")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--size", choices=[s.name for s in server_bench.SIZES], default="small")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    size = next(s for s in server_bench.SIZES if s.name == args.size)
    images = list(itertools.islice(itertools.cycle(server_bench.IMAGES), size.containers))
    bodies = [
        pods.review_body(
            images, uid=f"7c9e6679-7425-40de-944b-e07fc1f9{i:04d}", target_bytes=size.target_bytes
        )
        for i in range(64)
    ]

    with (
        tempfile.TemporaryDirectory(prefix="mirrorgate-profile-") as tmp,
        open(pathlib.Path(tmp) / "server.log", "w") as log_sink,
        mirrorgate_app(pathlib.Path(tmp)) as built,
    ):
        # The log line goes to a file, as `make bench` sends the server's stderr.
        real_stderr, sys.stderr = sys.stderr, log_sink
        try:
            logs.configure("info")
        finally:
            sys.stderr = real_stderr
        mirrorgate: ASGIApp = built.application
        floor: ASGIApp = floor_app.create_app()
        metrics = built.runtime.metrics
        record = metrics.record
        logger = logging.getLogger("mirrorgate")

        def no_record(endpoint: str, decision: Decision, seconds: float) -> None:
            return None

        def configure(log_line: bool, metrics_on: bool) -> None:
            logger.disabled = not log_line
            metrics.record = record if metrics_on else no_record  # type: ignore[method-assign]

        variants: dict[str, tuple[ASGIApp, bool, bool]] = {
            "floor": (floor, True, True),
            "mirrorgate": (mirrorgate, True, True),
            "mirrorgate, no log line": (mirrorgate, False, True),
            "mirrorgate, no metrics": (mirrorgate, True, False),
            "mirrorgate, no log line, no metrics": (mirrorgate, False, False),
        }
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            # Interleaved and repeated, min taken: the machine is shared and
            # noisy, and each variant must see the same noise.
            for name, (app, log_line, metrics_on) in variants.items():
                configure(log_line, metrics_on)
                samples[name].append(cpu_per_call(app, bodies, args.requests))
        configure(True, True)
        results = {name: min(values) for name, values in samples.items()}

        print(
            f"In-process ASGI, {size.name} body ({len(bodies[0]):,} bytes), "
            f"{args.requests:,} admissions, CPU µs per admission (min of {args.repeats})\n"
        )
        print("| app | µs / admission | above floor |")
        print("| --- | ---: | ---: |")
        for name, seconds in results.items():
            print(f"| {name} | {seconds * 1e6:.1f} | {(seconds - results['floor']) * 1e6:+.1f} |")

        print(
            f"\nSteps of one admission, {size.name} body, each alone in a hot loop "
            "(CPU µs, min of 5)\n"
        )
        print("| step | µs |")
        print("| --- | ---: |")
        for name, micros in stage_costs(built, bodies[0]):
            print(f"| {name} | {micros:.1f} |")

        profiler = cProfile.Profile()

        async def profiled() -> None:
            for body in itertools.islice(itertools.cycle(bodies), args.requests):
                await call(mirrorgate, body)

        asyncio.run(profiled())  # warm
        profiler.enable()
        asyncio.run(profiled())
        profiler.disable()

    for key, title in (("tottime", "own time"), ("cumulative", "cumulative time")):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(key).print_stats(args.top)
        print(
            f"\n## cProfile of mirrorgate, by {title} (divide by {args.requests:,} for "
            f"per-admission; cProfile inflates call-heavy code)\n"
        )
        print(text.getvalue().split("\n\n", 1)[-1].rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
