"""Loading the policy document: what is accepted, and every error with its path."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mirrorgate import policy
from mirrorgate.policy import loader, model
from mirrorgate.policy.rules import Mirror, MirrorRule, Source

ISSUE_EXAMPLE = """
mirrors:
  - source: docker.io
    mirror: harbor.corp.example/dockerhub-proxy
    credential: harbor-pull
  - source: quay.io/prometheus
    mirror: mirror.corp.example/prometheus
  - source: "*.gcr.io"
    mirror: mirror.corp.example/gcr
exclude:
  images: ["registry.k8s.io/pause:*"]
  namespaces: [kube-system]
credentials:
  harbor-pull: {namespaces: ["*"]}
"""

GRANT = {"harbor-pull": {"namespaces": ["*"]}}


def _errors(document: object) -> list[tuple[str, str]]:
    with pytest.raises(policy.PolicyError) as caught:
        policy.load(document)
    return [(e.path, e.message) for e in caught.value.errors]


def _rule(source: object, mirror: object = "mirror.corp.example/m", **extra: Any) -> dict[str, Any]:
    return {"source": source, "mirror": mirror, **extra}


def test_issue_example_loads() -> None:
    """The example policy from the issue loads into the expected rules."""
    loaded = policy.load(yaml.safe_load(ISSUE_EXAMPLE))
    assert loaded.on_credential_error == "skip"
    assert loaded.rules == (
        MirrorRule(
            0,
            Source("docker.io", "", False),
            Mirror("harbor.corp.example", "dockerhub-proxy"),
            ("harbor-pull",),
        ),
        MirrorRule(
            1,
            Source("quay.io", "prometheus", False),
            Mirror("mirror.corp.example", "prometheus"),
            (),
        ),
        MirrorRule(2, Source("gcr.io", "", True), Mirror("mirror.corp.example", "gcr"), ()),
    )
    assert loaded.exclude_images == ("registry.k8s.io/pause:*",)
    assert loaded.exclude_namespaces == ("kube-system",)
    assert loaded.is_granted("harbor-pull", "anything")


# document, attribute checks as (expression name, expected value)
VALID = [
    pytest.param({}, {"on_credential_error": "skip", "rules": ()}, id="empty-mapping-defaults"),
    pytest.param(
        {"mirrors": None, "exclude": None, "credentials": None},
        {"rules": (), "exclude_images": (), "exclude_namespaces": ()},
        id="null-sections",
    ),
    pytest.param({"onCredentialError": "deny"}, {"on_credential_error": "deny"}, id="deny"),
    pytest.param(
        {"mirrors": [_rule("index.docker.io")]},
        {
            "rules": (
                MirrorRule(
                    0, Source("docker.io", "", False), Mirror("mirror.corp.example", "m"), ()
                ),
            )
        },
        id="index.docker.io-canonicalised",
    ),
    pytest.param(
        {"mirrors": [_rule("registry-1.docker.io/bitnami")]},
        {
            "rules": (
                MirrorRule(
                    0,
                    Source("docker.io", "bitnami", False),
                    Mirror("mirror.corp.example", "m"),
                    (),
                ),
            )
        },
        id="registry-1.docker.io-canonicalised",
    ),
    pytest.param(
        {"mirrors": [_rule("localhost:5000", "mirror.corp.example:8443/local/")]},
        {
            "rules": (
                MirrorRule(
                    0,
                    Source("localhost:5000", "", False),
                    Mirror("mirror.corp.example:8443", "local"),
                    (),
                ),
            )
        },
        id="ports-and-trailing-slash",
    ),
    pytest.param(
        {"mirrors": [_rule("localhost", "localhost:5001")]},
        {
            "rules": (
                MirrorRule(0, Source("localhost", "", False), Mirror("localhost:5001", ""), ()),
            )
        },
        id="localhost-and-mirror-without-path",
    ),
    pytest.param(
        {"mirrors": [_rule("[2001:db8::1]:5000/team", "[::1]:5001/v6")]},
        {
            "rules": (
                MirrorRule(
                    0, Source("[2001:db8::1]:5000", "team", False), Mirror("[::1]:5001", "v6"), ()
                ),
            )
        },
        id="ipv6-hosts",
    ),
    pytest.param(
        {"mirrors": [_rule("quay.io/org/team", "m.example/a/b-c")]},
        {
            "rules": (
                MirrorRule(
                    0, Source("quay.io", "org/team", False), Mirror("m.example", "a/b-c"), ()
                ),
            )
        },
        id="multi-component-paths",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", "m.example/a"), _rule("docker.io/library", "m.example/b")]},
        {
            "rules": (
                MirrorRule(0, Source("docker.io", "", False), Mirror("m.example", "a"), ()),
                MirrorRule(1, Source("docker.io", "library", False), Mirror("m.example", "b"), ()),
            )
        },
        id="host-and-path-of-same-host",
    ),
    pytest.param(
        {"mirrors": [_rule("*.gcr.io", "m.example/a"), _rule("gcr.io", "m.example/b")]},
        {
            "rules": (
                MirrorRule(0, Source("gcr.io", "", True), Mirror("m.example", "a"), ()),
                MirrorRule(1, Source("gcr.io", "", False), Mirror("m.example", "b"), ()),
            )
        },
        id="wildcard-and-exact-host-differ",
    ),
    pytest.param(
        {"credentials": {"a": {"namespaces": ["team-*", "prod"]}}},
        {"grants": {"a": model.CredentialGrant("a", ("team-*", "prod"))}},
        id="grant-without-rule",
    ),
    pytest.param(
        {
            "exclude": {
                "images": ["docker.io/library/nginx", "*:debug"],
                "namespaces": ["team-?", "ci-[ab]"],
            }
        },
        {
            "exclude_images": ("docker.io/library/nginx", "*:debug"),
            "exclude_namespaces": ("team-?", "ci-[ab]"),
        },
        id="exclusion-globs",
    ),
]


@pytest.mark.parametrize(("document", "expected"), VALID)
def test_load_valid(document: object, expected: dict[str, object]) -> None:
    """A valid document loads, with defaults and canonical hosts filled in."""
    loaded = policy.load(document)
    assert {name: getattr(loaded, name) for name in expected} == expected


HOST_MSG = "is not a valid registry host"
UPPER = f"{HOST_MSG}: it has upper-case letters (registry hosts are written in lower case)"
DOTLESS = f"{HOST_MSG}: without a '.', a ':port' or localhost it would be read as a Docker Hub name"
SCHEME = (
    f"{HOST_MSG}: write it without a scheme such as https:// (only mirrors[].mirror "
    "takes one: http:// for a plain-HTTP mirror)"
)
BAD_HOST = f"{HOST_MSG}: the host must be letters, digits, '-' and '.', then an optional :port"
CRED_MSG = (
    "is not a valid credential name (lower-case letters, digits and '-', at most 63 characters)"
)
NAMESPACES_REQUIRED = (
    "is required (or namespaceSelector): the namespaces whose Pods may use this credential"
)
TOP_FIELDS = "onCredentialError, skipPullPolicyNever, health, mirrors, exclude, credentials"

INVALID = [
    pytest.param(None, [("", "the policy is empty")], id="empty-document"),
    pytest.param([], [("", "must be a mapping, got a list")], id="document-is-a-list"),
    pytest.param(
        "mode: audit", [("", "must be a mapping, got a string")], id="document-is-a-string"
    ),
    pytest.param({"mode": "audit"}, [("mode", loader._REMOVED_KEYS["mode"])], id="mode-removed"),
    pytest.param(
        {"mode": "enforce"}, [("mode", loader._REMOVED_KEYS["mode"])], id="mode-removed-enforce"
    ),
    pytest.param(
        {"onCredentialError": "fail"},
        [("onCredentialError", '"fail" is not one of: skip, deny')],
        id="on-credential-error",
    ),
    pytest.param(
        {"mirror": []},
        [("mirror", f"unknown field (expected one of: {TOP_FIELDS})")],
        id="unknown-top-level-field",
    ),
    pytest.param(
        {"mirrors": "docker.io"}, [("mirrors", "must be a list, got a string")], id="mirrors-string"
    ),
    pytest.param(
        {"mirrors": {"source": "docker.io"}},
        [("mirrors", "must be a list, got a mapping")],
        id="mirrors-mapping",
    ),
    pytest.param(
        {"mirrors": ["docker.io"]},
        [("mirrors[0]", "must be a mapping with source and mirror, got a string")],
        id="rule-string",
    ),
    pytest.param(
        {"mirrors": [7]},
        [("mirrors[0]", "must be a mapping with source and mirror, got a number")],
        id="rule-number",
    ),
    pytest.param(
        {"mirrors": [{}]},
        [("mirrors[0].source", "is required"), ("mirrors[0].mirror", "is required")],
        id="rule-empty",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", target="x")]},
        [
            (
                "mirrors[0].target",
                "unknown field (expected one of: source, mirror, credential, "
                "onNotGranted, onMirrorDown, caFile, insecureSkipVerify, fixed)",
            )
        ],
        id="rule-unknown-field",
    ),
    pytest.param(
        {"mirrors": [_rule(5)]},
        [("mirrors[0].source", "must be a registry host or host/path, got 5")],
        id="source-number",
    ),
    pytest.param(
        {"mirrors": [_rule(None)]},
        [("mirrors[0].source", "must be a registry host or host/path, got null")],
        id="source-null",
    ),
    pytest.param(
        {"mirrors": [_rule("")]},
        [("mirrors[0].source", 'must be a registry host or host/path, got ""')],
        id="source-empty",
    ),
    pytest.param(
        {"mirrors": [_rule("Docker.io")]},
        [("mirrors[0].source", f'"Docker.io" {UPPER}')],
        id="source-upper-case",
    ),
    pytest.param(
        {"mirrors": [_rule("quay")]},
        [("mirrors[0].source", f'"quay" {DOTLESS}')],
        id="source-dotless-host",
    ),
    pytest.param(
        {"mirrors": [_rule("quay.io/Org")]},
        [("mirrors[0].source", '"quay.io/Org" has an invalid repository path "Org"')],
        id="source-upper-case-path",
    ),
    pytest.param(
        {"mirrors": [_rule("quay.io/org//x")]},
        [("mirrors[0].source", '"quay.io/org//x" has an invalid repository path "org//x"')],
        id="source-empty-path-component",
    ),
    pytest.param(
        {"mirrors": [_rule("https://quay.io")]},
        [("mirrors[0].source", f'"https://quay.io" {SCHEME}')],
        id="source-url-scheme",
    ),
    pytest.param(
        {"mirrors": [_rule("*.gcr.io/p")]},
        [
            (
                "mirrors[0].source",
                '"*.gcr.io/p" is not a valid wildcard host (write '
                "*.example.com: whole hosts only, no port, no path)",
            )
        ],
        id="wildcard-with-path",
    ),
    pytest.param(
        {"mirrors": [_rule("*.*.gcr.io")]},
        [
            (
                "mirrors[0].source",
                '"*.*.gcr.io" is not a valid wildcard host (write '
                "*.example.com: whole hosts only, no port, no path)",
            )
        ],
        id="wildcard-twice",
    ),
    pytest.param(
        {"mirrors": [_rule("*.io")]},
        [
            (
                "mirrors[0].source",
                '"*.io" is not a valid wildcard host (write '
                "*.example.com: whole hosts only, no port, no path)",
            )
        ],
        id="wildcard-top-level-domain",
    ),
    pytest.param(
        {"mirrors": [_rule("*gcr.io")]},
        [("mirrors[0].source", f'"*gcr.io" {BAD_HOST}')],
        id="wildcard-without-dot",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", 3)]},
        [("mirrors[0].mirror", "must be host[:port][/path], got 3")],
        id="mirror-number",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", "Harbor.corp.example/x")]},
        [("mirrors[0].mirror", f'"Harbor.corp.example/x" {UPPER}')],
        id="mirror-upper-case-host",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", "harbor/x")]},
        [("mirrors[0].mirror", f'"harbor/x" {DOTLESS}')],
        id="mirror-dotless-host",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", "harbor.corp.example/X")]},
        [("mirrors[0].mirror", '"harbor.corp.example/X" has an invalid repository path "X"')],
        id="mirror-upper-case-path",
    ),
    pytest.param(
        {"mirrors": [_rule("quay.io", "docker.io/mirror")]},
        [("mirrors[0].mirror", '"docker.io/mirror" is Docker Hub itself, not a mirror')],
        id="mirror-on-docker-hub",
    ),
    pytest.param(
        {"mirrors": [_rule("quay.io", "index.docker.io/x")]},
        [("mirrors[0].mirror", '"index.docker.io/x" is Docker Hub itself, not a mirror')],
        id="mirror-on-index-docker-io",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", credential="harbor-pull")]},
        [
            (
                "mirrors[0].credential",
                '"harbor-pull" is not granted to any namespace: '
                "add credentials.harbor-pull.namespaces",
            )
        ],
        id="credential-not-granted",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", credential="Harbor")]},
        [("mirrors[0].credential", f'"Harbor" {CRED_MSG}')],
        id="credential-upper",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", credential="")]},
        [("mirrors[0].credential", f'"" {CRED_MSG}')],
        id="credential-empty",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", credential=["a", "B", "a", 5])]},
        [
            (
                "mirrors[0].credential[0]",
                '"a" is not granted to any namespace: add credentials.a.namespaces',
            ),
            ("mirrors[0].credential[1]", f'"B" {CRED_MSG}'),
            ("mirrors[0].credential[2]", '"a" is listed twice'),
            ("mirrors[0].credential[3]", f"5 {CRED_MSG}"),
        ],
        id="credential-list",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", credential=[])]},
        [
            (
                "mirrors[0].credential",
                "is an empty list: name at least one credential, or leave the field out",
            )
        ],
        id="credential-empty-list",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", onNotGranted="fall")]},
        [("mirrors[0].onNotGranted", '"fall" is not one of: skip, next, deny')],
        id="on-not-granted",
    ),
    pytest.param(
        {"skipPullPolicyNever": "yes"},
        [("skipPullPolicyNever", 'must be true or false, got "yes"')],
        id="skip-pull-policy-never",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", credential="a" * 64)]},
        [("mirrors[0].credential", f'"{"a" * 64}" {CRED_MSG}')],
        id="credential-too-long",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", "m.example/a"), _rule("index.docker.io", "m.example/b")]},
        [
            (
                "mirrors[1].source",
                '"index.docker.io" (as "docker.io") is already the source of mirrors[0]',
            )
        ],
        id="duplicate-source-via-alias",
    ),
    pytest.param(
        {"mirrors": [_rule("docker.io", "m.example/a"), _rule("docker.io", "m.example/b")]},
        [("mirrors[1].source", '"docker.io" is already the source of mirrors[0]')],
        id="duplicate-source",
    ),
    pytest.param(
        {"mirrors": [_rule("*.gcr.io", "m.example/a"), _rule("*.gcr.io", "m.example/b")]},
        [("mirrors[1].source", '"*.gcr.io" is already the source of mirrors[0]')],
        id="duplicate-wildcard",
    ),
    pytest.param(
        {"mirrors": [_rule("quay.io", "m.example/a"), _rule("ghcr.io", "m.example/a/")]},
        [
            (
                "mirrors[1].mirror",
                '"m.example/a" is already the mirror of mirrors[0]; '
                "give each source its own mirror path",
            )
        ],
        id="duplicate-mirror",
    ),
    pytest.param(
        {"credentials": []},
        [("credentials", "must be a mapping, got a list")],
        id="credentials-list",
    ),
    pytest.param(
        {"credentials": {"Bad_Name": {"namespaces": ["*"]}}},
        [("credentials.Bad_Name", f'"Bad_Name" {CRED_MSG}')],
        id="credential-key-invalid",
    ),
    pytest.param(
        {"credentials": {"a": {}}},
        [("credentials.a.namespaces", NAMESPACES_REQUIRED)],
        id="grant-without-namespaces",
    ),
    pytest.param(
        {"credentials": {"a": ["*"]}},
        [
            ("credentials.a", "must be a mapping, got a list"),
            ("credentials.a.namespaces", NAMESPACES_REQUIRED),
        ],
        id="grant-list",
    ),
    pytest.param(
        {"credentials": {"a": {"namespaces": "*"}}},
        [("credentials.a.namespaces", "must be a list, got a string")],
        id="grant-namespaces-string",
    ),
    pytest.param(
        {"credentials": {"a": {"namespaces": ["*"], "secret": "x"}}},
        [
            (
                "credentials.a.secret",
                "unknown field (expected one of: namespaces, namespaceSelector, registry, "
                "provider, delivery)",
            )
        ],
        id="grant-unknown-field",
    ),
    pytest.param(
        {"credentials": {"a": {"namespaces": ["*"], "delivery": "Kubelet"}}},
        [("credentials.a.delivery", '"Kubelet" is not one of: pullSecret, kubelet')],
        id="grant-delivery-unknown",
    ),
    pytest.param(
        {"credentials": {"a": {"namespaces": ["*"], "delivery": ["kubelet"]}}},
        [("credentials.a.delivery", '["kubelet"] is not one of: pullSecret, kubelet')],
        id="grant-delivery-list",
    ),
    pytest.param(
        {"credentials": {"a": {"namespaces": ["Team", "", 3]}}},
        [
            ("credentials.a.namespaces[1]", 'must be a non-empty string, got ""'),
            ("credentials.a.namespaces[2]", "must be a non-empty string, got 3"),
            ("credentials.a.namespaces[0]", '"Team" is not a namespace name or glob'),
        ],
        id="grant-namespace-items",
    ),
    pytest.param(
        {"exclude": ["nginx"]}, [("exclude", "must be a mapping, got a list")], id="exclude-list"
    ),
    pytest.param(
        {"exclude": {"image": []}},
        [("exclude.image", "unknown field (expected one of: images, namespaces)")],
        id="exclude-unknown-field",
    ),
    pytest.param(
        {"exclude": {"images": "nginx"}},
        [("exclude.images", "must be a list, got a string")],
        id="exclude-images-string",
    ),
    pytest.param(
        {"exclude": {"images": ["ngi nx", True]}},
        [
            ("exclude.images[1]", "must be a non-empty string, got true"),
            ("exclude.images[0]", '"ngi nx" contains white space'),
        ],
        id="exclude-image-items",
    ),
    pytest.param(
        {"exclude": {"namespaces": ["kube_system"]}},
        [("exclude.namespaces[0]", '"kube_system" is not a namespace name or glob')],
        id="exclude-namespace-invalid",
    ),
    pytest.param(
        {"exclude": {"namespaces": {"kube-system": True}}},
        [("exclude.namespaces", "must be a list, got a mapping")],
        id="exclude-namespaces-mapping",
    ),
]


@pytest.mark.parametrize(("document", "expected"), INVALID)
def test_load_invalid(document: object, expected: list[tuple[str, str]]) -> None:
    """An invalid document raises PolicyError naming each bad field and value."""
    assert _errors(document) == expected


def test_every_error_is_reported() -> None:
    """One load reports every problem in document order, not just the first."""
    document = {
        "mode": "dry-run",
        "colour": "blue",
        "mirrors": [
            _rule("docker.io", "harbor.corp.example/dockerhub-proxy", credential="harbor-pull"),
            _rule("quay.io/prometheus", "mirror.corp.example/prometheus"),
            _rule("Docker.io", "mirror.corp.example/gcr"),
            _rule("ghcr.io", "mirror.corp.example/prometheus", credential="ghcr"),
        ],
        "exclude": {"images": [""], "namespaces": ["Kube"]},
        "credentials": GRANT,
    }
    assert _errors(document) == [
        ("mode", loader._REMOVED_KEYS["mode"]),
        ("colour", f"unknown field (expected one of: {TOP_FIELDS})"),
        ("mirrors[2].source", f'"Docker.io" {UPPER}'),
        (
            "mirrors[3].credential",
            '"ghcr" is not granted to any namespace: add credentials.ghcr.namespaces',
        ),
        (
            "mirrors[3].mirror",
            '"mirror.corp.example/prometheus" is already the mirror of '
            "mirrors[1]; give each source its own mirror path",
        ),
        ("exclude.images[0]", 'must be a non-empty string, got ""'),
        ("exclude.namespaces[0]", '"Kube" is not a namespace name or glob'),
    ]


def test_policy_error_message_lists_every_error() -> None:
    """str(PolicyError) has one 'path: message' line per error."""
    with pytest.raises(policy.PolicyError) as caught:
        policy.load({"mirrors": [_rule("Docker.io")], "mode": "x"})
    assert str(caught.value).splitlines() == [
        f"mode: {loader._REMOVED_KEYS['mode']}",
        f'mirrors[0].source: "Docker.io" {UPPER}',
    ]
    assert isinstance(caught.value, ValueError)


def test_field_error_without_path() -> None:
    """A document-level error prints its message alone."""
    assert str(policy.FieldError("", "the policy is empty")) == "the policy is empty"


def test_null_rule_is_an_error() -> None:
    """A null entry in mirrors (a stray '-' in YAML) is reported, not silently dropped."""
    document = yaml.safe_load("mirrors:\n  -\n  - source: quay.io\n    mirror: m.example/q\n")
    assert document["mirrors"][0] is None
    assert [path for path, _ in _errors(document)] == ["mirrors[0]"]


def test_nested_mirror_prefixes_are_rejected() -> None:
    """A mirror path under another rule's mirror path collides, like a duplicate mirror."""
    document = {
        "mirrors": [_rule("docker.io", "m.example/hub"), _rule("quay.io", "m.example/hub/library")]
    }
    # Otherwise docker.io/library/nginx and quay.io/nginx both become
    # m.example/hub/library/nginx.
    assert [path for path, _ in _errors(document)] == ["mirrors[1].mirror"]


def test_wildcard_with_port_is_rejected() -> None:
    """A wildcard source with a port is refused at load rather than never matching."""
    assert _errors({"mirrors": [_rule("*.corp.example:5000")]}) == [
        (
            "mirrors[0].source",
            '"*.corp.example:5000" is not a valid wildcard host '
            "(write *.example.com: whole hosts only, no port, no path)",
        )
    ]


def test_empty_grant_is_rejected() -> None:
    """A grant to no namespace at all is refused at load."""
    assert (
        "credentials.a.namespaces",
        "is empty: the credential would reach no namespace",
    ) in _errors({"credentials": {"a": {"namespaces": []}}})


@pytest.mark.parametrize(
    ("grants", "namespace", "expected"),
    [
        pytest.param({"a": ["*"]}, "anything", ("a",), id="star"),
        pytest.param({"a": ["team-*"], "b": ["prod"]}, "team-x", ("a",), id="glob"),
        pytest.param({"a": ["team-*"], "b": ["prod"]}, "prod", ("b",), id="exact"),
        pytest.param({"b": ["*"], "a": ["*"]}, "x", ("a", "b"), id="sorted"),
        pytest.param({"a": ["team-?"]}, "team-ab", (), id="question-mark-one-char"),
    ],
)
def test_grants_are_namespace_globs(
    grants: dict[str, list[str]], namespace: str, expected: tuple[str, ...]
) -> None:
    """Grants are namespace globs, matched whole."""
    loaded = policy.load({"credentials": {k: {"namespaces": v} for k, v in grants.items()}})
    assert tuple(sorted(c for c in grants if loaded.is_granted(c, namespace))) == expected


@pytest.mark.parametrize(
    ("globs", "namespace", "excluded"),
    [
        pytest.param([], "kube-system", True, id="kube-system-always"),
        pytest.param(["team-*"], "kube-system", True, id="kube-system-with-other-globs"),
        pytest.param([], "kube-public", False, id="kube-public-not-by-default"),
        pytest.param(["team-*"], "team-a", True, id="glob"),
        pytest.param(["team-*"], "teams", False, id="glob-whole-name"),
        pytest.param(["prod"], "prod-eu", False, id="exact-not-prefix"),
    ],
)
def test_namespace_exclusion(globs: list[str], namespace: str, excluded: bool) -> None:
    """Namespace exclusions are whole-name globs, and kube-system is always excluded."""
    loaded = policy.load({"exclude": {"namespaces": globs}})
    assert loaded.is_namespace_excluded(namespace) is excluded
