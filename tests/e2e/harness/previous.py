"""The previous release, 0.1.0, as the git history holds it: its chart and its image, made
from a `git archive` of its commit (never a copy kept in the tree), installed on the node
as a user of 0.1.0 had it, for the upgrade test (tests/e2e/node/test_upgrade.py).

Which commit is 0.1.0: nothing is tagged yet. 0.1.0 is the version the CHANGELOG's first
section and every `Chart.yaml` of the history carry; the code of 0.1.0 itself (the
commit `credentials migrate` reads v1 stores of, 869d12a) had no chart yet. The first
chart on main, 0.1.0 (version and appVersion), came with the image in 793f48d (Merge
image): that is what a Helm user of 0.1.0 installed, and what this module installs.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.e2e.harness import incluster, nodepods
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.node import GATEWAY, Node
from tests.e2e.harness.suite import node_policy

VERSION = "0.1.0"
COMMIT = "793f48dec90b0b02e18a122a43d2cfb659c39893"
TAG = "upgrade-from-0.1.0"
"""The tag of 0.1.0's image on the node's upstream (and in podman's local store)."""
BUILD_TIMEOUT = 3600.0


def checkout(workdir: Path) -> Path:
    """0.1.0's tree, from `git archive` of its commit, in ``workdir``; checks that its
    chart is the 0.1.0 one."""
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", COMMIT],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    tree = workdir / VERSION
    tree.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    chart = yaml.safe_load((tree / "manifests/helm/mirrorgate/Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION), chart
    return tree


def push_image(tree: Path, node: Node) -> str:
    """0.1.0's image, built by its own image/build.sh, pushed to the node's upstream;
    returns its repository there."""
    # Its Debian base is keyed by its own debian-base.sh, not this tree's: the first
    # run builds it with mmdebstrap (minutes; tens of them on a busy machine).
    incluster.push_image(node.registry, TAG, version=VERSION, root=tree, timeout=BUILD_TIMEOUT)
    return f"{node.registry.upstream_host}/{incluster.REPOSITORY}"


def values(repository: str, node: Node) -> dict[str, Any]:
    """What a user of 0.1.0 set: enforce, the image, its pull secret, and the node's
    policy (the suite's mirror and credential, granted to `granted-*`)."""
    return {
        "mode": "enforce",
        "image": {"repository": repository, "tag": TAG},
        "imagePullSecrets": [nodepods.UPSTREAM_SECRET],
        "policy": yaml.safe_load(node_policy(node.registry)),
    }


def route_to_api(api: k8s.ApiClient, relay_port: int) -> None:
    """The test-only route to the API server (incluster.py's module docstring), for a
    chart that has no `extraEnv` yet: the address and the relay's port patched in."""
    container = {
        "name": "mirrorgate",
        "env": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": incluster.API_NAME},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(relay_port)},
        ],
    }
    k8s.AppsV1Api(api).patch_namespaced_deployment(
        "mirrorgate",
        mg.NAMESPACE,
        {
            "spec": {
                "template": {
                    "spec": {
                        "hostAliases": [{"ip": GATEWAY, "hostnames": [incluster.API_NAME]}],
                        "containers": [container],
                    }
                }
            }
        },
    )
