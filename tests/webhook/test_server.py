"""The real server's reloads and wiring: policy changes on disk go live without a restart."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair
from mirrorgate.webhook import errors
from mirrorgate.webhook.commands.serve import settings, wiring
from tests.webhook import policies, serving
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.reviews import (
    HUB_IMAGE,
    PROM_IMAGE,
    PROM_MIRRORED,
    apply,
    patch_ops,
    pod,
    review,
)
from tests.webhook.scrape import samples, value
from tests.webhook.testclient import TestClient

NEW_MIRROR = "mirror2.corp.example/prom"
NEW_MIRRORED = "mirror2.corp.example/prom/prometheus:v2.53.0"


def version_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@pytest.fixture
def running(tmp_path: Path, serving_pair: KeyPair) -> Iterator[serving.Running]:
    """A server of its own, whose policy file the test replaces."""
    with serving.serve(
        tmp_path,
        pair=serving_pair,
        policy=policies.POLICY,
        secrets=RecordingPullSecrets(stale=False),
    ) as started:
        yield started


@pytest.fixture
def client(running: serving.Running, ca: CertificateAuthority) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=running.url, verify=serving.client_context(ca.cert_pem), timeout=serving.TIMEOUT
    ) as made:
        yield made


def prometheus_image_after(client: httpx.Client) -> str:
    """What /mutate makes of the Prometheus image under the live policy."""
    obj = pod(PROM_IMAGE)
    answer = client.post(
        "/mutate", content=orjson.dumps(review(obj)), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 200
    image = apply(obj, patch_ops(answer.json()["response"]))["spec"]["containers"][0]["image"]
    assert isinstance(image, str)
    return image


def live_version(client: httpx.Client) -> str | None:
    version = client.get("/readyz").json()["policy"]
    assert isinstance(version, str)
    return version


def metric_page(client: httpx.Client) -> dict[Any, float]:
    return samples(client.get("/metrics").text)


def test_policy_change_on_disk_goes_live(running: serving.Running, client: httpx.Client) -> None:
    """A new policy file changes behaviour, /readyz and mirrorgate_policy_info, no restart."""
    old = version_of(policies.POLICY)
    assert live_version(client) == old
    assert prometheus_image_after(client) == PROM_MIRRORED

    fresh = policies.policy_yaml(prometheus_mirror=NEW_MIRROR)
    serving.write_atomically(running.policy_file, fresh.encode())
    new = version_of(fresh)
    serving.wait_for(
        lambda: True if live_version(client) == new else None,
        what="the new policy version on /readyz",
    )
    assert prometheus_image_after(client) == NEW_MIRRORED
    page = metric_page(client)
    assert value(page, "mirrorgate_policy_info", version=new, mode="namespace-label") == 1
    assert (
        "mirrorgate_policy_info",
        frozenset({("version", old), ("mode", "namespace-label")}),
    ) not in page
    assert value(page, "mirrorgate_policy_reload_failures_total") == 0


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(policies.INVALID_POLICY, id="invalid-policy"),
        pytest.param("mirrors: [\n", id="invalid-yaml"),
        pytest.param(f"mode: audit\n{policies.POLICY}", id="removed-mode-field"),
        pytest.param("", id="empty-file"),
        # Issue 19: a RecursionError escaped the reload (not even counted), and a
        # bomb froze admission while quote() rendered it.
        pytest.param("mode: " + "[" * 1000 + "]" * 1000, id="nested-1000-deep"),
        pytest.param(
            "x: &x [a, a, a, a, a, a, a, a, a]\n"
            + "".join(
                f"x{i}: &x{i} [{', '.join(['*x' if i == 1 else f'*x{i - 1}'] * 9)}]\n"
                for i in range(1, 7)
            )
            + "mode: *x6\n",
            id="alias-bomb",
        ),
    ],
)
def test_invalid_policy_keeps_the_old_one_in_force(
    running: serving.Running, client: httpx.Client, broken: str
) -> None:
    """A rejected file is counted; the previous policy keeps serving until a valid one lands."""
    old = version_of(policies.POLICY)
    serving.write_atomically(running.policy_file, broken.encode())
    serving.wait_for(
        lambda: (
            True
            if value(metric_page(client), "mirrorgate_policy_reload_failures_total") == 1
            else None
        ),
        what="the reload failure to be counted",
    )
    assert live_version(client) == old
    assert prometheus_image_after(client) == PROM_MIRRORED
    assert (
        value(metric_page(client), "mirrorgate_policy_info", version=old, mode="namespace-label")
        == 1
    )

    fresh = policies.policy_yaml(prometheus_mirror=NEW_MIRROR)
    serving.write_atomically(running.policy_file, fresh.encode())
    serving.wait_for(
        lambda: True if live_version(client) == version_of(fresh) else None,
        what="recovery with a valid policy",
    )
    assert prometheus_image_after(client) == NEW_MIRRORED
    assert value(metric_page(client), "mirrorgate_policy_reload_failures_total") == 1


def test_default_pull_secrets_are_standalone(
    tmp_path: Path, serving_pair: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cluster, images needing a pull secret stay as written, with a warning."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cert, key = serving.write_pair(tmp_path, serving_pair)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policies.POLICY)
    built = wiring.build(
        settings.Settings(policy=str(policy_file), tls_cert=str(cert), tls_key=str(key))
    )
    assert isinstance(built.runtime.secrets, wiring.StandalonePullSecrets)
    obj = pod(HUB_IMAGE, PROM_IMAGE)
    with TestClient(built.application, base_url="https://testserver") as client:
        answer = client.post("/mutate", json=review(obj)).json()["response"]
    patched = apply(obj, patch_ops(answer))
    assert [c["image"] for c in patched["spec"]["containers"]] == [HUB_IMAGE, PROM_MIRRORED]
    [warning] = answer["warnings"]
    assert "standalone" in warning


def test_audit_only_setting_turns_mutate_into_a_report(
    tmp_path: Path,
    serving_pair: KeyPair,
) -> None:
    """`serve --audit-only` reports on /mutate even under an enforce policy."""
    cert, key = serving.write_pair(tmp_path, serving_pair)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policies.POLICY)
    built = wiring.build(
        settings.Settings(
            policy=str(policy_file), tls_cert=str(cert), tls_key=str(key), audit_only=True
        ),
        secrets=RecordingPullSecrets(),
    )
    with TestClient(built.application, base_url="https://testserver") as client:
        answer = client.post("/mutate", json=review(pod(PROM_IMAGE))).json()["response"]
    assert "patch" not in answer
    assert PROM_MIRRORED in answer["warnings"][0]


@pytest.mark.parametrize(
    ("cert_name", "key_name", "fragment"),
    [
        pytest.param(
            "tls.crt", "other.key", "not a usable certificate and key", id="mismatched-key"
        ),
        pytest.param("missing.crt", "tls.key", "missing.crt: no such file", id="missing-cert"),
        pytest.param("tls.crt", "missing.key", "missing.key: no such file", id="missing-key"),
    ],
)
def test_unusable_certificate_files_fail_naming_the_file(
    tmp_path: Path,
    ca: CertificateAuthority,
    other_ca: CertificateAuthority,
    cert_name: str,
    key_name: str,
    fragment: str,
) -> None:
    """Bad serving files are a ConfigError, before any port opens, that names the file."""
    serving.write_pair(tmp_path, ca.issue_serving(dns_names=["localhost"]))
    (tmp_path / "other.key").write_bytes(other_ca.issue_serving(dns_names=["localhost"]).key_pem)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policies.POLICY)
    configured = settings.Settings(
        policy=str(policy_file),
        tls_cert=str(tmp_path / cert_name),
        tls_key=str(tmp_path / key_name),
    )
    with pytest.raises(errors.ConfigError) as raised:
        wiring.build(configured, secrets=RecordingPullSecrets())
    assert fragment in str(raised.value)
    assert cert_name in str(raised.value) or key_name in str(raised.value)
