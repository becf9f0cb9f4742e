"""Prometheus metrics, on a registry of their own so that each app (and each test) counts alone.

The counters touched by every admission are plain integers that a collector
turns into metric families at scrape time: prometheus_client's own
counters take a lock and a label lookup per increment, which costs more than
the rest of a small admission's bookkeeping. Rarely changed metrics use the
library's types as usual.
"""

from __future__ import annotations

import bisect
import datetime
from collections.abc import Iterator, Mapping

import prometheus_client as prom
from prometheus_client.core import (
    CounterMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from mirrorgate import policy
from mirrorgate.webhook.admission import Decision
from mirrorgate.webhook.version import VERSION

__all__ = ["Metrics"]

# `_created` timestamps double every series and no dashboard reads them.
prom.disable_created_metrics()  # type: ignore[no-untyped-call]

# Admission latencies sit far below the library's default buckets (5 ms to
# 10 s); these resolve the sub-millisecond steady state and the slow path
# that creates a Secret.
ENDPOINTS = ("mutate", "audit")
ERROR_REASONS = ("bad-request", "internal")
PULL_SECRET_ACTIONS = ("created", "updated", "deleted", "failed")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _AdmissionCounts(Collector):
    """The per-admission numbers, counted in plain Python and exported on scrape."""

    def __init__(self) -> None:
        self.admissions: dict[tuple[str, str, str], int] = {}
        self.rewritten = self.would_rewrite = self.warnings = 0
        self.fallbacks = 0
        self.by_mirror: dict[str, int] = {}
        """Images rewritten (enforce), by the mirror they went to: of a rule's list, the one
        the probes found up."""
        # Every reason from the start, at 0: alerts use increase(), which needs a series.
        self.unmirrored: dict[str, int] = dict.fromkeys(policy.UNMIRRORED_REASONS, 0)
        self.latency: dict[str, list[int]] = {}
        self.latency_sum: dict[str, float] = {}

    def collect(self) -> Iterator[prom.Metric]:
        admissions = CounterMetricFamily(
            "mirrorgate_admissions",
            "Admission reviews answered, by endpoint, mode and outcome.",
            labels=["endpoint", "mode", "outcome"],
        )
        for labels, count in sorted(self.admissions.items()):
            admissions.add_metric(list(labels), count)
        yield admissions
        for name, value, text in (
            (
                "mirrorgate_images_rewritten",
                self.rewritten,
                "Images rewritten to a mirror (enforce mode).",
            ),
            (
                "mirrorgate_images_would_rewrite",
                self.would_rewrite,
                "Images audit mode would rewrite.",
            ),
            (
                "mirrorgate_images_left_for_health",
                self.fallbacks,
                "Images admitted as written because their mirror was down or its credential "
                "could not log in (onMirrorDown: fallback).",
            ),
            ("mirrorgate_warnings", self.warnings, "Warnings returned to clients."),
        ):
            yield CounterMetricFamily(name, text, value=value)
        unmirrored = CounterMetricFamily(
            "mirrorgate_images_left_unmirrored",
            "Images a rule covers admitted as written, by reason (docs/operations.md lists "
            "them); alert on every reason but audit.",
            labels=["reason"],
        )
        for reason, count in self.unmirrored.items():
            unmirrored.add_metric([reason], count)
        yield unmirrored
        by_mirror = CounterMetricFamily(
            "mirrorgate_images_rewritten_by_mirror",
            "Images rewritten to a mirror (enforce mode), by the mirror as written; for a rule "
            "with several mirrors, the one that served (the first the probes found up).",
            labels=["mirror"],
        )
        for mirror, count in sorted(self.by_mirror.items()):
            by_mirror.add_metric([mirror], count)
        yield by_mirror
        latency = HistogramMetricFamily(
            "mirrorgate_admission_duration_seconds",
            "Time to answer an admission review.",
            labels=["endpoint"],
        )
        for endpoint, counts in sorted(self.latency.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
                cumulative += count
                buckets.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
            latency.add_metric([endpoint], buckets, self.latency_sum[endpoint])
        yield latency


class Metrics:
    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.counts = _AdmissionCounts()
        r.register(self.counts)
        self.errors = prom.Counter(
            "mirrorgate_errors",
            "Malformed or failed admission calls, by reason.",
            ["endpoint", "reason"],
            registry=r,
        )
        build = prom.Gauge(
            "mirrorgate_build_info",
            "The running mirrorgate (1) by version.",
            ["version"],
            registry=r,
        )
        build.labels(VERSION).set(1)
        self.policy = prom.Gauge(
            "mirrorgate_policy_info",
            "The live policy (1) by version, and the effective mode: audit-only "
            "(--audit-only) or namespace-label (each namespace's label decides).",
            ["version", "mode"],
            registry=r,
        )
        self.policy_reviews = prom.Counter(
            "mirrorgate_policy_reviews",
            "Writes of the policy ConfigMap judged at admission "
            "(/validate-policy), by outcome: allowed or denied.",
            ["outcome"],
            registry=r,
        )
        self.policy_reload_failures = prom.Counter(
            "mirrorgate_policy_reload_failures", "Policy files rejected on reload.", registry=r
        )
        self.policy_configmap = prom.Gauge(
            "mirrorgate_policy_configmap_in_use",
            "1 while a policy file (the ConfigMap policy, deprecated) is served in a cluster "
            "beside the policy objects: migrate it (docs/upgrading.md).",
            registry=r,
        )
        self.policy_objects = prom.Gauge(
            "mirrorgate_policy_objects",
            "ClusterMirrorPolicy and MirrorPolicy objects in the composition in force, by "
            "kind and whether they are accepted (true) or refused (false).",
            ["kind", "accepted"],
            registry=r,
        )
        self.pull_secret_writes = prom.Counter(
            "mirrorgate_pull_secret_writes",
            "Generated pull secrets created, updated, deleted, or failed to ensure.",
            ["action"],
            registry=r,
        )
        self.squatted_copies = prom.Counter(
            "mirrorgate_squatted_copies",
            "Times a generated pull secret's name was found held by a Secret mirrorgate "
            "did not make (a tenant squatting the reserved prefix mirrorgate-).",
            registry=r,
        )
        self.credential_refreshes = prom.Counter(
            "mirrorgate_credential_refreshes",
            "Logins asked of credential-provider plugins, by credential and outcome "
            "(refreshed, failed).",
            ["credential", "outcome"],
            registry=r,
        )
        self.credential_expiry = prom.Gauge(
            "mirrorgate_credential_expiry_timestamp_seconds",
            "When the login in the store for a provider credential expires (Unix time).",
            ["credential"],
            registry=r,
        )
        self.mirror_up = prom.Gauge(
            "mirrorgate_mirror_up",
            "1 while the rule's mirror answers its /v2/ probe, else 0.",
            ["mirror"],
            registry=r,
        )
        self.credential_valid = prom.Gauge(
            "mirrorgate_credential_valid",
            "1 while the credential logs in to its mirror, else 0 (also when it is missing "
            "from the store or is for another registry).",
            ["credential"],
            registry=r,
        )
        self.mirror_hosts_unprobed = prom.Gauge(
            "mirrorgate_mirror_hosts_unprobed",
            "Mirror hosts that MirrorPolicies name beyond the probes' cap, which are not "
            "probed: their rules cannot fail over or fall back while the mirror is down.",
            registry=r,
        )
        self.certificate_expiry = prom.Gauge(
            "mirrorgate_certificate_expiry_timestamp_seconds",
            "When the serving certificate in use expires (Unix time).",
            registry=r,
        )
        self.certificate_reloads = prom.Counter(
            "mirrorgate_certificate_reloads",
            "Serving certificates loaded from disk.",
            ["result"],
            registry=r,
        )
        self.connections_dropped = prom.Counter(
            "mirrorgate_connections_dropped",
            "Connections the server closed or refused under its limits, by reason "
            "(header-timeout, body-timeout, write-timeout, evicted, refused, body-budget, "
            "output-budget, header-limit, bad-request, handshake-failed).",
            ["reason"],
            registry=r,
        )
        self.kubelet_logins = prom.Counter(
            "mirrorgate_kubelet_credential_logins",
            "Mirror logins given to kubelets (serve --kubelet-port).",
            registry=r,
        )
        self.kubelet_refusals = prom.Counter(
            "mirrorgate_kubelet_credential_refusals",
            "Kubelet credential requests refused, by reason (docs/operations.md).",
            ["reason"],
            registry=r,
        )
        self.token_reviews = prom.Counter(
            "mirrorgate_token_reviews",
            "Service-account tokens of kubelet credential requests, by result: cached, "
            "reviewed, refused (by the API server), busy, failed.",
            ["result"],
            registry=r,
        )
        self.open_connections = prom.Gauge(
            "mirrorgate_open_connections",
            "Open client connections, TLS handshakes included.",
            registry=r,
        )

        # The series alerts watch exist from the start, at 0: increase() and
        # rate() cannot see the first event of a series that appears with it.
        for endpoint in ENDPOINTS:
            for reason in ERROR_REASONS:
                self.errors.labels(endpoint, reason)
        self.counts.admissions[("mutate", policy.ENFORCE, "denied")] = 0
        for action in PULL_SECRET_ACTIONS:
            self.pull_secret_writes.labels(action)
        for result in ("loaded", "failed"):
            self.certificate_reloads.labels(result)

    def record(self, endpoint: str, decision: Decision, seconds: float) -> None:
        counts = self.counts
        key = (endpoint, decision.mode, decision.outcome)
        counts.admissions[key] = counts.admissions.get(key, 0) + 1
        if decision.rewrites:
            if decision.mode == policy.AUDIT:
                counts.would_rewrite += decision.rewrites
            else:
                counts.rewritten += decision.rewrites
                if decision.plan is not None:
                    by_mirror = counts.by_mirror
                    for rewrite in decision.plan.rewrites:
                        by_mirror[rewrite.mirror] = by_mirror.get(rewrite.mirror, 0) + 1
        counts.warnings += decision.warnings
        for reason, images in decision.unmirrored:
            counts.unmirrored[reason] += images
        plan = decision.plan
        if plan is not None and plan.fallbacks and decision.mode == policy.ENFORCE:
            counts.fallbacks += plan.fallbacks
        buckets = counts.latency.get(endpoint)
        if buckets is None:
            buckets = counts.latency[endpoint] = [0] * (len(LATENCY_BUCKETS) + 1)
            counts.latency_sum[endpoint] = 0.0
        buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        counts.latency_sum[endpoint] += seconds

    def credential_refreshed(
        self, credential: str, outcome: str, expires: datetime.datetime | None
    ) -> None:
        self.credential_refreshes.labels(credential, outcome).inc()
        if expires is not None:
            self.credential_expiry.labels(credential).set(expires.timestamp())

    def set_policy(self, version: str, mode: str) -> None:
        self.policy.clear()
        self.policy.labels(version, mode).set(1)

    def set_health(
        self, *, mirror_up: Mapping[str, bool], credential_valid: Mapping[str, bool]
    ) -> None:
        """The health gauges, exactly these series (a reload may have dropped some).

        Each mirror's rewrite counter exists from then on, at 0, so that an alert on a
        standby mirror's increase() sees its first failover.
        """
        for mirror in mirror_up:
            self.counts.by_mirror.setdefault(mirror, 0)
        for gauge, values in (
            (self.mirror_up, mirror_up),
            (self.credential_valid, credential_valid),
        ):
            gauge.clear()
            for label, ok in values.items():
                gauge.labels(label).set(1 if ok else 0)

    def render(self) -> tuple[bytes, str]:
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
