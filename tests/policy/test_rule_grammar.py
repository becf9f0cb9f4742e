"""The rule grammar of issues 30 and 32: credential lists, onNotGranted, skipPullPolicyNever,
and the catch-all source."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.policy.globoverlap import shared_namespace
from mirrorgate.policy.rules import Source

HARBOR = "harbor.corp.example"


def _teams(a: dict[str, Any], b: dict[str, Any], **rule: Any) -> dict[str, Any]:
    return {
        "mirrors": [
            {"source": "docker.io", "mirror": f"{HARBOR}/hub", "credential": ["robot-a", "robot-b"]}
            | rule
        ],
        "credentials": {"robot-a": a, "robot-b": b},
    }


def _errors(document: object) -> list[tuple[str, str]]:
    with pytest.raises(policy.PolicyError) as raised:
        policy.load(document)
    return [(e.path, e.message) for e in raised.value.errors]


def test_a_credential_list_loads_in_order() -> None:
    loaded = policy.load(_teams({"namespaces": ["team-a"]}, {"namespaces": ["team-b"]}))
    (rule,) = loaded.rules
    assert rule.credentials == ("robot-a", "robot-b")
    assert rule.on_not_granted == "skip"


def test_a_single_credential_is_a_list_of_one() -> None:
    loaded = policy.load(
        {
            "mirrors": [{"source": "docker.io", "mirror": f"{HARBOR}/hub", "credential": "r"}],
            "credentials": {"r": {"namespaces": ["shop"]}},
        }
    )
    assert loaded.rules[0].credentials == ("r",)


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        pytest.param(["shop", "team-a"], ["team-a"], '"team-a"', id="same-name"),
        pytest.param(["team-*"], ["team-b"], '"team-b"', id="glob-and-name"),
        pytest.param(["team-*"], ["*-b"], '"team-b"', id="two-globs"),
        pytest.param(["t?am"], ["t[a-e]am"], '"taam"', id="classes"),
    ],
)
def test_two_credentials_granted_to_one_namespace_are_refused(
    a: list[str], b: list[str], shared: str
) -> None:
    """Either robot could be a Pod's pull secret there: the policy says which namespace,
    and both credentials and the grants that meet."""
    ((path, message),) = _errors(_teams({"namespaces": a}, {"namespaces": b}))
    assert path == "mirrors[0].credential"
    assert message.startswith(f'"robot-a" and "robot-b" are both granted to namespace {shared}')
    assert "credentials.robot-a.namespaces" in message
    assert "credentials.robot-b.namespaces" in message


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (["team-a"], ["team-b"]),
        (["team-a-*"], ["team-b-*"]),
        (["shop?"], ["shop"]),
        (["[!a]*"], ["a*"]),
    ],
)
def test_disjoint_grants_load(a: list[str], b: list[str]) -> None:
    """Globs are warned of as globs (by their grants), never as a shared namespace."""
    loaded = policy.load(_teams({"namespaces": a}, {"namespaces": b}))
    assert [w for w in loaded.warnings if w.path.startswith("mirrors")] == []


def test_a_grant_by_label_is_warned_of_not_refused() -> None:
    """Labels change after loading: whether a namespace is granted both cannot be known."""
    loaded = policy.load(
        _teams({"namespaces": ["team-a"]}, {"namespaceSelector": {"matchLabels": {"t": "b"}}})
    )
    (warning,) = loaded.warnings
    assert warning.path == "mirrors[0].credential"
    assert "credentials.robot-b.namespaceSelector grants by label" in warning.message
    assert "credential-ambiguous" in warning.message


def test_a_rule_credential_must_cover_its_mirror_each() -> None:
    document = _teams(
        {"namespaces": ["team-a"]}, {"namespaces": ["team-b"], "registry": "other.example"}
    )
    ((path, message),) = _errors(document)
    assert path == "mirrors[0].credential[1]"
    assert message.startswith('credential "robot-b" is for "other.example"')


@pytest.mark.parametrize("value", ["skip", "next", "deny"])
def test_on_not_granted_values(value: str) -> None:
    loaded = policy.load(
        _teams({"namespaces": ["team-a"]}, {"namespaces": ["team-b"]}, onNotGranted=value)
    )
    assert loaded.rules[0].on_not_granted == value


@pytest.mark.parametrize(("written", "expected"), [(None, True), (True, True), (False, False)])
def test_skip_pull_policy_never(written: bool | None, expected: bool) -> None:
    document = {} if written is None else {"skipPullPolicyNever": written}
    assert policy.load(document).skip_pull_policy_never is expected


def test_the_catch_all_source_loads() -> None:
    loaded = policy.load({"mirrors": [{"source": "*", "mirror": f"{HARBOR}/cache"}]})
    (rule,) = loaded.rules
    assert rule.source == Source("", "", True)
    assert rule.source.catch_all
    assert str(rule.source) == "*"


def test_two_catch_alls_are_refused() -> None:
    document = {
        "mirrors": [
            {"source": "*", "mirror": f"{HARBOR}/a"},
            {"source": "*", "mirror": f"{HARBOR}/b"},
        ]
    }
    assert _errors(document) == [("mirrors[1].source", '"*" is already the source of mirrors[0]')]


@pytest.mark.parametrize("source", ["**", "*/library", "*:5000", "*."])
def test_other_stars_are_refused(source: str) -> None:
    ((path, _),) = _errors({"mirrors": [{"source": source, "mirror": f"{HARBOR}/a"}]})
    assert path == "mirrors[0].source"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("*", "*", "a"),
        ("shop", "shop", "shop"),
        ("shop", "shoe", None),
        ("team-[ab]", "team-[!a]", "team-b"),
        ("x*", "y*", None),
        ("a?", "?b", "ab"),
        ("[", "[", None),
        ("*", "", None),
    ],
)
def test_shared_namespace(a: str, b: str, expected: str | None) -> None:
    assert shared_namespace(a, b) == expected


_GLOB = st.text("ab-*?", min_size=1, max_size=4) | st.sampled_from(["[ab]*", "[!a]?", "a[-b]"])
_NAME = st.text("ab-", min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(a=st.lists(_GLOB, min_size=1, max_size=2), b=st.lists(_GLOB, min_size=1, max_size=2))
def test_the_load_check_agrees_with_the_grants(a: list[str], b: list[str]) -> None:
    """A policy loads exactly when no namespace is granted both credentials, as admission
    grants them (fnmatch): the witness the loader names is granted both, and a policy
    that loads grants no name both."""
    document = _teams({"namespaces": a}, {"namespaces": b})
    try:
        loaded = policy.load(document)
    except policy.PolicyError as error:
        ((message),) = [e.message for e in error.errors]
        witness = message.split("namespace ", 1)[1].split('"')[1]
        assert any(fnmatch.fnmatchcase(witness, g) for g in a)
        assert any(fnmatch.fnmatchcase(witness, g) for g in b)
        return
    for name in ("a", "b", "ab", "ba", "a-b", "aa", "bb", "-", "a-", "-b", "aba", "bab"):
        assert not (loaded.is_granted("robot-a", name) and loaded.is_granted("robot-b", name))


@settings(max_examples=200, deadline=None)
@given(a=_GLOB, b=_GLOB, name=_NAME)
def test_a_name_both_globs_match_means_they_share_one(a: str, b: str, name: str) -> None:
    if fnmatch.fnmatchcase(name, a) and fnmatch.fnmatchcase(name, b):
        assert shared_namespace(a, b) is not None
