"""Path-scoped credentials: one mirror host, one login per project."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.policy.rules import Mirror

HOST = "harbor.corp.example"


def _policy(credentials: dict[str, Any], mirrors: list[dict[str, Any]] | None = None) -> Any:
    return {"mirrors": mirrors or [], "credentials": credentials}


def _errors(document: object) -> list[tuple[str, str]]:
    with pytest.raises(policy.PolicyError) as caught:
        policy.load(document)
    return [(e.path, e.message) for e in caught.value.errors]


def test_two_credentials_on_one_host_with_different_paths_load() -> None:
    loaded = policy.load(
        _policy(
            {
                "team-a": {"namespaces": ["*"], "registry": f"{HOST}/team-a"},
                "team-b": {"namespaces": ["*"], "registry": f"{HOST}/team-b"},
            },
            [
                {"source": "quay.io/a", "mirror": f"{HOST}/team-a", "credential": "team-a"},
                {"source": "quay.io/b", "mirror": f"{HOST}/team-b/proxy", "credential": "team-b"},
            ],
        )
    )
    assert loaded.grants["team-a"].registry == Mirror(HOST, "team-a")
    assert loaded.grants["team-b"].registry == Mirror(HOST, "team-b")
    assert [r.credentials for r in loaded.rules] == [("team-a",), ("team-b",)]


INVALID = [
    pytest.param(
        {
            "a": {"namespaces": ["*"], "registry": f"{HOST}/team-a"},
            "b": {"namespaces": ["*"], "registry": f"{HOST}/team-a/"},
        },
        [],
        [
            (
                "credentials.b.registry",
                f'"{HOST}/team-a" is already the registry of credentials.a; '
                "give each credential its own host or path",
            )
        ],
        id="same host and path twice names both",
    ),
    pytest.param(
        {
            "a": {"namespaces": ["*"], "registry": HOST},
            "b": {"namespaces": ["*"], "registry": HOST},
        },
        [],
        [
            (
                "credentials.b.registry",
                f'"{HOST}" is already the registry of credentials.a; '
                "give each credential its own host or path",
            )
        ],
        id="same host twice",
    ),
    pytest.param(
        {"a": {"namespaces": ["*"], "registry": "Harbor/x"}},
        [],
        [
            (
                "credentials.a.registry",
                '"Harbor/x" is not a valid registry host: it has '
                "upper-case letters (registry hosts are written in lower case)",
            )
        ],
        id="invalid registry",
    ),
    pytest.param(
        {"a": {"namespaces": ["*"], "registry": f"{HOST}/team-a"}},
        [{"source": "quay.io", "mirror": f"{HOST}/team-ab", "credential": "a"}],
        [
            (
                "mirrors[0].credential",
                f'credential "a" is for "{HOST}/team-a", which does not '
                f'cover the mirror "{HOST}/team-ab": the kubelet would not send it',
            )
        ],
        id="a scope covers whole path components only",
    ),
    pytest.param(
        {"a": {"namespaces": ["*"], "registry": f"{HOST}:5000"}},
        [{"source": "quay.io", "mirror": HOST, "credential": "a"}],
        [
            (
                "mirrors[0].credential",
                f'credential "a" is for "{HOST}:5000", which does not '
                f'cover the mirror "{HOST}": the kubelet would not send it',
            )
        ],
        id="the port is part of the host",
    ),
    pytest.param(
        {"a": {"namespaces": ["*"], "provider": "../bin/sh"}},
        [],
        [
            (
                "credentials.a.provider",
                '"../bin/sh" is not a valid provider name (a file name in '
                "--credential-provider-bin-dir)",
            )
        ],
        id="provider is a file name",
    ),
]


@pytest.mark.parametrize(("credentials", "mirrors", "expected"), INVALID)
def test_invalid_scopes(
    credentials: dict[str, Any], mirrors: list[dict[str, Any]], expected: list[tuple[str, str]]
) -> None:
    assert _errors(_policy(credentials, mirrors)) == expected


COMPONENT = st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True)


@given(scope=st.lists(COMPONENT, max_size=3), rest=st.lists(COMPONENT, max_size=3))
def test_a_scope_covers_exactly_the_mirrors_under_it(scope: list[str], rest: list[str]) -> None:
    """A scope covers a mirror iff the mirror's path starts with the scope's components."""
    grant = policy.CredentialGrant(
        name="a", namespaces=("*",), registry=Mirror(HOST, "/".join(scope))
    )
    mirror_path = "/".join(rest)
    expected = rest[: len(scope)] == scope
    assert grant.covers(Mirror(HOST, mirror_path)) == expected
    assert not grant.covers(Mirror("other.example", mirror_path))
