"""Only Secrets labelled mirrorgate.io/credential=true are central credentials (migration:
unlabelled ones still count this minor version, warned of)."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest

from mirrorgate.webhook.credentials.kubestore import KubernetesCredentialStore

NAMESPACE = "mirrorgate"


def _secret(name: str, labels: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    payload = {"auths": {"harbor.corp.example": {"username": "robot", "password": "s3cret-pw"}}}
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    if labels is not None:
        metadata["labels"] = labels
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": metadata,
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(payload).encode()).decode()},
        **fields,
    }


def _store(*secrets: dict[str, Any]) -> KubernetesCredentialStore:
    """The store with its informer's cache filled as a list would fill it (not started)."""
    store = KubernetesCredentialStore(object(), NAMESPACE)  # type: ignore[arg-type]
    for secret in secrets:
        store.informer.items[(NAMESPACE, secret["metadata"]["name"])] = secret
    store._changed("SYNC", {})
    return store


def test_labelled_secrets_are_credentials_and_not_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A labelled docker-registry Secret is a credential, without a warning."""
    with caplog.at_level(logging.WARNING):
        store = _store(_secret("harbor-pull", {"mirrorgate.io/credential": "true"}))
    assert set(store.snapshot()) == {"harbor-pull"}
    assert store.unlabelled == frozenset()
    assert dict(store.advisories()) == {}
    assert not [r for r in caplog.records if "credential label" in r.getMessage()]


def test_unlabelled_secrets_still_count_with_a_warning_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Migration: an unlabelled one counts, is named, and is warned of once, with the fix;
    the password is never in the log."""
    with caplog.at_level(logging.WARNING):
        store = _store(
            _secret("legacy"), _secret("harbor-pull", {"mirrorgate.io/credential": "true"})
        )
        store._changed("MODIFIED", {})
    assert set(store.snapshot()) == {"legacy", "harbor-pull"}
    assert store.unlabelled == frozenset({"legacy"})
    warned = [r for r in caplog.records if "credential label" in r.getMessage()]
    assert len(warned) == 1
    fields = warned[0].__dict__["fields"]
    assert fields["secret"] == "mirrorgate/legacy"
    assert fields["fix"] == (
        "kubectl -n mirrorgate label secret legacy mirrorgate.io/credential=true"
    )
    assert "s3cret-pw" not in caplog.text
    assert dict(store.advisories()) == {
        "credential-labels": "1 credential Secret(s) without the label "
        "mirrorgate.io/credential=true still count in this version, not in the next: "
        "legacy (docs/upgrading.md)"
    }


def test_secrets_labelled_otherwise_are_not_credentials() -> None:
    """mirrorgate.io/credential with another value is not a central credential."""
    store = _store(_secret("copy", {"mirrorgate.io/credential": "harbor-pull"}))
    assert dict(store.snapshot()) == {}
