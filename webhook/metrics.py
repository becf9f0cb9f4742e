"""Prometheus metrics, on a registry of their own so that each app (and each test) counts alone."""

from __future__ import annotations

import prometheus_client as prom

from webhook.admission import Decision

# `_created` timestamps double every series and no dashboard reads them.
prom.disable_created_metrics()  # type: ignore[no-untyped-call]

__all__ = ["Metrics"]

# Admission latencies sit far below the library's default buckets (5 ms to
# 10 s); these resolve the sub-millisecond steady state and the slow path
# that creates a Secret.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self) -> None:
        self._admission_children: dict[tuple[str, str, str], prom.Counter] = {}
        self._latency_children: dict[str, prom.Histogram] = {}
        self.registry = prom.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.admissions = prom.Counter(
            "mirrorgate_admissions", "Admission reviews answered, by endpoint, mode and outcome.",
            ["endpoint", "mode", "outcome"], registry=r)
        self.rewritten = prom.Counter(
            "mirrorgate_images_rewritten", "Images rewritten to a mirror (enforce mode).",
            registry=r)
        self.would_rewrite = prom.Counter(
            "mirrorgate_images_would_rewrite", "Images audit mode would rewrite.", registry=r)
        self.unrewritten = prom.Counter(
            "mirrorgate_images_left_unmirrored",
            "Images admitted as written because their pull secret could not be ensured; "
            "alert on this.", registry=r)
        self.warnings = prom.Counter(
            "mirrorgate_warnings", "Warnings returned to clients.", registry=r)
        self.errors = prom.Counter(
            "mirrorgate_errors", "Malformed or failed admission calls, by reason.",
            ["endpoint", "reason"], registry=r)
        self.latency = prom.Histogram(
            "mirrorgate_admission_duration_seconds", "Time to answer an admission review.",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.policy = prom.Gauge(
            "mirrorgate_policy_info", "The live policy (1) by version and mode.",
            ["version", "mode"], registry=r)
        self.policy_reload_failures = prom.Counter(
            "mirrorgate_policy_reload_failures", "Policy files rejected on reload.", registry=r)
        self.pull_secret_writes = prom.Counter(
            "mirrorgate_pull_secret_writes",
            "Generated pull secrets created, updated, deleted, or failed to ensure.",
            ["action"], registry=r)
        self.certificate_reloads = prom.Counter(
            "mirrorgate_certificate_reloads", "Serving certificates loaded from disk.",
            ["result"], registry=r)

    def record(self, endpoint: str, decision: Decision, seconds: float) -> None:
        # labels() hashes and locks on every call; the few children are bound once.
        key = (endpoint, decision.mode, decision.outcome)
        counter = self._admission_children.get(key)
        if counter is None:
            counter = self._admission_children[key] = self.admissions.labels(*key)
        counter.inc()
        if decision.rewrites:
            (self.would_rewrite if decision.mode == "audit" else self.rewritten).inc(
                decision.rewrites)
        if decision.warnings:
            self.warnings.inc(decision.warnings)
        if decision.unrewritten:
            self.unrewritten.inc(decision.unrewritten)
        histogram = self._latency_children.get(endpoint)
        if histogram is None:
            histogram = self._latency_children[endpoint] = self.latency.labels(endpoint)
        histogram.observe(seconds)

    def set_policy(self, version: str, mode: str) -> None:
        self.policy.clear()
        self.policy.labels(version, mode).set(1)

    def render(self) -> tuple[bytes, str]:
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
