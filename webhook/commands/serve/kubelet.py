"""`serve --kubelet-port`: the kubelet credential listener's parts, for the composition root."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from mirrorgate import policy
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.optin import NamespaceOptIn
from mirrorgate.webhook.commands.serve.settings import Settings
from mirrorgate.webhook.credentials.store import CredentialStore
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.kubeletcreds import clientca, tokens
from mirrorgate.webhook.kubeletcreds.endpoint import CredentialEndpoint

__all__ = ["CredentialEndpoint", "client_ca", "endpoint"]


def client_ca(settings: Settings, client: kube.Kube | None) -> str | None:
    """The kubelets' client CA file, with --kubelet-port; None without."""
    if settings.kubelet_port is None:
        return None
    if client is None:
        raise ConfigError("--kubelet-port needs a cluster: pass --kubeconfig or run in a Pod")
    if settings.kubelet_client_ca is not None:
        return settings.kubelet_client_ca
    return clientca.cluster_client_ca(client, Path(tempfile.mkdtemp(prefix="mirrorgate-kubelet-")))


def endpoint(
    settings: Settings,
    client: kube.Kube | None,
    *,
    store: CredentialStore | None,
    namespaces: NamespaceOptIn | None,
    mirror_policy: Callable[[str], policy.Policy],
    metrics: Metrics,
) -> CredentialEndpoint | None:
    """The credential endpoint, with --kubelet-port; None without."""
    if settings.kubelet_port is None:
        return None
    if client is None or store is None or namespaces is None:
        raise ConfigError("--kubelet-port needs a cluster and a credential store")
    if settings.kubelet_cache_duration <= 0:
        raise ConfigError("--kubelet-cache-duration must be positive")
    observe = metrics.token_reviews.labels
    reviewer = tokens.TokenReviewer(
        client, audience=settings.kubelet_audience, observe=lambda result: observe(result).inc()
    )
    return CredentialEndpoint(
        reviewer=reviewer,
        namespaces=namespaces,
        mirror_policy=mirror_policy,
        store=store,
        metrics=metrics,
        cache_duration=settings.kubelet_cache_duration,
    )
