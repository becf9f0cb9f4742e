"""examples/custom-policy: the overlay that replaces the policy, built by the pinned kustomize."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from mirrorgate import policy
from tests.e2e.harness.binaries import REPO_ROOT

pytestmark = pytest.mark.e2e

EXAMPLE = REPO_ROOT / "examples" / "custom-policy"


def test_custom_policy_overlay_replaces_the_policy(kustomize: Path) -> None:
    """One mirrorgate-policy ConfigMap, holding the example's policy, under the name mounted."""
    built = subprocess.run(
        [kustomize, "build", EXAMPLE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    objects = list(yaml.safe_load_all(built))
    config_maps = [o for o in objects if o["kind"] == "ConfigMap"]
    assert [c["metadata"]["name"] for c in config_maps] == ["mirrorgate-policy"]
    text = config_maps[0]["data"]["policy.yaml"]
    assert text == (EXAMPLE / "policy.yaml").read_text()
    assert [str(r.mirror) for r in policy.load(yaml.safe_load(text)).rules] == [
        "harbor.example.com/dockerhub",
        "harbor.example.com/ghcr",
    ]
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("configMap", {}).get("name") == "mirrorgate-policy" for v in volumes)
