"""Health at the edge: the monitor's state machine, store checks, what admission and /readyz
show, `policy check --store`, and that deciding an admission never touches the network."""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.certs import CertificateAuthority
from mirrorgate.webhook import cli
from mirrorgate.webhook.commands.serve import wiring
from mirrorgate.webhook.commands.serve.settings import Settings
from mirrorgate.webhook.credentials import filestore
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.mirrorhealth import monitor
from tests.webhook import policies, reviews, scrape
from tests.webhook.harness import make_harness
from tests.webhook.serving import write_pair

SETTINGS = policy.HealthSettings(
    interval=1.0, timeout=0.5, failure_threshold=3, success_threshold=2
)
MIRROR_POLICY = policy.load(
    {
        "mirrors": [
            {
                "source": "docker.io",
                "mirror": "harbor.corp.example/hub",
                "credential": "harbor-pull",
            },
            {
                "source": "quay.io",
                "mirror": "harbor.corp.example/quay",
                "credential": "harbor-pull",
            },
            {"source": "ghcr.io", "mirror": "other.example:5000/ghcr", "credential": "team"},
        ],
        "credentials": {"harbor-pull": {"namespaces": ["*"]}, "team": {"namespaces": ["*"]}},
    }
)


def _credential(name: str, registry: str) -> Credential:
    return Credential(name=name, registry=registry, username="robot", password="s3cret-value")


STORE_CASES = [
    pytest.param(
        {"harbor-pull": "harbor.corp.example", "team": "other.example:5000"}, {}, id="all-good"
    ),
    pytest.param(
        {"harbor-pull": "HARBOR.corp.example/hub", "team": "other.example:5000"},
        {},
        id="host-with-path-and-case",
    ),
    pytest.param(
        {"harbor-pull": "harbor.corp.example"},
        {"team": "not in the credential store"},
        id="missing",
    ),
    pytest.param(
        {"harbor-pull": "harbor.corp.example:8443", "team": "other.example:5000"},
        {
            "harbor-pull": "is for registry 'harbor.corp.example:8443', not "
            "'harbor.corp.example', the mirror host of mirrors[0]"
        },
        id="other-port",
    ),
    pytest.param(
        {},
        {"harbor-pull": "not in the credential store", "team": "not in the credential store"},
        id="empty-store",
    ),
]


@pytest.mark.parametrize(("store", "expected"), STORE_CASES)
def test_credential_problems(store: dict[str, str], expected: dict[str, str]) -> None:
    credentials = {name: _credential(name, registry) for name, registry in store.items()}
    assert monitor.credential_problems(MIRROR_POLICY, credentials) == expected


# A result sequence (True = probe succeeded) and the state after each result.
TRACKS = [
    pytest.param([False], [False], id="first-failure-decides"),
    pytest.param([True], [True], id="first-success-decides"),
    pytest.param([True, False, False, False], [True, True, True, False], id="down-at-threshold"),
    pytest.param(
        [True, False, False, True, False, False], [True] * 6, id="a-success-resets-the-count"
    ),
    pytest.param([False, True, True], [False, False, True], id="up-after-two-successes"),
    pytest.param([False, True, False, True], [False] * 4, id="flapping-stays-down"),
]


@pytest.mark.parametrize(("results", "states"), TRACKS)
def test_track_thresholds(results: list[bool], states: list[bool]) -> None:
    track = monitor._Track()
    seen = []
    for ok in results:
        track.observe(ok, "reason", SETTINGS)
        seen.append(track.up)
    assert seen == states


@given(st.lists(st.booleans(), min_size=1, max_size=60), st.integers(1, 5), st.integers(1, 5))
def test_track_changes_only_after_enough_consecutive_results(
    results: list[bool], failures: int, successes: int
) -> None:
    """A state flips only when the last `threshold` results (or the first one) agree."""
    settings = policy.HealthSettings(1.0, 0.5, failures, successes)
    track = monitor._Track()
    for i, ok in enumerate(results):
        before = track.up
        changed = track.observe(ok, "r", settings)
        assert changed == (track.up != before)
        if changed and before is not None:
            needed = successes if ok else failures
            assert i + 1 >= needed
            assert all(r == ok for r in results[i + 1 - needed : i + 1])


class _Recorder:
    def __init__(self) -> None:
        self.published: list[policy.Health] = []

    def __call__(self, value: policy.Health) -> None:
        self.published.append(value)


def test_monitor_publishes_store_problems_without_probing() -> None:
    """Probing off: the store is still checked; gauges say 0 for the misconfigured one."""
    metrics_ = Metrics()
    recorder = _Recorder()
    store = {"harbor-pull": _credential("harbor-pull", "harbor.corp.example")}
    watcher = monitor.HealthMonitor(
        mirror_policy=lambda: MIRROR_POLICY,
        credentials=lambda: store,
        publish=recorder,
        metrics=metrics_,
        probe=False,
    )
    watcher.probe_round()
    watcher.probe_round()  # no change: nothing published again
    # Without probes nothing is known to be up: the health says it was not probed.
    assert recorder.published == [
        policy.Health(failing={"team": "not in the credential store"}, probed=False)
    ]
    assert watcher.problems() == {"credential team": "not in the credential store"}
    page = scrape.samples(metrics_.render()[0].decode())
    assert page[("mirrorgate_credential_valid", frozenset({("credential", "team")}))] == 0.0
    assert not [key for key in page if key[0] == "mirrorgate_mirror_up"]
    store["team"] = _credential("team", "other.example:5000")
    watcher.probe_round()
    assert recorder.published[-1] == policy.UNPROBED
    assert watcher.problems() == {}


def test_monitor_keeps_credential_verdicts_while_the_store_is_unreadable() -> None:
    metrics_ = Metrics()
    recorder = _Recorder()
    snapshot: dict[str, Any] = {"value": {}}
    watcher = monitor.HealthMonitor(
        mirror_policy=lambda: MIRROR_POLICY,
        credentials=lambda: snapshot["value"],
        publish=recorder,
        metrics=metrics_,
        probe=False,
    )
    watcher.probe_round()
    assert set(watcher.health.failing) == {"harbor-pull", "team"}
    snapshot["value"] = None  # e.g. the informer lost its watch and has not re-synced
    watcher.probe_round()
    assert set(watcher.health.failing) == {"harbor-pull", "team"}
    assert len(recorder.published) == 1


def test_readyz_lists_health_problems_and_stays_ready(tmp_path: Path) -> None:
    made = make_harness(tmp_path)
    made.runtime.advisories.append(lambda: {"mirror harbor.corp.example": "down: refused"})
    made.runtime.health = policy.Health(down={"harbor.corp.example": "refused"})
    with made.client:
        response = made.client.get("/readyz")
        assert response.status_code == 200
        assert response.json()["ready"] is True
        assert response.json()["problems"] == {"mirror harbor.corp.example": "down: refused"}
        answer = made.mutate(reviews.review(reviews.pod(reviews.HUB_IMAGE, reviews.PROM_IMAGE)))
        page = scrape.samples(made.client.get("/metrics").text)
    ops = reviews.patch_ops(answer)
    patched = reviews.apply(reviews.pod(reviews.HUB_IMAGE, reviews.PROM_IMAGE), ops)
    images = [c["image"] for c in patched["spec"]["containers"]]
    assert images == [reviews.HUB_IMAGE, "mirror.corp.example/prometheus/prometheus:v2.53.0"]
    assert answer["warnings"] == [
        f"containers/c0: image {reviews.HUB_IMAGE!r} left as written: mirror "
        "harbor.corp.example/dockerhub-proxy of mirrors[0] is down: refused "
        "(onMirrorDown: fallback)"
    ]
    assert scrape.value(page, "mirrorgate_images_left_for_health_total") == 1.0
    # No credential is needed for a mirror that is not used.
    assert made.secrets.ensure_calls == []


def test_audit_endpoint_shows_health_next_to_each_rewrite(tmp_path: Path) -> None:
    made = make_harness(
        tmp_path,
        policies.POLICY.replace(
            "    mirror: mirror.corp.example/prometheus\n",
            "    mirror: mirror.corp.example/prometheus\n    onMirrorDown: keep\n",
        ),
    )
    made.runtime.health = policy.Health(down={"mirror.corp.example": "timed out"})
    with made.client:
        answer = made.post(
            "/audit", reviews.review(reviews.pod(reviews.HUB_IMAGE, reviews.PROM_IMAGE))
        )
    response = answer["response"]
    problem = "mirror mirror.corp.example/prometheus of mirrors[1] is down: timed out"
    assert response["warnings"] == [
        f"containers/c1: image {reviews.PROM_IMAGE!r} rewritten although {problem} "
        "(onMirrorDown: keep)",
        f"mirrorgate audit: containers/c0 would use harbor.corp.example/dockerhub-proxy/library/"
        f"nginx:1.27 (was {reviews.HUB_IMAGE}); health: up",
        f"mirrorgate audit: containers/c1 would use {reviews.PROM_MIRRORED} (was "
        f"{reviews.PROM_IMAGE}); health: {problem}",
    ]


@pytest.fixture
def connections() -> Iterator[list[str]]:
    """Every socket connect and name lookup made while the fixture is active, by any thread."""
    seen: list[str] = []
    active = threading.Event()
    active.set()

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active.is_set() and event in ("socket.connect", "socket.getaddrinfo"):
            seen.append(f"{event} {args[1:]!r} in {threading.current_thread().name}")

    sys.addaudithook(hook)  # cannot be removed: `active` turns it off
    try:
        yield seen
    finally:
        active.clear()


def test_admission_makes_no_network_call_whatever_the_health(
    tmp_path: Path, connections: list[str]
) -> None:
    """Healthy, down, failing: the decision reads the health value, never a socket."""
    socket.getaddrinfo("127.0.0.1", 9)  # the negative control: the hook does see lookups
    assert len(connections) == 1
    connections.clear()
    made = make_harness(tmp_path)
    states = [
        policy.HEALTHY,
        policy.Health(down={"harbor.corp.example": "refused"}),
        policy.Health(failing={"harbor-pull": "login refused (HTTP 401)"}),
    ]
    with made.client:
        for i in range(60):
            made.runtime.health = states[i % 3]
            made.mutate(
                reviews.review(
                    reviews.pod(reviews.HUB_IMAGE, reviews.PROM_IMAGE),
                    uid=f"00000000-0000-4000-8000-{i:012d}",
                )
            )
    assert connections == []


def test_policy_check_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`policy check --store` reports, offline, a credential missing or for another host."""
    key = filestore.generate_key()
    monkeypatch.setenv(filestore.KEY_ENV, key)
    store = tmp_path / "store.json"
    raw = filestore.load_key(key_file=None, environ={filestore.KEY_ENV: key})

    def write(*credentials: Credential) -> None:
        current = filestore.read_store(str(store), raw, missing_ok=True)
        filestore.write_store(str(store), raw, current.replaced({c.name: c for c in credentials}))

    write(_credential("harbor-pull", "harbor.example.org"))
    path = tmp_path / "policy.yaml"
    path.write_text(policies.POLICY.replace('["*"]', "[shop]"))

    def check(*extra: str) -> tuple[int, str]:
        out = io.StringIO()
        code = cli.main(["policy", "check", str(path), *extra], out=out, err=io.StringIO())
        return code, out.getvalue()

    code, text = check("--store", str(store))
    assert code == 1
    assert text.splitlines()[1:] == [
        "  credential harbor-pull: is for registry 'harbor.example.org', not "
        f"'harbor.corp.example', the mirror host of mirrors[0] ({store})"
    ]
    assert "s3cret-value" not in text
    write(_credential("harbor-pull", "harbor.corp.example"))
    assert check("--store", str(store))[0] == 0
    write()
    code, text = check("--store", str(store))
    assert (code, text.splitlines()[1:]) == (
        1,
        [f"  credential harbor-pull: not in the credential store ({store})"],
    )
    assert check()[0] == 0  # without --store: the policy alone


def test_unreadable_ca_file_counts_as_a_down_mirror(tmp_path: Path) -> None:
    """The probe cannot trust the mirror without its CA: down, with why, and no connection."""
    mirror_policy = policy.load(
        {
            "mirrors": [
                {
                    "source": "docker.io",
                    "mirror": "m.example/hub",
                    "caFile": str(tmp_path / "missing.crt"),
                }
            ],
            "health": {"failureThreshold": 1},
        }
    )
    metrics_ = Metrics()
    watcher = monitor.HealthMonitor(
        mirror_policy=lambda: mirror_policy, credentials=None, publish=_Recorder(), metrics=metrics_
    )
    watcher.probe_round()
    reason = f"cannot read caFile '{tmp_path / 'missing.crt'}': No such file or directory"
    assert watcher.health == policy.Health(down={"m.example": reason})
    assert watcher.problems() == {"mirror m.example": f"down: {reason}"}
    page = scrape.samples(metrics_.render()[0].decode())
    assert page[("mirrorgate_mirror_up", frozenset({("mirror", "m.example/hub")}))] == 0.0


def test_without_probes_the_audit_says_nothing_was_probed(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    """serve --no-health-probes: the audit's health beside a planned rewrite is
    "not probed", never "up" (which no probe established), in the warnings and in
    the audit annotations alike; serve's wiring holds UNPROBED from the start."""
    cert, key = write_pair(tmp_path, ca.issue_serving(dns_names=["localhost"]))
    (tmp_path / "policy.yaml").write_text(policies.POLICY)
    built = wiring.build(
        Settings(
            policy=str(tmp_path / "policy.yaml"),
            tls_cert=str(cert),
            tls_key=str(key),
            health_probes=False,
        )
    )
    assert built.runtime.health == policy.UNPROBED
    made = make_harness(tmp_path)
    made.runtime.health = built.runtime.health
    with made.client:
        answer = made.post("/audit", reviews.review(reviews.pod(reviews.PROM_IMAGE)))
    response = answer["response"]
    assert response["warnings"] == [
        f"mirrorgate audit: containers/c0 would use {reviews.PROM_MIRRORED} (was "
        f"{reviews.PROM_IMAGE}); health: not probed",
    ]
    rewrites = json.loads(response["auditAnnotations"]["rewrites"])
    assert rewrites["containers/c0"]["health"] == "not probed"
