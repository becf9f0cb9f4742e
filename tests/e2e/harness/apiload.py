"""Pods created at a steady rate by concurrent creators, counted by the API server itself.

Under failurePolicy Ignore the API server hides a webhook's failures from the
client: a create succeeds, unrewritten. So what an availability test counts
comes from the API server's own metrics for the webhook:

- ``apiserver_admission_webhook_fail_open_count``: calls that failed and were ignored;
- ``apiserver_admission_webhook_rejection_count``: calls that failed or refused
  under Fail (and refusals under either);
- ``apiserver_admission_webhook_admission_duration_seconds``: the latency the
  API server saw, a histogram whose bucket bounds give the p99 as "<= X".

plus the Pods stored without their rewrite, which the creators check.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kubernetes import client as k8s

from tests.e2e.harness.procs import wait_until
from tests.webhook import scrape

FAIL_OPEN = "apiserver_admission_webhook_fail_open_count"
REJECTED = "apiserver_admission_webhook_rejection_count"
DURATION = "apiserver_admission_webhook_admission_duration_seconds"


def api_server_samples(api: k8s.ApiClient) -> scrape.Samples:
    """The API server's /metrics page, read as the client's own user (an admin)."""
    response = api.rest_client.pool_manager.request(
        "GET", f"{api.configuration.host}/metrics", timeout=30
    )
    assert response.status == 200, response.status
    return scrape.samples(response.data.decode())


def _total(page: scrape.Samples, name: str, webhook: str, **labels: str) -> float:
    """The sum over every label set of ``name`` for ``webhook`` that has ``labels``
    (the parser names a counter's samples ``<name>_total``)."""
    wanted = {("name", webhook), *labels.items()}
    return sum(
        value
        for (sample, found), value in page.items()
        if sample in (name, f"{name}_total") and wanted <= found
    )


@dataclass(frozen=True)
class WebhookCounts:
    """What the API server counted for one webhook between two scrapes."""

    fail_open: int
    rejected: int
    admissions: int
    p99_bound_s: float  # the smallest bucket bound holding 99 % of the admissions

    @classmethod
    def between(cls, before: scrape.Samples, after: scrape.Samples, webhook: str) -> WebhookCounts:
        def delta(name: str, **labels: str) -> float:
            return _total(after, name, webhook, **labels) - _total(before, name, webhook, **labels)

        bounds = sorted(
            {
                float(dict(found)["le"])
                for (sample, found) in after
                if sample == f"{DURATION}_bucket" and ("name", webhook) in found
            }
        )
        count = delta(f"{DURATION}_count")
        within = [
            bound for bound in bounds if delta(f"{DURATION}_bucket", le=_le(bound)) >= 0.99 * count
        ]
        return cls(
            fail_open=round(delta(FAIL_OPEN)),
            rejected=round(delta(REJECTED)),
            admissions=round(count),
            p99_bound_s=within[0] if within and count else float("nan"),
        )


def _le(bound: float) -> str:
    """A bucket bound as the exposition writes it (0.005, 1, +Inf)."""
    if bound == float("inf"):
        return "+Inf"
    return f"{bound:g}"


@dataclass
class Outcome:
    """One create: when (seconds into the load), and the stored image or the error."""

    at: float
    image: str | None
    error: str | None = None


@dataclass
class Load:
    """``creators`` threads creating Pods at ``rate`` per second in all, each on its own
    client, until ``until()`` is true and ``minimum_s`` has passed."""

    make_api: Callable[[], k8s.ApiClient]
    namespace: str
    body: Callable[[str], k8s.V1Pod]  # the Pod to create, by name
    creators: int = 16
    rate: float = 20.0
    minimum_s: float = 10.0
    until: Callable[[], bool] = lambda: True
    outcomes: list[Outcome] = field(default_factory=list)
    elapsed_s: float = 0.0
    _done: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def achieved_rate(self) -> float:
        return len(self.outcomes) / self.elapsed_s if self.elapsed_s else 0.0

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        """The load in the background while the block runs (and ``minimum_s`` at least)."""
        stop = threading.Event()
        self.until = stop.is_set
        runner = threading.Thread(target=self.run)
        runner.start()
        try:
            yield self
        finally:
            stop.set()
            runner.join()

    def wait_created(self, count: int, *, timeout: float = 60) -> None:
        """Wait until ``count`` Pods have been asked for: the load is under way."""

        def check() -> str | None:
            with self._lock:  # the creators append under it
                created = len(self.outcomes)
            return None if created >= count else f"{created} created"

        wait_until(
            check,
            timeout=timeout,
            what=f"{count} Pods of the load created",
            interval=0.05,
        )

    def run(self) -> None:
        """Create until done; returns when every creator has stopped."""
        started = time.monotonic()
        threads = [
            threading.Thread(target=self._creator, args=(k, started), daemon=True)
            for k in range(self.creators)
        ]
        for thread in threads:
            thread.start()
        while not self._done.wait(0.1):
            if time.monotonic() - started >= self.minimum_s and self.until():
                self._done.set()
        for thread in threads:
            thread.join(timeout=60)
        self.elapsed_s = time.monotonic() - started

    def _creator(self, k: int, started: float) -> None:
        """Creator k takes slots k, k + creators, ...: together, one Pod every 1/rate s."""
        with self.make_api() as api:
            core = k8s.CoreV1Api(api)
            slot = k
            while not self._done.is_set():
                delay = started + slot / self.rate - time.monotonic()
                if delay > 0 and self._done.wait(delay):
                    return
                at = time.monotonic() - started
                try:
                    created = core.create_namespaced_pod(self.namespace, self.body(f"load-{slot}"))
                    assert created.spec is not None
                    outcome = Outcome(at, created.spec.containers[0].image)
                except k8s.ApiException as error:
                    outcome = Outcome(at, None, f"{error.status} {error.reason}")
                with self._lock:
                    self.outcomes.append(outcome)
                slot += self.creators
