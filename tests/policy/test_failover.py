"""Several mirrors per source: the grammar, the resolution and the planner's choice."""

from __future__ import annotations

from typing import Any

import pytest

from mirrorgate import policy
from mirrorgate.policy.health import Health

A = "harbor-a.corp.example/hub"
B = "harbor-b.corp.example/hub"
C = "cache.corp.example/hub"


def _load(*mirror: object, on_down: str = "fallback", **extra: Any) -> policy.Policy:
    return policy.load(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": list(mirror), "onMirrorDown": on_down, **extra},
                {"source": "quay.io", "mirror": "mirror.corp.example/quay"},
            ],
            "credentials": {
                "a-pull": {"namespaces": ["shop", "team-a"]},
                "b-pull": {"namespaces": ["shop"]},
            },
        }
    )


POLICY = _load({"url": A, "credential": "a-pull"}, {"url": B, "credential": "b-pull"}, C)


def _errors(document: dict[str, Any]) -> list[str]:
    with pytest.raises(policy.PolicyError) as caught:
        policy.load(document)
    return [str(e) for e in caught.value.errors]


def _pod(*images: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)]},
    }


def _plan(health: Health = policy.HEALTHY, namespace: str = "shop", **kw: Any) -> Any:
    return policy.plan(
        _pod("nginx:1.25"),
        namespace=namespace,
        mirror_policy=kw.pop("mirror_policy", POLICY),
        health=health,
        **kw,
    )


# --- the grammar -----------------------------------------------------------


def test_each_entry_of_a_list_is_a_rule_of_its_own_in_order() -> None:
    entries = POLICY.mirror_list(POLICY.rules[0])
    assert [(r.index, r.position, str(r.mirror), r.credentials) for r in entries] == [
        (0, 0, A, ("a-pull",)),
        (0, 1, B, ("b-pull",)),
        (0, 2, C, ()),
    ]
    assert [r.label for r in entries] == [
        "mirrors[0].mirror[0]",
        "mirrors[0].mirror[1]",
        "mirrors[0].mirror[2]",
    ]
    # A rule of one mirror is as before: its label and its list of one.
    quay = POLICY.rules[-1]
    assert (quay.label, quay.position, POLICY.mirror_list(quay)) == ("mirrors[1]", None, (quay,))


def test_entry_fields_of_their_own_transport_and_scheme() -> None:
    loaded = _load(
        {"url": A, "caFile": "/etc/ca/a.pem"}, {"url": "http://cache.corp.example:5000/hub"}
    )
    first, second = loaded.mirror_list(loaded.rules[0])
    assert (first.ca_file, first.scheme, first.skip_verify) == ("/etc/ca/a.pem", "https", False)
    assert (second.scheme, second.mirror.host, second.ca_file) == (
        "http",
        "cache.corp.example:5000",
        None,
    )
    assert all(r.on_mirror_down == "fallback" for r in (first, second))


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        pytest.param(
            {"mirror": [A, B], "credential": "a-pull"},
            "mirrors[0].credential: cannot stand next to a list of mirrors: give each mirror "
            "its own (mirrors[0].mirror[N].credential)",
            id="rule-credential-beside-a-list",
        ),
        pytest.param(
            {"mirror": [A, B], "caFile": "/ca.pem"},
            "mirrors[0].caFile: cannot stand next to a list of mirrors: give each mirror "
            "its own (mirrors[0].mirror[N].caFile)",
            id="rule-ca-beside-a-list",
        ),
        pytest.param(
            {"mirror": []},
            "mirrors[0].mirror: is an empty list: name at least one mirror",
            id="empty",
        ),
        pytest.param(
            {"mirror": [A, 7]},
            "mirrors[0].mirror[1]: must be a mirror URL or a mapping with url, got a number",
            id="not-a-string",
        ),
        pytest.param(
            {"mirror": [A, {"credential": "a-pull"}]},
            "mirrors[0].mirror[1].url: is required",
            id="no-url",
        ),
        pytest.param(
            {"mirror": [A, {"url": B, "onMirrorDown": "keep"}]},
            "mirrors[0].mirror[1].onMirrorDown: unknown field (expected one of: url, credential, "
            "caFile, insecureSkipVerify)",
            id="rule-field-in-an-entry",
        ),
        pytest.param(
            {"mirror": [A, A]},
            f'mirrors[0].mirror[1]: "{A}" is already the mirror of mirrors[0].mirror[0]; give '
            "each source its own mirror path",
            id="twice",
        ),
        pytest.param(
            {"mirror": [A, {"url": "ftp://x.example/hub"}]},
            'mirrors[0].mirror[1].url: "ftp://x.example/hub": "ftp://" is not a mirror scheme '
            "(write http:// for a plain-HTTP mirror, https:// or no scheme for HTTPS)",
            id="bad-scheme",
        ),
        pytest.param(
            {"mirror": [A, {"url": B, "credential": "nobody"}]},
            'mirrors[0].mirror[1].credential: "nobody" is not granted to any namespace: add '
            "credentials.nobody.namespaces",
            id="ungranted-credential",
        ),
        pytest.param(
            {"mirror": [A, {"url": "http://cache.corp.example/hub", "insecureSkipVerify": True}]},
            "mirrors[0].mirror[1].insecureSkipVerify: has no use on a plain-HTTP (http://) mirror",
            id="transport",
        ),
        pytest.param(
            {"mirror": [A] * 9},
            "mirrors[0].mirror: lists 9 mirrors; at most 8",
            id="too-many",
        ),
    ],
)
def test_mirror_list_errors_name_the_entry(rule: dict[str, Any], expected: str) -> None:
    document = {
        "mirrors": [{"source": "docker.io", **rule}],
        "credentials": {"a-pull": {"namespaces": ["shop"]}},
    }
    assert expected in _errors(document)


def test_a_list_entry_collides_with_another_rule_s_mirror() -> None:
    errors = _errors(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": [A, B]},
                {"source": "quay.io", "mirror": B},
            ]
        }
    )
    assert errors == [
        f'mirrors[1].mirror: "{B}" is already the mirror of mirrors[0].mirror[1]; give each '
        "source its own mirror path"
    ]


def test_entries_on_one_host_must_agree_on_the_transport() -> None:
    errors = _errors(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": [A, {"url": "harbor-a.corp.example/other"}]},
                {
                    "source": "quay.io",
                    "mirror": "harbor-a.corp.example/quay",
                    "insecureSkipVerify": True,
                },
            ]
        }
    )
    assert errors == [
        "mirrors[1].insecureSkipVerify: true differs from mirrors[0].mirror[0].insecureSkipVerify "
        '(false) on the same mirror host "harbor-a.corp.example"'
    ]


# --- resolving and choosing ------------------------------------------------


def test_resolution_carries_every_mirror_in_order() -> None:
    found = POLICY.resolve("nginx:1.25")
    assert found.outcome == "rewrite"
    assert found.rule is not None
    assert (found.rule.label, found.new_image) == (
        "mirrors[0].mirror[0]",
        f"{A}/library/nginx:1.25",
    )
    assert [(s.rule.label, s.new_image) for s in found.standbys] == [
        ("mirrors[0].mirror[1]", f"{B}/library/nginx:1.25"),
        ("mirrors[0].mirror[2]", f"{C}/library/nginx:1.25"),
    ]
    assert POLICY.resolve("quay.io/org/app:1").standbys == ()


def test_every_mirror_must_hold_the_image() -> None:
    loaded = policy.load(
        {"mirrors": [{"source": "ghcr.io/org/app", "mirror": ["m.example/app", "n.example"]}]}
    )
    found = loaded.resolve("ghcr.io/org/app:1")
    assert (found.outcome, found.error) == (
        "invalid",
        "mirrors[0].mirror[1]'s mirror has no repository path to hold this image",
    )


def test_first_mirror_when_all_are_up() -> None:
    result = _plan()
    assert [(r.new_image, r.rule_label, r.mirror) for r in result.rewrites] == [
        (f"{A}/library/nginx:1.25", "mirrors[0].mirror[0]", A)
    ]
    assert result.pull_secrets == ("mirrorgate-a-pull",)
    assert result.warnings == ()


def test_first_down_serves_from_the_second_with_only_its_secret() -> None:
    down = Health(down={"harbor-a.corp.example": "connection refused"})
    result = _plan(down)
    assert [(r.new_image, r.rule_label, r.mirror, r.health) for r in result.rewrites] == [
        (f"{B}/library/nginx:1.25", "mirrors[0].mirror[1]", B, "up")
    ]
    assert result.pull_secrets == ("mirrorgate-b-pull",)
    assert result.credentials == ("b-pull",)
    assert result.fallbacks == 0
    assert result.warnings == (
        "containers/c0: image 'nginx:1.25' rewritten to mirrors[0].mirror[1]'s "
        f"mirror {B}: mirror {A} of mirrors[0].mirror[0] is down: connection refused",
    )


def test_a_credential_that_cannot_log_in_passes_its_mirror_over() -> None:
    result = _plan(Health(failing={"a-pull": "login refused (HTTP 401)"}))
    assert [r.new_image for r in result.rewrites] == [f"{B}/library/nginx:1.25"]
    assert result.pull_secrets == ("mirrorgate-b-pull",)


def test_two_down_serves_from_the_third_without_a_secret() -> None:
    down = Health(down={"harbor-a.corp.example": "refused", "harbor-b.corp.example": "timed out"})
    result = _plan(down)
    assert [r.new_image for r in result.rewrites] == [f"{C}/library/nginx:1.25"]
    assert result.pull_secrets == ()
    assert "mirror harbor-b.corp.example/hub of mirrors[0].mirror[1] is down" in result.warnings[0]


ALL_DOWN = Health(
    down={
        "harbor-a.corp.example": "refused",
        "harbor-b.corp.example": "refused",
        "cache.corp.example": "refused",
    }
)


def test_none_up_falls_back_to_the_original_naming_every_mirror() -> None:
    result = _plan(ALL_DOWN)
    assert result.rewrites == ()
    assert result.pull_secrets == ()
    assert result.outcomes == {"containers/c0": "mirror-unhealthy"}
    assert result.unmirrored == {"containers/c0": "mirror-unhealthy"}
    assert result.fallbacks == 1
    (warning,) = result.warnings
    assert warning.endswith("(onMirrorDown: fallback)")
    for label in ("mirrors[0].mirror[0]", "mirrors[0].mirror[1]", "mirrors[0].mirror[2]"):
        assert f"of {label} is down: refused" in warning


def test_none_up_keeps_the_first() -> None:
    keep = _load(
        {"url": A, "credential": "a-pull"}, {"url": B, "credential": "b-pull"}, C, on_down="keep"
    )
    result = _plan(ALL_DOWN, mirror_policy=keep)
    assert [(r.new_image, r.mirror) for r in result.rewrites] == [(f"{A}/library/nginx:1.25", A)]
    assert result.pull_secrets == ("mirrorgate-a-pull",)
    assert result.rewrites[0].health.startswith(f"mirror {A} of mirrors[0].mirror[0] is down")
    assert result.warnings[0].endswith("(onMirrorDown: keep)")


def test_a_mirror_not_granted_to_the_namespace_is_passed_over_without_a_warning() -> None:
    # team-a may use a-pull only: with A down it is not offered B (b-pull is shop's).
    result = _plan(namespace="team-a")
    assert [r.mirror for r in result.rewrites] == [A]
    down = Health(down={"harbor-a.corp.example": "refused"})
    result = _plan(down, namespace="team-a")
    assert [r.mirror for r in result.rewrites] == [C]
    assert result.pull_secrets == ()
    only_b = _load({"url": A, "credential": "b-pull"}, {"url": B, "credential": "a-pull"})
    result = _plan(mirror_policy=only_b, namespace="team-a")
    assert [r.mirror for r in result.rewrites] == [B]
    assert result.warnings == ()


def test_no_mirror_granted_is_not_granted_naming_the_first() -> None:
    only = _load({"url": A, "credential": "b-pull"}, {"url": B, "credential": "b-pull"})
    result = _plan(mirror_policy=only, namespace="team-a")
    assert result.rewrites == ()
    assert result.outcomes == {"containers/c0": "not-granted"}
    assert result.warnings == (
        "containers/c0: image 'nginx:1.25' left as written: credential 'b-pull' of "
        "mirrors[0].mirror[0] is not granted to namespace 'team-a'",
    )


def test_an_image_already_on_a_later_mirror_is_final_with_that_mirror_s_secret() -> None:
    result = policy.plan(_pod(f"{B}/library/nginx:1.25"), namespace="shop", mirror_policy=POLICY)
    assert result.rewrites == ()
    assert result.outcomes == {"containers/c0": "already-mirrored"}
    assert result.pull_secrets == ("mirrorgate-b-pull",)


def test_planning_the_failed_over_pod_again_changes_nothing() -> None:
    down = Health(down={"harbor-a.corp.example": "refused"})
    first = _plan(down)
    pod = _pod(first.rewrites[0].new_image)
    pod["spec"]["imagePullSecrets"] = [{"name": s} for s in first.pull_secrets]
    # Whatever the health is now, the image on B stays on B.
    for health in (policy.HEALTHY, down):
        again = policy.plan(pod, namespace="shop", mirror_policy=POLICY, health=health)
        assert (again.rewrites, again.pull_secrets) == ((), ())


# --- with per-team credentials and onNotGranted ------------------------------


TEAMS = policy.load(
    {
        "mirrors": [
            {
                "source": "ghcr.io/org",
                "onNotGranted": "next",
                "mirror": [
                    {"url": "harbor-a.corp.example/org", "credential": ["a-team-a", "a-team-b"]},
                    {"url": "harbor-b.corp.example/org", "credential": "b-team-a"},
                ],
            },
            {"source": "ghcr.io", "mirror": "mirror.corp.example/ghcr"},
        ],
        "credentials": {
            "a-team-a": {"namespaces": ["team-a"]},
            "a-team-b": {"namespaces": ["team-b"]},
            "b-team-a": {"namespaces": ["team-a"]},
        },
    }
)
ORG = "ghcr.io/org/app:1"
DOWN_A = Health(down={"harbor-a.corp.example": "refused"})


def _team_plan(
    namespace: str, health: Health = policy.HEALTHY
) -> tuple[list[str], tuple[str, ...]]:
    result = policy.plan(_pod(ORG), namespace=namespace, mirror_policy=TEAMS, health=health)
    return [r.new_image for r in result.rewrites], result.pull_secrets


def test_each_mirror_of_a_list_takes_the_team_s_own_credential() -> None:
    assert _team_plan("team-b") == (
        ["harbor-a.corp.example/org/app:1"],
        ("mirrorgate-a-team-b",),
    )
    assert _team_plan("team-a", DOWN_A) == (
        ["harbor-b.corp.example/org/app:1"],
        ("mirrorgate-b-team-a",),
    )


def test_no_granted_mirror_up_is_the_rule_s_fallback_not_the_broader_rule() -> None:
    # team-b has no login on B: with A down, the rule's onMirrorDown decides (fallback).
    assert _team_plan("team-b", DOWN_A) == ([], ())


def test_no_mirror_of_the_list_granted_walks_on_to_the_broader_rule() -> None:
    assert _team_plan("other") == (["mirror.corp.example/ghcr/org/app:1"], ())
    decision = policy.decide_image(TEAMS.resolve(ORG), namespace="other", mirror_policy=TEAMS)
    assert [(r.label, why) for r, why in decision.passed] == [
        (
            "mirrors[0].mirror[0]",
            "none of the credentials 'a-team-a', 'a-team-b' of mirrors[0].mirror[0] is granted "
            "to namespace 'other'",
        )
    ]
