"""Planning cost per Pod (`policy.plan`, through the admission cache) for 1, 10 and 1,000 rules.

The claim under test (policy/matching.py): matching costs the same whatever
the number of rules, so a 1,000-rule policy plans a Pod within 1.1x of a
1-rule policy. Planning runs as admission runs it, through the webhook's
admission cache (which keeps plans by Pod shape and resolutions by image), so
two paths are measured:

* steady: the same Pod again and again, its plan found in the cache by its shape
  (what a cluster sees: Deployments repeat the same few images);
* cold: unique image strings on every call (unique tags), so every
  resolution is parsed and matched, which is the only path where a rule
  lookup that scans the rules would show.

Every policy resolves every image to the same outcome and rule (checked
before timing), so the only thing that varies between columns is how many
other rules the index holds, not how much rewriting a Pod needs.

    python -m bench.policy_bench [--check]

``--check`` exits 1 when any 1,000 / 1 ratio exceeds 1.1.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from bench import pods, results
from mirrorgate import policy
from mirrorgate.webhook import admissioncache

RULE_COUNTS = (1, 10, 1000)
POD_SIZES = (1, 5, 20)
TARGET_RATIO = 1.1
NAMESPACE = "team-a"

Path = Literal["steady", "cold"]
PATHS: tuple[Path, ...] = ("steady", "cold")

# (repository, tag-or-digest): hits are all covered by rule 0 (docker.io) at
# path depths 1 to 4, through each Docker Hub alias; misses are hosts no rule
# covers, one of them under a wildcard-looking domain so that the wildcard
# walk runs for it. Interleaved so that a 5-container Pod already mixes both.
IMAGES: tuple[tuple[str, str], ...] = (
    ("nginx", ":1.25.3"),  # hit, library/nginx
    ("quay.io/prometheus/node-exporter", ":v1.7.0"),  # miss
    ("acme/platform/billing-api", ":1.4.2"),  # hit, depth 3
    ("ghcr.io/fluxcd/source-controller", ":v1.2.4"),  # miss
    ("index.docker.io/acme/data/etl/worker", ":2.0.1"),  # hit, depth 4, alias
    ("bitnami/redis", ":7.2.4"),  # hit, depth 2
    ("registry.k8s.io/ingress-nginx/controller", ":v1.9.5"),  # miss
    ("busybox", "@" + pods.DIGEST),  # hit, digest
    ("registry7.example.org/platform/team7/api", ":3.1.0"),  # miss, looks like a rule
    ("docker.io/grafana/loki", ":2.9.4"),  # hit, explicit host
    ("eu.gcr.io/acme-prod/batch/job", ":20240101"),  # miss, wildcard walk
    ("registry-1.docker.io/library/postgres", ":16.1"),  # hit, API-host alias
    ("public.ecr.aws/karpenter/controller", ":0.33.0"),  # miss
)


def policy_document(rule_count: int) -> dict[str, Any]:
    """A policy of ``rule_count`` distinct rules; rule 0 (docker.io) is the one Pods hit.

    The others mirror what a large organisation writes: mostly whole
    registries, some repository prefixes (also on docker.io itself, so the
    hit host's probes land in a crowded index) and a wildcard.
    """
    mirrors: list[dict[str, str]] = [
        {"source": "docker.io", "mirror": "mirror.corp.example/dockerhub"}
    ]
    for i in range(1, rule_count):
        if i == 1:
            source = "*.cdn.example.net"
        elif i % 25 == 0:
            source = f"docker.io/vendor{i}"
        elif i % 10 == 5:
            source = f"registry{i}.example.com/platform/team{i}"
        else:
            source = f"registry{i}.example.com"
        mirrors.append({"source": source, "mirror": f"mirror.corp.example/r{i}"})
    return {"mirrors": mirrors, "exclude": {"namespaces": ["mirrorgate"]}}


def images(count: int, unique: int | None = None) -> list[str]:
    """``count`` images from :data:`IMAGES`; ``unique`` makes every string new (cold path)."""
    chosen = list(itertools.islice(itertools.cycle(IMAGES), count))
    if unique is None:
        return [name + suffix for name, suffix in chosen]
    # A new tag keeps the outcome identical while making a new cache key.
    return [
        f"{name}{suffix}-u{unique}-{i}"
        if suffix.startswith(":")
        else f"{name}:u{unique}-{i}{suffix}"
        for i, (name, suffix) in enumerate(chosen)
    ]


def check_outcomes(policies: Mapping[int, policy.Policy]) -> None:
    """Fail unless every policy resolves every image (and a cold variant) identically."""
    probes = images(len(IMAGES)) + images(len(IMAGES), unique=0)
    for image in probes:
        seen = {
            (
                p.resolve(image).outcome,
                p.resolve(image).new_image,
                getattr(p.resolve(image).rule, "label", None),
            )
            for p in policies.values()
        }
        if len(seen) != 1:
            raise SystemExit(f"policies disagree on {image!r}: {seen}")


@dataclasses.dataclass
class Case:
    size: int
    path: Path
    rule_count: int
    rules: policy.Policy
    loops: int = 1
    times: list[float] = dataclasses.field(default_factory=list)
    """Seconds per Pod, one entry per repeat."""
    cache: admissioncache.AdmissionCache = dataclasses.field(
        default_factory=admissioncache.AdmissionCache
    )


_unique = itertools.count(1)


def workload(case: Case) -> list[dict[str, Any]]:
    """The Pods for one measurement: one Pod repeated (steady) or all-new Pods (cold)."""
    if case.path == "steady":
        one = pods.pod(images(case.size), namespace=NAMESPACE)
        case.cache.admitted(
            one, namespace=NAMESPACE, mirror_policy=case.rules, health=policy.HEALTHY
        )  # warm the cache
        return [one] * case.loops
    return [
        pods.pod(images(case.size, unique=next(_unique)), namespace=NAMESPACE)
        for _ in range(case.loops)
    ]


def timed(case: Case, batch: Sequence[dict[str, Any]]) -> float:
    """CPU seconds per Pod to plan ``batch``; GC off while timing, as timeit does.

    This thread's CPU time, not wall time: on a shared 2-core machine the
    wall clock also counts the time other processes hold the core, which is
    the bulk of the noise; CPU time is left with only cache and frequency
    effects.
    """
    plan: Callable[..., admissioncache.Admitted] = case.cache.admitted
    rules, healthy = case.rules, policy.HEALTHY
    gc.collect()
    gc.disable()
    try:
        started = time.thread_time_ns()
        for pod in batch:
            plan(pod, namespace=NAMESPACE, mirror_policy=rules, health=healthy)
        elapsed = time.thread_time_ns() - started
    finally:
        gc.enable()
    return elapsed / 1e9 / len(batch)


def calibrate(case: Case, target_seconds: float) -> None:
    """Pick ``loops`` so that one measurement lasts about ``target_seconds``."""
    case.loops = 20
    per_pod = timed(case, workload(case))
    case.loops = max(20, int(target_seconds / per_pod))


def rotations(values: Sequence[int]) -> Iterator[list[int]]:
    for shift in itertools.count():
        cut = shift % len(values)
        yield [*values[cut:], *values[:cut]]


def run(repeats: int, target_seconds: float) -> dict[tuple[int, Path, int], Case]:
    policies = {n: policy.load(policy_document(n)) for n in RULE_COUNTS}
    assert all(len(p.rules) == n for n, p in policies.items())
    check_outcomes(policies)
    cases = {
        (size, path, n): Case(size=size, path=path, rule_count=n, rules=policies[n])
        for size in POD_SIZES
        for path in PATHS
        for n in RULE_COUNTS
    }
    for case in cases.values():
        calibrate(case, target_seconds)
    orders = rotations(RULE_COUNTS)
    for _ in range(repeats):
        # The rule counts of one (size, path) run back to back, in a rotating
        # order, so that a burst of load from a neighbour hits all three
        # columns of a row rather than one of them.
        for size in POD_SIZES:
            for path in PATHS:
                for n in next(orders):
                    case = cases[(size, path, n)]
                    case.times.append(timed(case, workload(case)))
    return cases


def report(cases: Mapping[tuple[int, Path, int], Case], repeats: int) -> list[float]:
    """Print the Markdown table; return the 1,000 / 1 ratios."""
    ratios: list[float] = []
    print(
        f"Planning cost per Pod, µs (CPU time, min of {repeats} repeats; "
        "`policy.plan` through the admission cache)\n"
    )
    print("| Pod | path | 1 rule | 10 rules | 1,000 rules | 1,000 / 1 |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for size in POD_SIZES:
        for path in PATHS:
            best = {n: min(cases[(size, path, n)].times) for n in RULE_COUNTS}
            ratio = best[1000] / best[1]
            ratios.append(ratio)
            label = f"{size} container{'s' if size != 1 else ''}"
            cells = " | ".join(f"{best[n] * 1e6:.2f}" for n in RULE_COUNTS)
            print(f"| {label} | {path} | {cells} | {ratio:.2f}× |")
    print(
        f"\nTarget: 1,000 rules within {TARGET_RATIO}× of 1 rule, steady and cold. "
        "steady = the same Pod again (its plan kept in the admission cache); cold = unique image "
        "strings on every call (every resolution parsed and matched)."
    )
    return ratios


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.policy_bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--check", action="store_true", help=f"exit 1 if any 1,000 / 1 ratio exceeds {TARGET_RATIO}"
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--ms",
        type=float,
        default=20.0,
        help="duration of one measurement in milliseconds (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    cases = run(args.repeats, args.ms / 1000)
    with results.capture("planning", command="make bench-policy"):
        ratios = report(cases, args.repeats)
    worst = max(ratios)
    if args.check and worst > TARGET_RATIO:
        print(
            f"\nFAIL: worst 1,000 / 1 ratio {worst:.2f}× exceeds {TARGET_RATIO}×", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
