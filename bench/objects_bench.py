"""1,000 namespaces, each with a MirrorPolicy: composition time, memory, admission CPU per Pod.

In-process, in one run: the cluster's ClusterMirrorPolicy (10 rules and one
robot credential per team, as a platform with a robot per team writes it)
alone, against the same with a MirrorPolicy in each of 1,000 namespaces (a
rule of the team's own for docker.io, on the team's Harbor project, with
its robot). Measured:

* composition: CPU time of :func:`policy.compose` for all 1,001 objects
  (what a replica does when any of them, or a namespace's labels, changes);
* memory: what the composition holds (``tracemalloc``, after a collection),
  and what the admission caches hold once every namespace was admitted;
* admission CPU per Pod: Pods of the 1,000 namespaces in turn (5 containers,
  3 under docker.io), planned as admission plans them, through the
  webhook's admission cache (webhook/admissioncache.py), which keeps plans
  by (policy, shape) and drops those of policies no longer served
  (:meth:`AdmissionCache.retain`). Against the cluster policy alone; with
  the MirrorPolicies; and with them through a cache that keeps one policy at
  a time, as the admission cache did before it kept plans by policy (a Pod of
  another namespace's policy than the last empties it);
* a MirrorPolicy changed: the composition made again with the last one as
  ``previous`` keeps every other namespace's policy as the same object, and
  the cache, told the new policies, keeps their plans.

    python -m bench.objects_bench [--namespaces N]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from bench import pods, results
from bench.policy_bench import images
from mirrorgate import policy
from mirrorgate.webhook import admissioncache

TEAMS = 1000
CLUSTER_RULES = 10
POD = pods.pod(images(5), namespace="any")


def team(i: int) -> str:
    return f"team-{i:04d}"


def cluster_object(teams: int) -> policy.PolicyObject:
    mirrors: list[dict[str, Any]] = [
        {"source": "docker.io", "mirror": "mirror.corp.example/dockerhub", "credential": "shared"},
        {"source": "quay.io", "mirror": "mirror.corp.example/quay", "fixed": True},
    ]
    mirrors += [
        {"source": f"registry{i}.example.com", "mirror": f"mirror.corp.example/r{i}"}
        for i in range(2, CLUSTER_RULES)
    ]
    credentials: dict[str, Any] = {
        "shared": {"namespaces": [], "namespaceSelector": {"matchLabels": {"tier": "team"}}}
    }
    credentials.update({f"robot-{i:04d}": {"namespaces": [team(i)]} for i in range(teams)})
    return policy.parse_object(
        {
            "apiVersion": policy.API_VERSION,
            "kind": policy.CLUSTER_KIND,
            "metadata": {"name": "platform", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"mirrors": mirrors, "credentials": credentials},
        }
    )


def team_object(i: int) -> policy.PolicyObject:
    rule = {
        "source": "docker.io",
        "mirror": f"harbor.corp.example/{team(i)}",
        "credential": f"robot-{i:04d}",
    }
    return policy.parse_object(
        {
            "apiVersion": policy.API_VERSION,
            "kind": policy.NAMESPACED_KIND,
            "metadata": {"name": "hub", "namespace": team(i)},
            "spec": {"mirrors": [rule]},
        }
    )


def cpu(call: Callable[[], object], repeats: int) -> float:
    """The least CPU seconds of ``repeats`` calls (GC off while timing)."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            started = time.thread_time_ns()
            call()
            best = min(best, (time.thread_time_ns() - started) / 1e9)
        finally:
            gc.enable()
    return best


def held(build: Callable[[], object]) -> tuple[object, int]:
    """What ``build`` returns, and the bytes it holds once built."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        value = build()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return value, grown


def admit_all(
    namespaces: Sequence[str],
    policy_for: Callable[[str], policy.Policy],
    cache_for: Callable[[str], admissioncache.AdmissionCache],
    labels: dict[str, dict[str, str]],
) -> None:
    """Admit the same 5-container Pod once in each namespace, in turn."""
    for ns in namespaces:
        cache_for(ns).admitted(
            POD,
            namespace=ns,
            mirror_policy=policy_for(ns),
            health=policy.HEALTHY,
            namespace_labels=labels[ns],
        )


def admission(
    namespaces: Sequence[str],
    policy_for: Callable[[str], policy.Policy],
    cache_for: Callable[[str], admissioncache.AdmissionCache],
    labels: dict[str, dict[str, str]],
    rounds: int,
) -> float:
    """CPU seconds per Pod, ``rounds`` Pods of each namespace in turn (caches warm)."""
    admit_all(namespaces, policy_for, cache_for, labels)

    def rounds_of() -> None:
        for _ in range(rounds):
            admit_all(namespaces, policy_for, cache_for, labels)

    seconds = cpu(rounds_of, 7)
    return seconds / (rounds * len(namespaces))


class OnePolicyAtATime(admissioncache.AdmissionCache):
    """The admission cache as it was before it kept plans by policy: a Pod planned
    under another policy than the last empties it."""

    def __init__(self) -> None:
        super().__init__()
        self._last: policy.Policy | None = None

    def admitted(
        self, pod: Mapping[str, object], *, mirror_policy: policy.Policy, **kwargs: Any
    ) -> admissioncache.Admitted:
        if mirror_policy is not self._last:
            self.clear()
            self._last = mirror_policy
        return super().admitted(pod, mirror_policy=mirror_policy, **kwargs)


def changed(
    cluster: policy.PolicyObject,
    teams: list[policy.PolicyObject],
    labels: dict[str, dict[str, str]],
    composed: policy.Composition,
    cache: admissioncache.AdmissionCache,
) -> tuple[int, int, int]:
    """One MirrorPolicy's mirror changed: (namespace policies kept as the same object,
    plans the cache kept, plans it held before)."""
    first = teams[0]
    (rule,) = cast(list[dict[str, Any]], first.spec["mirrors"])
    spec = {"mirrors": [{**rule, "mirror": "harbor.corp.example/moved"}]}
    moved = dataclasses.replace(first, spec=spec, generation=first.generation + 1)
    again = policy.compose([cluster, moved, *teams[1:]], labels, previous=composed)
    kept = sum(again.namespaced[ns] is p for ns, p in composed.namespaced.items())
    before = cache.shapes
    cache.retain(again.policies)
    return kept, cache.shapes, before


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.objects_bench")
    parser.add_argument("--namespaces", type=int, default=TEAMS)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    n = args.namespaces
    namespaces = [team(i) for i in range(n)]
    labels = {ns: {"tier": "team", "kubernetes.io/metadata.name": ns} for ns in namespaces}
    cluster = cluster_object(n)
    teams = [team_object(i) for i in range(n)]

    alone, alone_bytes = held(lambda: policy.compose([cluster], labels))
    composed, composed_bytes = held(lambda: policy.compose([cluster, *teams], labels))
    assert isinstance(alone, policy.Composition)
    assert isinstance(composed, policy.Composition)
    assert all(v.accepted for v in composed.verdicts.values()), composed.refused
    assert len(composed.namespaced) == n
    compose_alone = cpu(lambda: policy.compose([cluster], labels), 5)
    compose_all = cpu(lambda: policy.compose([cluster, *teams], labels), 5)
    judge_one = cpu(lambda: policy.judge(teams[-1], [cluster, *teams], labels), 5)

    one_cache = admissioncache.AdmissionCache()
    one_cache.retain(alone.policies)
    only = admission(namespaces, alone.policy_for, lambda _: one_cache, labels, args.rounds)
    served = admissioncache.AdmissionCache()
    served.retain(composed.policies)
    by_policy = admission(namespaces, composed.policy_for, lambda _: served, labels, args.rounds)
    one_at_a_time = OnePolicyAtATime()
    thrashed = admission(
        namespaces, composed.policy_for, lambda _: one_at_a_time, labels, args.rounds
    )
    fresh = admissioncache.AdmissionCache()
    fresh.retain(composed.policies)
    _, cache_bytes = held(
        lambda: admit_all(namespaces, composed.policy_for, lambda _: fresh, labels)
    )
    cached_policies = fresh.policies
    kept, plans_kept, plans_before = changed(cluster, teams, labels, composed, fresh)
    assert (kept, plans_kept) == (n - 1, plans_before - 1), (kept, plans_kept, plans_before)

    with results.capture("objects", command="make bench (python -m bench.objects_bench)"):
        mib = 1 << 20
        print(
            f"{n:,} namespaces, each with a MirrorPolicy of 1 rule; a ClusterMirrorPolicy "
            f"of {CLUSTER_RULES} rules and {n + 1:,} credentials\n"
        )
        print("| | cluster policy only | with the MirrorPolicies | ratio |")
        print("| --- | ---: | ---: | ---: |")
        print(
            f"| compose, ms (CPU) | {compose_alone * 1e3:.1f} | {compose_all * 1e3:.1f} | "
            f"{compose_all / compose_alone:.1f}× |"
        )
        print(
            f"| composition held, MiB | {alone_bytes / mib:.2f} | {composed_bytes / mib:.2f} | "
            f"{composed_bytes / alone_bytes:.1f}× |"
        )
        print(
            f"| admission per Pod, µs (CPU), the admission cache (plans by policy and shape) "
            f"| {only * 1e6:.1f} | {by_policy * 1e6:.1f} | {by_policy / only:.2f}× |"
        )
        print(
            f"| admission per Pod, µs (CPU), a cache of one policy at a time (before) "
            f"| {only * 1e6:.1f} | {thrashed * 1e6:.1f} | {thrashed / only:.2f}× |"
        )
        print(
            f"\nJudging one MirrorPolicy at apply time (`policy.judge`: the cluster's objects "
            f"composed once, its namespace's twice): {judge_one * 1e3:.1f} ms. "
            f"The admission cache holds {cache_bytes / mib:.2f} MiB once each namespace's "
            f"Pod was admitted (under {cached_policies:,} policies). One MirrorPolicy changed: the "
            f"composition keeps {kept:,} of the {n:,} namespaces' policies as they were, and "
            f"the cache keeps {plans_kept:,} of its {plans_before:,} plans. Admission reads "
            "only memory: a composition is values, built when an object or a namespace's "
            "labels change."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
