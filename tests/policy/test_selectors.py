"""Grants by namespace label: ``credentials.<name>.namespaceSelector``, as Kubernetes selects."""

from __future__ import annotations

from typing import Any

import pytest

from mirrorgate import policy

TEAM = "corp.example/team"


def _policy(selector: dict[str, Any], namespaces: list[str] | None = None) -> policy.Policy:
    grant: dict[str, Any] = {"namespaceSelector": selector}
    if namespaces is not None:
        grant["namespaces"] = namespaces
    return policy.load(
        {
            "mirrors": [{"source": "quay.io", "mirror": "m.example/quay", "credential": "robot"}],
            "credentials": {"robot": grant},
        }
    )


# selector, labels, granted
MATCHES = [
    pytest.param({"matchLabels": {TEAM: "a"}}, {TEAM: "a"}, True, id="match-labels"),
    pytest.param({"matchLabels": {TEAM: "a"}}, {TEAM: "b"}, False, id="match-labels-other"),
    pytest.param({"matchLabels": {TEAM: "a"}}, {}, False, id="match-labels-absent"),
    pytest.param(
        {"matchLabels": {TEAM: "a", "tier": "prod"}}, {TEAM: "a"}, False, id="all-must-hold"
    ),
    pytest.param(
        {"matchExpressions": [{"key": TEAM, "operator": "In", "values": ["a", "b"]}]},
        {TEAM: "b"},
        True,
        id="in",
    ),
    pytest.param(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["dev"]}]},
        {},
        True,
        id="notin-holds-when-absent",
    ),
    pytest.param(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["dev"]}]},
        {"tier": "dev"},
        False,
        id="notin",
    ),
    pytest.param(
        {"matchExpressions": [{"key": TEAM, "operator": "Exists"}]}, {TEAM: ""}, True, id="exists"
    ),
    pytest.param(
        {"matchExpressions": [{"key": TEAM, "operator": "DoesNotExist"}]},
        {TEAM: "a"},
        False,
        id="does-not-exist",
    ),
]


@pytest.mark.parametrize(("selector", "labels", "granted"), MATCHES)
def test_selector_grants_as_kubernetes_selects(
    selector: dict[str, Any], labels: dict[str, str], granted: bool
) -> None:
    """matchLabels and matchExpressions: every requirement must hold."""
    loaded = _policy(selector)
    assert loaded.is_granted("robot", "any-name", labels) is granted
    assert (loaded.label_grants(labels) == frozenset({"robot"})) is granted


def test_names_and_selector_each_grant() -> None:
    """A grant by name still holds beside a selector; a name is never needed for the label."""
    loaded = _policy({"matchLabels": {TEAM: "a"}}, namespaces=["shop"])
    assert loaded.is_granted("robot", "shop", {})
    assert loaded.is_granted("robot", "team-made-by-a-tenant", {TEAM: "a"})
    assert not loaded.is_granted("robot", "team-made-by-a-tenant", {TEAM: "b"})


def test_unknown_labels_grant_nothing_and_say_so() -> None:
    """Before mirrorgate's Namespace cache holds the labels, only names grant, and the
    reason names the selector that could not be read."""
    loaded = _policy({"matchLabels": {TEAM: "a"}})
    assert not loaded.is_granted("robot", "team-a", None)
    (rule,) = loaded.rules
    reason = loaded.choose_credential(rule, "team-a", None).refusal
    assert reason is not None
    assert "credentials.robot.namespaceSelector" in reason
    assert "not known yet" in reason
    assert loaded.choose_credential(rule, "team-a", {TEAM: "a"}) == ("robot", None, False)


def test_plan_uses_the_namespace_labels() -> None:
    """Planning rewrites under a selector grant only with labels that match."""
    loaded = _policy({"matchLabels": {TEAM: "a"}})
    pod = {"spec": {"containers": [{"name": "app", "image": "quay.io/org/app:1"}]}}
    granted = policy.plan(
        pod, namespace="team-a", mirror_policy=loaded, namespace_labels={TEAM: "a"}
    )
    assert [r.new_image for r in granted.rewrites] == ["m.example/quay/org/app:1"]
    assert granted.pull_secrets == ("mirrorgate-robot",)
    for labels in ({TEAM: "b"}, None):
        refused = policy.plan(
            pod, namespace="team-a", mirror_policy=loaded, namespace_labels=labels
        )
        assert refused.rewrites == ()
        assert dict(refused.outcomes) == {"containers/app": "not-granted"}


# grant document, field path, message fragment
INVALID = [
    pytest.param(
        {"namespaceSelector": {}},
        "credentials.robot.namespaceSelector",
        "selects every namespace",
        id="empty-selects-everything",
    ),
    pytest.param(
        {"namespaceSelector": {"matchLabels": {}, "matchExpressions": []}},
        "credentials.robot.namespaceSelector",
        "selects every namespace",
        id="empty-parts",
    ),
    pytest.param(
        {"namespaceSelector": {"matchLabels": {"Bad Key": "x"}}},
        "credentials.robot.namespaceSelector.matchLabels.Bad Key",
        "is not a label key",
        id="bad-key",
    ),
    pytest.param(
        {"namespaceSelector": {"matchLabels": {TEAM: "not ok"}}},
        f"credentials.robot.namespaceSelector.matchLabels.{TEAM}",
        "is not a label value",
        id="bad-value",
    ),
    pytest.param(
        {"namespaceSelector": {"matchExpressions": [{"key": TEAM, "operator": "In"}]}},
        "credentials.robot.namespaceSelector.matchExpressions[0].values",
        "must not be empty for In",
        id="in-without-values",
    ),
    pytest.param(
        {
            "namespaceSelector": {
                "matchExpressions": [{"key": TEAM, "operator": "Exists", "values": ["a"]}]
            }
        },
        "credentials.robot.namespaceSelector.matchExpressions[0].values",
        "must be empty for Exists",
        id="exists-with-values",
    ),
    pytest.param(
        {"namespaceSelector": {"matchExpressions": [{"key": TEAM, "operator": "Equals"}]}},
        "credentials.robot.namespaceSelector.matchExpressions[0].operator",
        "is not one of: In, NotIn, Exists, DoesNotExist",
        id="unknown-operator",
    ),
    pytest.param(
        {"namespaceSelector": {"matchLabel": {TEAM: "a"}}},
        "credentials.robot.namespaceSelector.matchLabel",
        "unknown field",
        id="misspelt-field",
    ),
    pytest.param(
        {"namespaceSelector": ["x"]},
        "credentials.robot.namespaceSelector",
        "must be a mapping",
        id="not-a-mapping",
    ),
    pytest.param(
        {},
        "credentials.robot.namespaces",
        "is required (or namespaceSelector)",
        id="neither-names-nor-selector",
    ),
]


@pytest.mark.parametrize(("grant", "path", "fragment"), INVALID)
def test_invalid_selectors_are_refused_naming_the_field(
    grant: dict[str, Any], path: str, fragment: str
) -> None:
    """Every problem names its field and what is wrong, never a traceback."""
    with pytest.raises(policy.PolicyError) as raised:
        policy.load({"credentials": {"robot": grant}})
    assert any(e.path == path and fragment in e.message for e in raised.value.errors), str(
        raised.value
    )


@pytest.mark.parametrize(
    ("namespaces", "warned"),
    [
        pytest.param(["team-*"], '"team-*" is a glob', id="glob"),
        pytest.param(["shop", "prod-?"], '"prod-?" is a glob', id="question-mark"),
        pytest.param(["*"], '"*" grants this credential to every opted-in namespace', id="star"),
        pytest.param(["shop", "team-a"], None, id="exact-names"),
    ],
)
def test_policy_warns_of_globs(namespaces: list[str], warned: str | None) -> None:
    """Where tenants can make namespaces, a name glob grants a login to any they make."""
    loaded = policy.load({"credentials": {"robot": {"namespaces": namespaces}}})
    messages = [w.message for w in loaded.warnings if w.path == "credentials.robot.namespaces"]
    if warned is None:
        assert messages == []
    else:
        assert len(messages) == 1
        assert warned in messages[0]
