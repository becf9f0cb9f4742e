"""The provider refresher on the real API: one broken provider credential spoils no other.

The refresher of a leading replica, run pass by pass against a real
kube-apiserver, with the real Go test plugin behind two providers: one whose
answers have a ``cacheDuration`` past Go's range, listed first, and a healthy
one after it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from kubernetes import client as k8s

from mirrorgate import policy
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.credentials import providerconfig
from mirrorgate.webhook.credentials.kubestore import KubernetesCredentialStore
from mirrorgate.webhook.credentials.pluginrunner import LocalRunner
from mirrorgate.webhook.credentials.provider import ProviderSource
from mirrorgate.webhook.credentials.refresher import PROVIDER_LABEL, ProviderRefresher
from tests.e2e.harness import providers
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.providers import RobotIssuer
from tests.e2e.harness.suite import MakeNamespace

pytestmark = pytest.mark.e2e
issuer = providers.issuer  # the fixture


def test_a_huge_cache_duration_fails_its_credential_only(
    control_plane: ControlPlane,
    make_namespace: MakeNamespace,
    issuer: RobotIssuer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It was an OverflowError that ended the pass: the credential after it never came."""
    namespace = make_namespace()
    config = issuer.write_config(
        tmp_path / "providers.json",
        issuer.provider("broken", "robot-a", args=["--cache-duration", "100000000h"]),
        issuer.provider("healthy", "robot-a", args=["--cache-duration", "1h"]),
    )
    rules = policy.load(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": "a.example/broken", "credential": "broken"},
                {"source": "quay.io", "mirror": "a.example/healthy", "credential": "healthy"},
            ],
            "credentials": {
                "broken": {"namespaces": ["*"], "provider": "broken"},
                "healthy": {"namespaces": ["*"], "provider": "healthy"},
            },
        }
    )
    assert list(rules.grants) == ["broken", "healthy"]
    client = kube.Kube.connect(kubeconfig=str(control_plane.kubeconfig))
    store = KubernetesCredentialStore(client, namespace)
    store.start()
    outcomes: list[tuple[str, str]] = []
    try:
        assert store.informer.synced.wait(30)
        refresher = ProviderRefresher(
            ProviderSource(providerconfig.load(config), LocalRunner(issuer.bin_dir)),
            client,
            store=store,
            mirror_policy=lambda: rules,
            is_leader=lambda: True,
            observe=lambda name, outcome, expires: outcomes.append((name, outcome)),
        )
        with caplog.at_level(logging.WARNING, logger="mirrorgate"):
            wait = refresher.refresh_due()
    finally:
        store.informer.stop()
    assert outcomes == [("broken", "failed"), ("healthy", "refreshed")]
    assert 0 < wait < refresher.retry + 10  # the broken one is tried again soon
    [failed] = [r for r in caplog.records if r.getMessage() == "credential refresh failed"]
    assert getattr(failed, "fields", {})["reason"] == (
        "plugin 'broken': cacheDuration '100000000h' is not a duration from 0 to 2562047h "
        "(such as 12h)"
    )
    with control_plane.api_client() as api:
        secrets = (
            k8s.CoreV1Api(api)
            .list_namespaced_secret(namespace, label_selector=PROVIDER_LABEL)
            .items
        )
    assert {
        s.metadata.name: (s.metadata.labels or {}).get(PROVIDER_LABEL)
        for s in secrets
        if s.metadata
    } == {"healthy": "healthy"}
