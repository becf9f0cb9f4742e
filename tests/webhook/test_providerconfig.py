"""The kubelet's CredentialProviderConfig: what loads, what is refused (with its field path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.webhook.credentials import providerconfig
from mirrorgate.webhook.credentials.providerconfig import (
    ProviderConfigError,
    image_matches,
    parse_duration,
)

ECR = {
    "name": "ecr-credential-provider",
    "matchImages": ["*.dkr.ecr.*.amazonaws.com", "*.dkr.ecr.*.amazonaws.com.cn"],
    "defaultCacheDuration": "12h",
    "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
    "args": ["get-credentials"],
    "env": [{"name": "AWS_PROFILE", "value": "pull"}],
}


def _config(*providers: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1",
        "kind": "CredentialProviderConfig",
        "providers": list(providers),
        **top,
    }


def test_the_ecr_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("""
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: ecr-credential-provider
    matchImages: ["*.dkr.ecr.*.amazonaws.com", "*.dkr.ecr.*.amazonaws.com.cn"]
    defaultCacheDuration: "12h"
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials]
    env:
      - {name: AWS_PROFILE, value: pull}
""")
    config = providerconfig.load(path)
    provider = config.providers["ecr-credential-provider"]
    assert provider.default_cache_duration == 12 * 3600
    assert provider.args == ("get-credentials",)
    assert provider.env == (("AWS_PROFILE", "pull"),)
    assert "pull" not in repr(provider)  # env values may be secrets
    assert provider.matches("123456789012.dkr.ecr.eu-west-1.amazonaws.com/app:1")
    assert not provider.matches("harbor.corp.example/app:1")


INVALID = [
    pytest.param(
        _config(),
        "providers: Required value: at least 1 item in plugins is required",
        id="no providers",
    ),
    pytest.param(
        {**_config(ECR), "apiVersion": "v1"},
        "apiVersion: Unsupported value: 'v1'",
        id="config apiVersion",
    ),
    pytest.param(
        {**_config(ECR), "kind": "KubeletConfiguration"},
        "kind: must be CredentialProviderConfig",
        id="kind",
    ),
    pytest.param(
        _config({**ECR, "name": "a/b"}),
        "providers[0].name: Invalid value: 'a/b': provider name cannot contain '/'",
        id="name with slash",
    ),
    pytest.param(
        _config({**ECR, "name": "a b"}),
        "providers[0].name: Invalid value: 'a b': provider name cannot contain spaces",
        id="name with space",
    ),
    pytest.param(
        _config({**ECR, "name": ".."}),
        "providers[0].name: Invalid value: '..': provider name cannot be '..'",
        id="name dotdot",
    ),
    pytest.param(
        _config(ECR, ECR),
        "providers[1].name: Duplicate value: 'ecr-credential-provider'",
        id="duplicate",
    ),
    pytest.param(
        _config({k: v for k, v in ECR.items() if k != "apiVersion"}),
        "providers[0].apiVersion: Required value",
        id="no apiVersion",
    ),
    pytest.param(
        _config({**ECR, "apiVersion": "credentialprovider.kubelet.k8s.io/v2"}),
        "providers[0].apiVersion: Unsupported value",
        id="plugin apiVersion",
    ),
    pytest.param(
        _config({**ECR, "matchImages": []}),
        "providers[0].matchImages: Required value: at least 1 item in matchImages is required",
        id="no matchImages",
    ),
    pytest.param(
        _config({**ECR, "matchImages": ["https://x.example"]}),
        "providers[0].matchImages[0]: Invalid value: 'https://x.example': match image is invalid",
        id="matchImage with scheme",
    ),
    pytest.param(
        _config({k: v for k, v in ECR.items() if k != "defaultCacheDuration"}),
        "providers[0].defaultCacheDuration: Required value",
        id="no cache duration",
    ),
    pytest.param(
        _config({**ECR, "defaultCacheDuration": "-1m"}),
        "providers[0].defaultCacheDuration: Invalid value: must be greater than or equal to 0",
        id="negative duration",
    ),
    pytest.param(
        _config({**ECR, "defaultCacheDuration": "12 hours"}),
        "providers[0].defaultCacheDuration: Invalid value: '12 hours'",
        id="bad duration",
    ),
    pytest.param(
        _config({**ECR, "defaultCacheDuration": "100000000h"}),
        "providers[0].defaultCacheDuration: Invalid value: '100000000h': not a duration "
        "such as 12h or 90s (at most 2562047h)",
        id="duration past Go's range",
    ),
    pytest.param(
        _config({**ECR, "tokenAttributes": {"serviceAccountTokenAudience": "x"}}),
        "providers[0].tokenAttributes: not supported by mirrorgate",
        id="token attrs",
    ),
    pytest.param(
        _config({**ECR, "matchImage": ["x"]}),
        "providers[0].matchImage: unknown field",
        id="unknown field",
    ),
    pytest.param(
        _config({**ECR, "env": [{"name": "A"}, {"value": "x"}]}),
        "providers[0].env[1]: must be {name: NAME, value: STRING}",
        id="env",
    ),
]


@pytest.mark.parametrize(("document", "expected"), INVALID)
def test_invalid_configs_name_the_field(document: dict[str, Any], expected: str) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        providerconfig.parse(document, source="config.yaml")
    assert str(caught.value).startswith("config.yaml: ")
    assert expected in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ProviderConfigError) as caught:
        providerconfig.parse(_config({"name": "a/b"}), source="c")
    message = str(caught.value)
    for field in (
        "providers[0].name",
        "providers[0].apiVersion",
        "providers[0].matchImages",
        "providers[0].defaultCacheDuration",
    ):
        assert field in message


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ProviderConfigError, match="cannot read"):
        providerconfig.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("providers: [\n")
    with pytest.raises(ProviderConfigError) as raised:
        providerconfig.load(bad)
    assert str(raised.value) == f"{bad}:2:1: not valid YAML: did not find expected node content"
    two = tmp_path / "two.yaml"
    two.write_text("kind: CredentialProviderConfig\n---\nkind: CredentialProviderConfig\n")
    with pytest.raises(ProviderConfigError) as raised:
        providerconfig.load(two)
    assert str(raised.value) == f"{two}: 2 YAML documents; a CredentialProviderConfig is one"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0s", 0.0),
        ("12h", 43200.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("-1m", -60.0),
        ("+2m", 120.0),
        ("1h0m0s", 3600.0),
        ("", None),
        ("12", None),
        ("h", None),
        ("12 h", None),
        ("1d", None),
        (12, None),
        # Out of Go's range (int64 nanoseconds), as time.ParseDuration refuses it.
        ("2562047h", 2562047 * 3600.0),
        ("2562048h", None),
        ("100000000h", None),
        ("-100000000h", None),
        ("9" * 400 + "h", None),
    ],
)
def test_go_durations(text: object, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@given(h=st.integers(0, 1000), m=st.integers(0, 59), s=st.integers(0, 59))
def test_a_duration_is_the_sum_of_its_parts(h: int, m: int, s: int) -> None:
    assert parse_duration(f"{h}h{m}m{s}s") == h * 3600 + m * 60 + s


@pytest.mark.parametrize(
    ("pattern", "image", "matches"),
    [
        # The kubelet's own cases (credentialprovider/keyring_test.go, URLsMatch).
        ("*.kubernetes.io", "prefix.kubernetes.io", True),
        ("*.kubernetes.io", "kubernetes.io", False),
        ("*.*.kubernetes.io", "prefix.prefix.kubernetes.io", True),
        ("prefix.*.io", "prefix.kubernetes.io", True),
        ("*-good.kubernetes.io", "prefix-good.kubernetes.io", True),
        ("*-good.kubernetes.io", "prefix-bad.kubernetes.io", False),
        ("kubernetes.io:1111", "kubernetes.io:1111", True),
        ("kubernetes.io:1111", "kubernetes.io:2222", False),
        ("kubernetes.io", "kubernetes.io:1111", False),
        ("kubernetes.io/foo", "kubernetes.io/foo/bar", True),
        ("kubernetes.io/foo", "kubernetes.io/bar", False),
        ("*.dkr.ecr.*.amazonaws.com", "123.dkr.ecr.eu-west-1.amazonaws.com/app:1", True),
        ("*.dkr.ecr.*.amazonaws.com", "123.dkr.ecr.eu-west-1.amazonaws.com.cn/app:1", False),
    ],
)
def test_match_images_as_the_kubelet_matches_them(pattern: str, image: str, matches: bool) -> None:
    assert image_matches(pattern, image) is matches


def test_the_policy_is_checked_against_the_configuration() -> None:
    """Every provider named must be configured; every mirror using it must match it."""
    config = providerconfig.parse(_config(ECR), source="providers.yaml")
    mirror_policy = policy.load(
        {
            "mirrors": [
                {
                    "source": "docker.io",
                    "mirror": "123.dkr.ecr.eu-west-1.amazonaws.com/hub",
                    "credential": "ecr",
                },
                {"source": "quay.io", "mirror": "harbor.corp.example/quay", "credential": "ecr"},
                {"source": "ghcr.io", "mirror": "harbor.corp.example/ghcr", "credential": "gcp"},
            ],
            "credentials": {
                "ecr": {"namespaces": ["*"], "provider": "ecr-credential-provider"},
                "gcp": {"namespaces": ["*"], "provider": "gcp-credential-provider"},
            },
        }
    )
    assert providerconfig.policy_problems(config, mirror_policy, source="providers.yaml") == [
        "mirrors[1].mirror: 'harbor.corp.example/quay' (credential 'ecr') does not match "
        "provider 'ecr-credential-provider''s matchImages (*.dkr.ecr.*.amazonaws.com, "
        "*.dkr.ecr.*.amazonaws.com.cn)",
        "credentials.gcp.provider: 'gcp-credential-provider' is not in providers.yaml",
    ]
    fine = policy.load(
        {
            "mirrors": [
                {
                    "source": "docker.io",
                    "mirror": "123.dkr.ecr.eu-west-1.amazonaws.com/hub",
                    "credential": "ecr",
                }
            ],
            "credentials": {"ecr": {"namespaces": ["*"], "provider": "ecr-credential-provider"}},
        }
    )
    assert providerconfig.policy_problems(config, fine, source="providers.yaml") == []
