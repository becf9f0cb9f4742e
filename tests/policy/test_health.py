"""Health in the pure core: the policy's settings, and planning with a health state."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.policy.durations import parse_duration
from mirrorgate.policy.health import Health, HealthSettings
from mirrorgate.policy.loader import probe_duration
from tests.policy import strategies

HUB = "harbor.corp.example/dockerhub-proxy"
OPEN = "mirror.corp.example/prometheus"


def _load(health: object = None, **rule: Any) -> policy.Policy:
    document: dict[str, Any] = {
        "mirrors": [
            {"source": "docker.io", "mirror": HUB, "credential": "harbor-pull", **rule},
            {"source": "quay.io/prometheus", "mirror": OPEN},
        ],
        "credentials": {"harbor-pull": {"namespaces": ["*"]}},
    }
    if health is not None:
        document["health"] = health
    return policy.load(document)


DURATIONS = [
    ("10s", 10.0),
    ("500ms", 0.5),
    ("1m30s", 90.0),
    ("1.5s", 1.5),
    ("2h", 7200.0),
    ("0s", 0.0),
    ("10", None),
    ("s", None),
    ("-1s", None),
    ("1 s", None),
    ("1d", None),
    ("", None),
    ("1s ", None),
    ("١s", None),
]


@pytest.mark.parametrize(("text", "seconds"), DURATIONS)
def test_parse_duration(text: str, seconds: float | None) -> None:
    """The health block's spellings, through the one grammar and the block's own range."""
    assert probe_duration(text) == seconds


# Go's grammar, shared with the credential-provider configuration, differs from
# the health block's own: a sign is read (the health block refuses negatives).
GO_DURATIONS = [
    ("-1s", -1.0),
    ("+1s", 1.0),
    ("0", 0.0),
    ("1.s", 1.0),
    (".5s", 0.5),
    ("1us", 1e-6),
    ("١s", None),
    ("１s", None),
]


@pytest.mark.parametrize(
    ("text", "seconds"), [(t, s) for t, s in DURATIONS if t != "-1s"] + GO_DURATIONS
)
def test_the_one_duration_grammar(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@given(st.integers(0, 10**6), st.sampled_from(["ms", "s", "m", "h"]))
def test_duration_round_trip(number: int, unit: str) -> None:
    factor = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    assert probe_duration(f"{number}{unit}") == pytest.approx(number * factor)
    assert parse_duration(f"{number}{unit}") == pytest.approx(number * factor)


def test_health_defaults_match_the_issue() -> None:
    assert _load().health == HealthSettings(
        interval=10.0, timeout=2.0, failure_threshold=3, success_threshold=1
    )
    rule = _load().rules[0]
    assert (rule.on_mirror_down, rule.ca_file) == ("fallback", None)


VALID = [
    pytest.param(
        {"interval": "1s", "timeout": "200ms", "failureThreshold": 2, "successThreshold": 2},
        HealthSettings(1.0, 0.2, 2, 2),
        id="all-set",
    ),
    pytest.param({"interval": "1m"}, HealthSettings(60.0, 2.0, 3, 1), id="interval-only"),
    pytest.param({"timeout": "10s"}, HealthSettings(10.0, 10.0, 3, 1), id="timeout-equals"),
]


@pytest.mark.parametrize(("block", "expected"), VALID)
def test_health_block(block: dict[str, object], expected: HealthSettings) -> None:
    assert _load(block).health == expected


INVALID = [
    pytest.param(
        {"interval": 10},
        [("health.interval", "10 is not a duration (write it like 10s, 500ms or 1m30s)")],
        id="interval-number",
    ),
    pytest.param(
        {"interval": "10"},
        [("health.interval", '"10" is not a duration (write it like 10s, 500ms or 1m30s)')],
        id="interval-no-unit",
    ),
    pytest.param(
        {"interval": "10ms"},
        [("health.interval", '"10ms" is outside 0.1s to 3600s')],
        id="interval-too-short",
    ),
    pytest.param(
        {"timeout": "0s"}, [("health.timeout", '"0s" must be more than 0s')], id="timeout-zero"
    ),
    pytest.param(
        {"interval": "1s", "timeout": "2s"},
        [("health.timeout", '"2s" is longer than health.interval (1s)')],
        id="timeout-longer-than-interval",
    ),
    pytest.param(
        {"failureThreshold": 0},
        [("health.failureThreshold", "0 is not a whole number from 1 to 100")],
        id="threshold-zero",
    ),
    pytest.param(
        {"successThreshold": True},
        [("health.successThreshold", "true is not a whole number from 1 to 100")],
        id="threshold-boolean",
    ),
    pytest.param(
        {"failureThreshold": "3"},
        [("health.failureThreshold", '"3" is not a whole number from 1 to 100')],
        id="threshold-string",
    ),
    pytest.param(
        {"period": "1s"},
        [
            (
                "health.period",
                "unknown field (expected one of: interval, timeout, "
                "failureThreshold, successThreshold)",
            )
        ],
        id="unknown-key",
    ),
    pytest.param(["10s"], [("health", "must be a mapping, got a list")], id="not-a-mapping"),
]


@pytest.mark.parametrize(("block", "expected"), INVALID)
def test_health_block_errors(block: object, expected: list[tuple[str, str]]) -> None:
    with pytest.raises(policy.PolicyError) as caught:
        _load(block)
    assert [(e.path, e.message) for e in caught.value.errors] == expected


def test_rule_settings_errors() -> None:
    with pytest.raises(policy.PolicyError) as caught:
        policy.load(
            {
                "mirrors": [
                    {
                        "source": "docker.io",
                        "mirror": "m.example/a",
                        "onMirrorDown": "retry",
                        "caFile": "/a.pem",
                    },
                    {"source": "quay.io", "mirror": "m.example/b", "caFile": "/b.pem"},
                    {"source": "ghcr.io", "mirror": "n.example/c", "caFile": 3},
                ]
            }
        )
    assert [(e.path, e.message) for e in caught.value.errors] == [
        ("mirrors[0].onMirrorDown", '"retry" is not one of: fallback, keep'),
        ("mirrors[2].caFile", "must be the path of a PEM CA bundle, got 3"),
        (
            "mirrors[1].caFile",
            '"/b.pem" differs from mirrors[0].caFile ("/a.pem") on the same '
            'mirror host "m.example"',
        ),
    ]


DOWN = Health(down={"harbor.corp.example": "connection refused"})
BAD_LOGIN = Health(failing={"harbor-pull": "login refused (HTTP 401)"})
ELSEWHERE = Health(down={"other.example": "timed out"})


def _pod(*images: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": f"c{i}", "image": image} for i, image in enumerate(images)]
        },
    }


# health, onMirrorDown, rewritten site keys, fallbacks, warnings
PLANS = [
    pytest.param(
        policy.HEALTHY, "fallback", ["containers/c0", "containers/c1"], 0, [], id="healthy"
    ),
    pytest.param(
        ELSEWHERE, "fallback", ["containers/c0", "containers/c1"], 0, [], id="another-mirror-down"
    ),
    pytest.param(
        DOWN,
        "fallback",
        ["containers/c1"],
        1,
        [
            "containers/c0: image 'nginx' left as written: mirror harbor.corp.example/"
            "dockerhub-proxy of mirrors[0] is down: connection refused (onMirrorDown: fallback)"
        ],
        id="down-fallback",
    ),
    pytest.param(
        BAD_LOGIN,
        "fallback",
        ["containers/c1"],
        1,
        [
            "containers/c0: image 'nginx' left as written: credential 'harbor-pull' of mirrors[0] "
            "cannot log in to mirror harbor.corp.example/dockerhub-proxy: login refused (HTTP 401) "
            "(onMirrorDown: fallback)"
        ],
        id="credential-fallback",
    ),
    pytest.param(
        DOWN,
        "keep",
        ["containers/c0", "containers/c1"],
        0,
        [
            "containers/c0: image 'nginx' rewritten although mirror harbor.corp.example/"
            "dockerhub-proxy of mirrors[0] is down: connection refused (onMirrorDown: keep)"
        ],
        id="down-keep",
    ),
]


@pytest.mark.parametrize(("health", "on_down", "rewritten", "fallbacks", "warnings"), PLANS)
def test_plan_with_health(
    health: Health, on_down: str, rewritten: list[str], fallbacks: int, warnings: list[str]
) -> None:
    mirror_policy = _load(onMirrorDown=on_down)
    result = policy.plan(
        _pod("nginx", "quay.io/prometheus/x:1"),
        namespace="default",
        mirror_policy=mirror_policy,
        health=health,
    )
    assert [r.site.key for r in result.rewrites] == rewritten
    assert result.fallbacks == fallbacks
    assert list(result.warnings) == warnings
    # A fallback needs no credential: no pull secret is made for a mirror not used.
    assert result.pull_secrets == (
        ("mirrorgate-harbor-pull",) if "containers/c0" in rewritten else ()
    )


def test_keep_records_the_problem_for_the_audit() -> None:
    result = policy.plan(
        _pod("nginx"), namespace="default", mirror_policy=_load(onMirrorDown="keep"), health=DOWN
    )
    (rewrite,) = result.rewrites
    assert rewrite.health.startswith(
        "mirror harbor.corp.example/dockerhub-proxy of mirrors[0] is down"
    )
    assert policy.audit_mode_line(rewrite, health=True).endswith(f"; health: {rewrite.health}")
    healthy = policy.plan(_pod("nginx"), namespace="default", mirror_policy=_load()).rewrites[0]
    assert policy.audit_mode_line(healthy, health=True).endswith("; health: up")
    assert "health" not in policy.audit_mode_line(healthy)


def test_a_pod_already_on_the_mirror_is_left_alone_when_it_is_down() -> None:
    result = policy.plan(
        _pod(f"{HUB}/library/nginx"), namespace="default", mirror_policy=_load(), health=DOWN
    )
    assert (result.rewrites, result.fallbacks, result.warnings) == ((), 0, ())


@settings(deadline=None)  # as the other scenario properties: the machine is shared
@given(strategies.scenarios(), st.data())
def test_fallback_leaves_every_unhealthy_image_as_written(
    scenario: tuple[dict[str, Any], str, policy.Policy], data: st.DataObject
) -> None:
    """Under fallback, no rewrite targets a down mirror; a healthy state changes nothing."""
    pod, namespace, mirror_policy = scenario
    hosts = sorted({r.mirror.host for r in mirror_policy.rules})
    down = data.draw(st.sets(st.sampled_from(hosts)) if hosts else st.just(set()))
    health = Health(down=dict.fromkeys(down, "refused"))
    assert policy.plan(
        pod, namespace=namespace, mirror_policy=mirror_policy, health=policy.HEALTHY
    ) == policy.plan(pod, namespace=namespace, mirror_policy=mirror_policy)
    result = policy.plan(pod, namespace=namespace, mirror_policy=mirror_policy, health=health)
    healthy = policy.plan(pod, namespace=namespace, mirror_policy=mirror_policy)
    for rewrite in result.rewrites:
        assert policy.parse_normalized(rewrite.new_image).domain not in down
    assert len(result.rewrites) + result.fallbacks == len(healthy.rewrites)
