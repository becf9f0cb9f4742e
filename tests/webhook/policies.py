"""Policy documents for the webhook tests."""

from __future__ import annotations

from typing import Literal


def policy_yaml(
    *,
    on_credential_error: Literal["skip", "deny"] = "skip",
    prometheus_mirror: str = "mirror.corp.example/prometheus",
) -> str:
    """Docker Hub through an authenticated mirror, quay.io/prometheus through an open one."""
    return f"""\
onCredentialError: {on_credential_error}
mirrors:
  - source: docker.io
    mirror: harbor.corp.example/dockerhub-proxy
    credential: harbor-pull
  - source: quay.io/prometheus
    mirror: {prometheus_mirror}
exclude:
  images: ["registry.k8s.io/pause:*"]
  namespaces: [excluded-ns]
credentials:
  harbor-pull: {{namespaces: ["*"]}}
"""


POLICY = policy_yaml()

# Three independent mistakes, each with the field path the error must name.
INVALID_POLICY = """\
mode: sometimes
mirrors:
  - source: Docker.io
    mirror: harbor.corp.example/dockerhub-proxy
  - source: ghcr.io
    mirror: harbor.corp.example/ghcr
    credential: not-granted
"""
INVALID_POLICY_PATHS = ("mode", "mirrors[0].source", "mirrors[1].credential")
