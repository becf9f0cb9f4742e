"""`mirrorgate export` of mirrors reached other than by verified HTTPS: plain HTTP,
a private CA, verification skipped on request. Parsed back, and routed like admission."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from mirrorgate import policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import export, export_crio

CA = "/etc/containerd/certs.d/cache.dev.example:5443/ca.crt"
# A dev cluster's two caches: a plain-HTTP one, and an HTTPS one with a private CA
# and a login (tests/e2e/node/test_devclusters.py runs the same shape on a node).
DEV_POLICY = f"""
mirrors:
  - source: docker.io
    mirror: http://kind-registry:5000/hub
  - source: quay.io
    mirror: https://cache.dev.example:5443/quay
    caFile: {CA}
    credential: dev-cache
credentials:
  dev-cache: {{namespaces: ["*"]}}
"""


def kind_policy() -> policy.Policy:
    return policyfile.parse_policy(DEV_POLICY.encode(), source="dev-policy")


def parsed(result: export.Export) -> dict[str, dict[str, Any]]:
    return {relative.split("/")[0]: tomllib.loads(text) for relative, text in result.files.items()}


def test_containerd_files_for_the_sources_and_the_mirror_hosts_themselves() -> None:
    result = export.containerd(kind_policy())
    assert result.warnings == []
    assert parsed(result) == {
        "docker.io": {
            "server": "https://registry-1.docker.io",
            "host": {
                "http://kind-registry:5000/v2/hub": {
                    "capabilities": ["pull", "resolve"],
                    "override_path": True,
                }
            },
        },
        "quay.io": {
            "server": "https://quay.io",
            "host": {
                "https://cache.dev.example:5443/v2/quay": {
                    "capabilities": ["pull", "resolve"],
                    "override_path": True,
                    "ca": CA,
                }
            },
        },
        # Rewritten images name the mirror hosts: their own files say how to reach them.
        "kind-registry:5000": {
            "server": "http://kind-registry:5000",
            "host": {"http://kind-registry:5000": {"capabilities": ["pull", "resolve"]}},
        },
        "cache.dev.example:5443": {
            "server": "https://cache.dev.example:5443",
            "host": {
                "https://cache.dev.example:5443": {"capabilities": ["pull", "resolve"], "ca": CA}
            },
        },
    }


def manifest_url(files: dict[str, dict[str, Any]], image: str) -> str:
    """The first URL containerd asks for ``image``'s manifest, per its hosts.toml."""
    ref = policy.parse_normalized(image)
    host_url, settings = next(iter(files[ref.domain]["host"].items()))
    api_root = host_url if settings.get("override_path") else f"{host_url}/v2"
    return f"{api_root}/{ref.path}/manifests/{ref.tag}"


@pytest.mark.parametrize(
    ("image", "url"),
    [
        ("nginx:1.27", "http://kind-registry:5000/v2/hub/library/nginx/manifests/1.27"),
        ("quay.io/org/app:v1", "https://cache.dev.example:5443/v2/quay/org/app/manifests/v1"),
    ],
)
def test_the_source_and_the_rewritten_image_reach_the_mirror_the_same_way(
    image: str, url: str
) -> None:
    """Pulled as written (through the source's file) or as admission rewrote it (through
    the mirror host's file): the same URL, with the same scheme and CA."""
    files = parsed(export.containerd(kind_policy()))
    rewritten = kind_policy().resolve(image).new_image
    assert rewritten is not None
    assert "://" not in rewritten
    assert manifest_url(files, image) == url
    assert manifest_url(files, rewritten) == url


def test_skip_verify_is_exported_only_when_the_policy_says_so() -> None:
    mirror_policy = policy.load(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": "m.example/hub", "insecureSkipVerify": True},
                {"source": "ghcr.io", "mirror": "v.example/ghcr"},
            ]
        }
    )
    files = parsed(export.containerd(mirror_policy))
    assert files["docker.io"]["host"]["https://m.example/v2/hub"]["skip_verify"] is True
    assert files["m.example"]["host"]["https://m.example"]["skip_verify"] is True
    assert "skip_verify" not in files["ghcr.io"]["host"]["https://v.example/v2/ghcr"]
    assert "v.example" not in files  # verified HTTPS needs no file of its own


def test_a_mirror_host_that_is_also_a_source_keeps_the_sources_file() -> None:
    mirror_policy = policy.load(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": "http://cache.example:5000/hub"},
                {"source": "cache.example:5000", "mirror": "m.example/cache"},
            ]
        }
    )
    result = export.containerd(mirror_policy)
    assert sorted(result.files) == ["cache.example:5000/hosts.toml", "docker.io/hosts.toml"]
    assert tomllib.loads(result.files["cache.example:5000/hosts.toml"])["host"] == {
        "https://m.example/v2/cache": {"capabilities": ["pull", "resolve"], "override_path": True}
    }
    [warning] = result.warnings
    assert warning.startswith(
        "mirrors[0] (docker.io → cache.example:5000/hub): the mirror "
        "host cache.example:5000 is also a source registry"
    )


def test_cri_o_marks_plain_http_and_unverified_mirrors_insecure() -> None:
    mirror_policy = policy.load(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": "http://kind-registry:5000/hub"},
                {"source": "quay.io", "mirror": "m.example/quay", "insecureSkipVerify": True},
                {"source": "ghcr.io", "mirror": "v.example/ghcr", "caFile": "/ca.pem"},
            ]
        }
    )
    result = export_crio.cri_o(mirror_policy)
    registries = tomllib.loads(result.files["registries.conf"])["registry"]
    assert [
        (
            r.get("prefix"),
            r["location"],
            r.get("insecure", False),
            [(m["location"], m.get("insecure", False)) for m in r.get("mirror", [])],
        )
        for r in registries
    ] == [
        ("docker.io", "docker.io", False, [("kind-registry:5000/hub", True)]),
        ("quay.io", "quay.io", False, [("m.example/quay", True)]),
        ("ghcr.io", "ghcr.io", False, [("v.example/ghcr", False)]),
        # The mirror hosts themselves, for the images admission rewrote to them.
        (None, "kind-registry:5000", True, []),
        (None, "m.example", True, []),
    ]
    assert (
        "the mirror v.example is verified with /ca.pem: CRI-O reads it from "
        "/etc/containers/certs.d/v.example/ca.crt (copy it there)"
    ) in result.notes
