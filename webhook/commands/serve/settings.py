"""`mirrorgate serve`'s settings: what the command line hands the composition root."""

from __future__ import annotations

import dataclasses

from mirrorgate.webhook.edge.limits import Limits

__all__ = ["Settings"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    policy: str
    """Path of the policy YAML; watched and reloaded on change."""
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_secret: str | None = None
    """Keep CA and serving certificate in this Secret of our namespace, renewing them."""
    tls_dir: str | None = None
    """Where --tls-secret's serving files are written (default: a new temporary folder)."""
    service: str = "mirrorgate"
    """The Service name the serving certificate is for (--tls-secret)."""
    webhook_configuration: str | None = None
    """The MutatingWebhookConfiguration whose caBundle is kept in step (--tls-secret)."""
    cert_check_interval: float = 300.0
    tls_names: tuple[str, ...] = ()
    """Extra DNS names or IPs for the --tls-secret serving certificate."""
    host: str = "127.0.0.1"
    port: int = 8443
    reload_interval: float = 1.0
    """Seconds between checks of the policy and certificate files."""
    log_level: str = "info"
    kubeconfig: str | None = None
    """A kubeconfig file; without one, the in-cluster service account when running in a
    Pod, else standalone (no pull secrets can be made)."""
    kube_context: str | None = None
    namespace: str | None = None
    """mirrorgate's own namespace: the kubernetes credential store and the Lease."""
    store: str | None = None
    """`kubernetes`, `file` or `none`; default: kubernetes with a cluster, else file when
    store_file is set, else none."""
    store_file: str | None = None
    store_key_file: str | None = None
    credential_deadline: float = 2.0
    """Seconds admission may spend making pull secrets; keep well inside timeoutSeconds."""
    reconcile_interval: float = 30.0
    credential_provider_config: str | None = None
    """The kubelet's CredentialProviderConfig file, for credentials with a ``provider``."""
    credential_provider_bin_dir: str | None = None
    credential_provider_timeout: float = 10.0
    """Seconds a plugin may run before it is killed."""
    audit_only: bool = False
    """Treat every endpoint as /audit, whatever the namespace labels: a cluster-wide
    "report only" override."""
    limits: Limits = dataclasses.field(default_factory=Limits)
    """Connections, request heads, read timeouts and buffered bodies (see webhook.connections)."""
    health_probes: bool = True
    """Probe mirrors and credential logins in the background; off, every mirror counts as up
    (the credential store is still checked against the policy)."""
