"""/healthz, /readyz and /metrics in process."""

from __future__ import annotations

import hashlib
from pathlib import Path

from mirrorgate.webhook.version import VERSION
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.harness import Harness, make_harness
from tests.webhook.reviews import HUB_IMAGE, PROM_IMAGE, UNMATCHED_IMAGE, pod, review
from tests.webhook.scrape import samples, value


def test_healthz_is_ok(harness: Harness) -> None:
    """Liveness needs nothing but the process."""
    response = harness.client.get("/healthz")
    assert response.status_code == 200
    assert response.text == "ok\n"


def test_readyz_shows_the_live_policy_version(harness: Harness, tmp_path: Path) -> None:
    """Ready, with mirrorgate's version, the sha256 prefix of the policy file and its mode."""
    response = harness.client.get("/readyz")
    assert response.status_code == 200
    version = hashlib.sha256((tmp_path / "policy.yaml").read_bytes()).hexdigest()[:12]
    assert response.json() == {
        "ready": True,
        "version": VERSION,
        "policy": version,
        "mode": "namespace-label",
        "problems": {},
    }


def test_readyz_reports_failing_checks_as_503(harness: Harness) -> None:
    """A check that says why, or one that raises, makes the server not ready (never a 500)."""
    harness.runtime.readiness["certificates"] = lambda: "not loaded"

    def broken() -> str | None:
        raise OSError("disk gone")

    harness.runtime.readiness["broken"] = broken
    response = harness.client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["problems"] == {
        "certificates": "not loaded",
        "broken": "check failed: OSError",
    }


def test_metrics_count_admissions_rewrites_warnings_and_latency(tmp_path: Path) -> None:
    """Each admission is counted by endpoint, mode and outcome, with its images and warnings."""
    made = make_harness(tmp_path, secrets=RecordingPullSecrets(stale=False))
    with made.client:
        made.mutate(review(pod(HUB_IMAGE, PROM_IMAGE)))  # 2 rewrites
        made.mutate(review(pod(UNMATCHED_IMAGE)))  # nothing to do
        made.mutate(
            review(pod(HUB_IMAGE), kind={"group": "apps", "version": "v1", "kind": "Deployment"})
        )  # ignored
        made.post("/audit", review(pod(HUB_IMAGE, PROM_IMAGE, UNMATCHED_IMAGE)))  # would: 2
        made.mutate(review(pod(HUB_IMAGE), namespace="excluded-ns"))  # skipped
        made.client.post("/audit", content=b"", headers={"content-type": "application/json"})
        response = made.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    page = samples(response.text)
    admissions = "mirrorgate_admissions_total"
    assert value(page, admissions, endpoint="mutate", mode="enforce", outcome="patched") == 1
    assert value(page, admissions, endpoint="mutate", mode="enforce", outcome="allowed") == 1
    assert value(page, admissions, endpoint="mutate", mode="enforce", outcome="ignored") == 1
    assert value(page, admissions, endpoint="mutate", mode="enforce", outcome="skipped") == 1
    assert value(page, admissions, endpoint="audit", mode="audit", outcome="allowed") == 1
    assert value(page, "mirrorgate_images_rewritten_total") == 2
    assert value(page, "mirrorgate_images_would_rewrite_total") == 2
    assert value(page, "mirrorgate_warnings_total") == 2
    assert value(page, "mirrorgate_errors_total", endpoint="audit", reason="bad-request") == 1
    assert value(page, "mirrorgate_admission_duration_seconds_count", endpoint="mutate") == 4
    assert value(page, "mirrorgate_admission_duration_seconds_count", endpoint="audit") == 1
    assert (
        value(page, "mirrorgate_admission_duration_seconds_bucket", endpoint="mutate", le="+Inf")
        == 4
    )
    version = made.runtime.policy.version
    assert value(page, "mirrorgate_policy_info", version=version, mode="namespace-label") == 1
    assert value(page, "mirrorgate_policy_reload_failures_total") == 0


def test_audit_only_counts_would_rewrite_not_rewritten(tmp_path: Path) -> None:
    """Under --audit-only the images are counted as would-rewrite, the warnings as warnings."""
    made = make_harness(tmp_path, audit_only=True)
    with made.client:
        made.mutate(review(pod(HUB_IMAGE, PROM_IMAGE)))
        page = samples(made.client.get("/metrics").text)
    assert (
        value(
            page, "mirrorgate_admissions_total", endpoint="mutate", mode="audit", outcome="allowed"
        )
        == 1
    )
    assert value(page, "mirrorgate_images_would_rewrite_total") == 2
    assert value(page, "mirrorgate_images_rewritten_total") == 0
    assert value(page, "mirrorgate_warnings_total") == 2
    assert (
        value(
            page, "mirrorgate_policy_info", version=made.runtime.policy.version, mode="audit-only"
        )
        == 1
    )


def test_each_app_counts_alone(tmp_path: Path) -> None:
    """Two apps in one process have separate registries."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = make_harness(tmp_path / "a"), make_harness(tmp_path / "b")
    with first.client, second.client:
        first.mutate(review(pod(PROM_IMAGE)))
        page = samples(second.client.get("/metrics").text)
    assert value(page, "mirrorgate_images_rewritten_total") == 0
