"""A bad policy is refused when it is applied, against the real API server.

The session's webhook configuration is manifests/base's, so it holds the
webhook ``policy.mirrorgate.io``: every write of a ConfigMap labelled
``mirrorgate.io/policy=true`` in mirrorgate's namespace is judged by the
running server with the same code as ``mirrorgate policy check``.
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.commands import MIRRORGATE
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.kube import warning_messages
from tests.e2e.harness.suite import Installed, e2e_policy
from tests.webhook import policies

pytestmark = pytest.mark.e2e

POLICY_LABEL = {"mirrorgate.io/policy": "true"}


def config_map(
    name: str, policy: str, *, labels: dict[str, str] | None = None, version: str | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": POLICY_LABEL if labels is None else labels}
    if version is not None:
        metadata["resourceVersion"] = version
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {"policy.yaml": policy},
    }


def policy_check(tmp_path: Path, text: str) -> list[str]:
    """`mirrorgate policy check`'s error lines for ``text``."""
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    done = subprocess.run(
        [*MIRRORGATE, "policy", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stdout
    return [line.strip() for line in done.stdout.splitlines()[1:]]


def test_an_invalid_policy_is_refused_with_policy_checks_errors_and_the_old_one_stays(
    installed: Installed, tmp_path: Path
) -> None:
    """Create a valid policy ConfigMap; replacing it with an invalid policy is refused
    naming every error as `policy check` does (also when the update drops the label), and
    the stored policy and the server's live one are unchanged."""
    name = f"e2e-policy-{secrets.token_hex(3)}"
    valid = e2e_policy(installed.registry)
    with installed.control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        created, _, headers = core.create_namespaced_config_map_with_http_info(
            mg.NAMESPACE,
            config_map(name, valid),  # type: ignore[arg-type]
        )
        assert created.metadata is not None
        version = created.metadata.resource_version
        refused: dict[str, k8s.ApiException] = {}
        for case, labels in (("labelled", None), ("label dropped", {})):
            with pytest.raises(k8s.ApiException) as caught:
                core.replace_namespaced_config_map(
                    name,
                    mg.NAMESPACE,
                    config_map(  # type: ignore[arg-type]
                        name, policies.INVALID_POLICY, labels=labels, version=version
                    ),
                )
            refused[case] = caught.value
        stored = core.read_namespaced_config_map(name, mg.NAMESPACE)
    expected = policy_check(tmp_path, policies.INVALID_POLICY)
    assert len(expected) == len(policies.INVALID_POLICY_PATHS)
    for case, error in refused.items():
        assert error.status == 403, (case, error.body)
        body = str(error.body)
        assert 'admission webhook \\"policy.mirrorgate.io\\" denied the request' in body, body
        assert (
            f"ConfigMap {mg.NAMESPACE}/{name} data.policy.yaml: invalid policy (3 errors)" in body
        ), body
        for line in expected:
            assert line.replace('"', '\\"') in body, (case, line, body)
    assert stored.data == {"policy.yaml": valid}
    assert stored.metadata is not None
    assert stored.metadata.resource_version == version
    # `policy check`'s warning comes back on the accepted write: the suite's policy grants "*".
    assert any(
        '"*" grants this credential to every opted-in namespace' in w
        for w in warning_messages(headers)
    ), headers
    with installed.server.client() as http:
        live = http.get("/readyz").json()["policy"]
    assert live == hashlib.sha256(valid.encode()).hexdigest()[:12]


def test_a_config_map_without_the_label_or_elsewhere_is_not_judged(
    installed: Installed, make_namespace: Any
) -> None:
    """The webhook is matched to the policy object only: other ConfigMaps pass untouched."""
    elsewhere = make_namespace()
    with installed.control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespaced_config_map(
            mg.NAMESPACE,
            config_map(  # type: ignore[arg-type]
                f"e2e-other-{secrets.token_hex(3)}", "not: [a policy", labels={}
            ),
        )
        core.create_namespaced_config_map(
            elsewhere,
            config_map(  # type: ignore[arg-type]
                f"e2e-policy-{secrets.token_hex(3)}", "not: [a policy"
            ),
        )
