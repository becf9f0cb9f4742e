"""How a rule's mirror is reached: `http://` mirrors, `https://` spelled out, caFile and
insecureSkipVerify, and the warnings a valid but unsafe policy gets."""

from __future__ import annotations

import pytest

from mirrorgate import policy

GRANT = {"cache": {"namespaces": ["team-a"]}}


def _load(*rules: dict[str, object], credentials: object = None) -> policy.Policy:
    return policy.load({"mirrors": list(rules), "credentials": credentials})


def _errors(*rules: dict[str, object]) -> list[tuple[str, str]]:
    with pytest.raises(policy.PolicyError) as caught:
        _load(*rules)
    return [(e.path, e.message) for e in caught.value.errors]


def test_http_mirror_is_plain_http_and_the_image_carries_no_scheme() -> None:
    loaded = _load({"source": "docker.io", "mirror": "http://kind-registry:5000/hub"})
    rule = loaded.rules[0]
    assert (rule.scheme, str(rule.mirror), rule.mirror_url) == (
        "http",
        "kind-registry:5000/hub",
        "http://kind-registry:5000/hub",
    )
    assert loaded.resolve("nginx:1.27").new_image == "kind-registry:5000/hub/library/nginx:1.27"
    assert loaded.warnings == ()


@pytest.mark.parametrize("written", ["https://m.example/hub", "m.example/hub"])
def test_https_spelled_out_is_the_default(written: str) -> None:
    rule = _load({"source": "docker.io", "mirror": written}).rules[0]
    assert (rule.scheme, str(rule.mirror)) == ("https", "m.example/hub")


@pytest.mark.parametrize(
    "written", ["ftp://m.example/hub", "HTTPS://m.example/hub", "oci://m.example"]
)
def test_other_schemes_are_refused_naming_the_accepted_ones(written: str) -> None:
    scheme = written.partition("://")[0]
    assert _errors({"source": "docker.io", "mirror": written}) == [
        (
            "mirrors[0].mirror",
            f'"{written}": "{scheme}://" is not a mirror scheme (write http:// for a plain-HTTP '
            "mirror, https:// or no scheme for HTTPS)",
        )
    ]


@pytest.mark.parametrize("where", ["source", "registry"])
def test_a_scheme_anywhere_but_a_rules_mirror_is_refused_saying_where_it_belongs(
    where: str,
) -> None:
    document: dict[str, object] = {
        "mirrors": [
            {
                "source": "https://quay.io" if where == "source" else "quay.io",
                "mirror": "m.example/q",
            }
        ],
        "credentials": {
            "c": {"namespaces": ["*"], "registry": "https://m.example"}
            if where == "registry"
            else {"namespaces": ["*"]}
        },
    }
    with pytest.raises(policy.PolicyError) as caught:
        policy.load(document)
    [error] = caught.value.errors
    assert error.path.endswith(where)
    assert "(only mirrors[].mirror takes one: http:// for a plain-HTTP mirror)" in error.message


def test_https_and_bare_mirrors_collide_as_the_same_mirror() -> None:
    assert _errors(
        {"source": "docker.io", "mirror": "https://m.example/hub"},
        {"source": "quay.io", "mirror": "m.example/hub"},
    ) == [
        (
            "mirrors[1].mirror",
            '"m.example/hub" is already the mirror of mirrors[0]; give each '
            "source its own mirror path",
        )
    ]


def test_rules_on_one_host_must_agree_on_the_scheme() -> None:
    assert _errors(
        {"source": "docker.io", "mirror": "http://m.example:5000/hub"},
        {"source": "quay.io", "mirror": "m.example:5000/quay"},
    ) == [
        (
            "mirrors[1].mirror",
            '"https://" differs from mirrors[0].mirror ("http://") on the '
            'same mirror host "m.example:5000"',
        )
    ]


@pytest.mark.parametrize(("key", "value"), [("caFile", "/ca.pem"), ("insecureSkipVerify", True)])
def test_tls_settings_on_a_plain_http_mirror_are_refused(key: str, value: object) -> None:
    assert _errors({"source": "docker.io", "mirror": "http://m.example/hub", key: value}) == [
        (f"mirrors[0].{key}", "has no use on a plain-HTTP (http://) mirror")
    ]


def test_skip_verify_must_be_a_boolean_and_not_contradict_a_ca() -> None:
    assert _errors(
        {"source": "docker.io", "mirror": "m.example/hub", "insecureSkipVerify": "yes"}
    ) == [("mirrors[0].insecureSkipVerify", 'must be true or false, got "yes"')]
    assert _errors(
        {
            "source": "docker.io",
            "mirror": "m.example/hub",
            "caFile": "/ca.pem",
            "insecureSkipVerify": True,
        }
    ) == [
        (
            "mirrors[0].insecureSkipVerify",
            "and caFile contradict each other: verify with the CA, or do not verify",
        )
    ]


def test_skip_verify_is_explicit_and_warned_about() -> None:
    verified = _load({"source": "docker.io", "mirror": "m.example/hub"})
    assert not verified.rules[0].skip_verify
    assert verified.warnings == ()
    loaded = _load({"source": "docker.io", "mirror": "m.example/hub", "insecureSkipVerify": True})
    assert loaded.rules[0].skip_verify
    assert [(w.path, w.message) for w in loaded.warnings] == [
        (
            "mirrors[0].insecureSkipVerify",
            'TLS certificates of "m.example" are not verified: anyone on the network path can '
            "serve images (and read credentials) in its name",
        )
    ]


def test_plain_http_with_a_credential_is_warned_about() -> None:
    loaded = _load(
        {"source": "docker.io", "mirror": "http://m.example/hub", "credential": "cache"},
        credentials=GRANT,
    )
    assert [(w.path, w.message) for w in loaded.warnings] == [
        (
            "mirrors[0].mirror",
            '"http://m.example/hub" is plain HTTP but needs credential "cache": the login would '
            "cross the network in clear",
        )
    ]
