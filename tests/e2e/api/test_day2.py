"""docs/operations.md's day-2 command sequences, run as written with the real kubectl
(and jq) against the session's API server and mirrorgate.

Each sequence is read from the doc (its `<!-- procedure:NAME -->` block), its
example names swapped for the suite's: what a reader copies is what ran here.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time

import pytest
import yaml

from mirrorgate import policy
from tests.e2e.api.test_pull_secrets import expect_copies
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS, read_secret
from tests.e2e.harness.kube import create_pod
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import (
    CREDENTIAL,
    Installed,
    MakeNamespace,
    central_credential,
    pod,
)

pytestmark = pytest.mark.e2e

OPERATIONS = (REPO_ROOT / "docs" / "operations.md").read_text()
COPY = policy.pull_secret_name(CREDENTIAL)


def procedure(name: str) -> str:
    """The shell block under ``<!-- procedure:NAME ... -->``, dedented."""
    found = re.search(rf"<!-- procedure:{name}\b[^>]*-->\n *```sh\n(.*?)```", OPERATIONS, re.S)
    assert found is not None, f"docs/operations.md has no procedure {name}"
    lines = found[1].splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


def run_shell(script: str, installed: Installed, **env: str) -> subprocess.CompletedProcess[str]:
    for tool in ("kubectl", "jq"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (apt-get install {tool})")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            **os.environ,
            "KUBECONFIG": str(installed.control_plane.kubeconfig),
            **env,
        },
    )


def test_rotating_a_robot_password_as_documented(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """The doc's one command replaces the central Secret, label kept; every copy holds
    the new login soon after (the time is printed for the doc), and the central
    credential is put back after."""
    registry = installed.registry
    script = (
        procedure("rotate")
        .replace("harbor-pull", CREDENTIAL)
        .replace("harbor.corp.example", registry.host)
        .replace("robot$pull", registry.username)
        .replace("-n mirrorgate", f"-n {mg.NAMESPACE}")
    )
    new_password = f"rotated-{secrets.token_hex(8)}"
    with installed.control_plane.api_client() as api:
        namespaces = [make_namespace(ENFORCE_LABELS) for _ in range(3)]
        for namespace in namespaces:
            create_pod(api, namespace, pod(installed))
        assert expect_copies(api, namespaces, COPY, registry.password)() is None
        try:
            done = run_shell(script, installed, NEW_PASSWORD=new_password)
            since = time.monotonic()
            assert done.returncode == 0, done.stderr
            assert new_password not in done.stdout + done.stderr
            wait_until(
                expect_copies(api, namespaces, COPY, new_password),
                timeout=30,
                what="every copy rotated",
                interval=0.02,
            )
            seconds = time.monotonic() - since
            central = read_secret(api, mg.NAMESPACE, CREDENTIAL)
        finally:
            central_credential(api, registry)
            wait_until(
                expect_copies(api, namespaces, COPY, registry.password),
                timeout=30,
                what="every copy rotated back",
            )
    print(f"\nFIGURE rotation_via_kubectl_seconds={seconds:.3f}")
    assert central is not None
    assert central["metadata"]["labels"]["mirrorgate.io/credential"] == "true"
    assert seconds < 30


def test_finding_the_pods_that_use_generated_secrets_as_documented(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """The doc's kubectl | jq sequence prints exactly the Pods that name a generated
    pull secret: not one whose image needed none, nor one with a pull secret of its own."""
    with installed.control_plane.api_client() as api:
        served, other = make_namespace(ENFORCE_LABELS), make_namespace()
        created, _ = create_pod(api, served, pod(installed, name="uses-copy"))
        assert COPY in {s["name"] for s in created["spec"]["imagePullSecrets"]}
        create_pod(
            api,
            other,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "own-secret"},
                "spec": {
                    "imagePullSecrets": [{"name": "registry-login"}],
                    "containers": [{"name": "app", "image": "nginx:1.27"}],
                },
            },
        )
    done = run_shell(procedure("pods-using-generated-secrets"), installed)
    assert done.returncode == 0, done.stderr
    listed = done.stdout.splitlines()
    assert f"{served}/uses-copy" in listed
    assert f"{other}/own-secret" not in listed
    assert all(re.fullmatch(r"[a-z0-9-]+/[a-z0-9.-]+", line) for line in listed), listed


def test_the_argo_cd_ignore_path_names_the_field_mirrorgate_writes(installed: Installed) -> None:
    """The doc's ignoreDifferences path, read by jq from the live webhook configuration
    that mirrorgate keeps: it selects the caBundle of every webhook, which is set. (The
    session registers the Pod webhooks only; tests/test_doc_wording.py holds the entries
    to every webhook configuration the manifests make.)"""
    section = OPERATIONS.split("### GitOps: Argo CD and the caBundle", 1)[1]
    (block,) = re.findall(r"```yaml\n(.*?)```", section.split("\n### ", 1)[0], re.S)
    entries = yaml.safe_load(block)["spec"]["ignoreDifferences"]
    (ignored,) = [e for e in entries if e["kind"] == "MutatingWebhookConfiguration"]
    assert ignored["name"] == "mirrorgate"
    (path,) = ignored["jqPathExpressions"]
    name = installed.configuration["metadata"]["name"]
    done = run_shell(
        f"kubectl get mutatingwebhookconfiguration {name} -o json | jq -c '[{path}]'",
        installed,
    )
    assert done.returncode == 0, done.stderr
    bundles = json.loads(done.stdout)
    webhooks = installed.configuration["webhooks"]
    assert len(bundles) == len(webhooks) >= 1
    assert all(isinstance(b, str) and b for b in bundles), bundles
