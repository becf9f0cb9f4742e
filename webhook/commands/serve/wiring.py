"""`mirrorgate serve`'s composition root: settings in, the application and its components out.

:func:`build` makes each component once, in dependency order: the cluster connection, the
policy in force, the serving certificate, the review worker, the credential store and what
makes pull secrets, then the :class:`~mirrorgate.webhook.edge.app.Runtime` the endpoints
read, made complete (nothing in it is replaced later), then the health probes that publish
into it. Every background component is added to one
:class:`~mirrorgate.webhook.background.Manager` as it is made; the application's lifespan
starts them in that order and stops them in reverse. What the runtime reads live is
published into it by its one owner: the policy by :class:`.policies.ServedPolicy`, the
mirrors' health by the monitor. Everything is loaded before any port opens, so that a bad
setting is a ConfigError, not a server that fails later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from starlette.applications import Starlette

from mirrorgate import policy
from mirrorgate.webhook import admission, logs, policyfile
from mirrorgate.webhook.background import Manager, Ticker
from mirrorgate.webhook.cluster import kube, policystate, selfcerts
from mirrorgate.webhook.cluster.optin import NamespaceOptIn
from mirrorgate.webhook.commands.serve import kubelet, probing, reloaders
from mirrorgate.webhook.commands.serve.policies import Cluster, ServedPolicy
from mirrorgate.webhook.commands.serve.settings import Settings
from mirrorgate.webhook.credentials import (
    filestore,
    fingerprints,
    kubestore,
    pluginhost,
    provider,
    providerconfig,
    pullsecrets,
    scoped,
    squatters,
)
from mirrorgate.webhook.credentials import refresher as refresher_
from mirrorgate.webhook.credentials import store as credentials
from mirrorgate.webhook.credentials.reconciler import Reconciler
from mirrorgate.webhook.credentials.records import Records
from mirrorgate.webhook.edge import app, connections, filewatch, monitoring, offload, tls
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.logs import logger

__all__ = ["SHUTDOWN_DEADLINE", "Server", "StandalonePullSecrets", "build"]


GC_THRESHOLD = 100_000
SHUTDOWN_DEADLINE = 30.0
"""Seconds stopping the components may take in all, once uvicorn has drained the requests."""

Check = Callable[[], str | None]
"""A readiness check: None when ready, else why not."""


class StandalonePullSecrets:
    """No Kubernetes API: no pull secret can be made, so images that need one stay as written."""

    reason = "no Kubernetes API is configured (standalone mode)"

    def missing(self, namespace: str, credentials: Sequence[str]) -> list[str]:
        return list(credentials)

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return None  # no Namespace cache: only names grant

    async def ensure(self, namespace: str, credentials: Sequence[str]) -> dict[str, str]:
        return dict.fromkeys(credentials, self.reason)


@dataclasses.dataclass
class Server:
    settings: Settings
    runtime: app.Runtime
    certificates: tls.CertificateReloader
    application: Starlette
    """The admission listener's (its lifespan runs the components)."""
    monitoring: Starlette | None
    """The metrics listener's, with --metrics-port."""
    kubelet: kubelet.CredentialEndpoint | None
    """The kubelet credential listener's, with --kubelet-port."""
    components: Manager
    """The background components, in start order (the application's lifespan runs them)."""
    connections: connections.ConnectionTable | None = None
    """The open connections, once :func:`uvicorn_config` has made the table."""


@dataclasses.dataclass(frozen=True)
class _Credentials:
    """What the credential settings make: the provisioner admission calls, the store the
    probes check, the readiness checks and the passes to run when the policy changes."""

    secrets: admission.PullSecrets
    store: credentials.CredentialStore | None = None
    readiness: Mapping[str, Check] = dataclasses.field(default_factory=dict)
    on_policy_change: Sequence[Callable[[], None]] = ()
    advisories: Sequence[Callable[[], Mapping[str, str]]] = ()
    """What /readyz lists without turning unready (the store's unlabelled Secrets)."""
    namespaces: NamespaceOptIn | None = None


def _connect(settings: Settings) -> kube.Kube | None:
    """The cluster from --kubeconfig or the in-cluster service account; None standalone."""
    if settings.kubeconfig is None and "KUBERNETES_SERVICE_HOST" not in os.environ:
        return None
    try:
        return kube.Kube.connect(kubeconfig=settings.kubeconfig, context=settings.kube_context)
    except kube.KubeError as error:
        raise ConfigError(str(error)) from None


def _self_managed_certificates(
    settings: Settings, client: kube.Kube | None, namespace: str
) -> selfcerts.SelfManagedCertificates:
    """--tls-secret: certificates kept in a Secret and renewed by the server itself."""
    if client is None:
        raise ConfigError("--tls-secret needs a cluster: pass --kubeconfig or run in a Pod")
    directory = Path(settings.tls_dir or tempfile.mkdtemp(prefix="mirrorgate-tls-"))
    upkeep = selfcerts.SelfManagedCertificates(
        client,
        namespace=namespace,
        secret=str(settings.tls_secret),
        ca_secret=settings.ca_secret,
        ca_configmap=settings.ca_configmap,
        service=settings.service,
        webhook_configuration=settings.webhook_configuration,
        directory=directory,
        check_interval=settings.cert_check_interval,
        extra_names=settings.tls_names,
    )
    try:
        upkeep.reconcile()
    except (kube.KubeError, ValueError, OSError) as error:
        raise ConfigError(
            f"cannot set up the serving certificate from Secret {settings.tls_secret!r}: {error}"
        ) from None
    return upkeep


def _store(
    settings: Settings, client: kube.Kube | None, namespace: str, components: Manager
) -> credentials.CredentialStore | None:
    """The credential store the settings name (default: kubernetes with a cluster, file
    with --store-file, else none)."""
    kind = settings.store or ("kubernetes" if client else "file" if settings.store_file else "none")
    if kind == "none":
        return None
    if kind == "file":
        if settings.store_file is None:
            raise ConfigError("--store file needs --store-file FILE")
        try:
            key = filestore.load_key(key_file=settings.store_key_file, environ=os.environ)
            file_store = filestore.FileCredentialStore(settings.store_file, key)
        except credentials.StoreError as error:
            raise ConfigError(str(error)) from None
        watcher = filewatch.FileWatcher(
            [settings.store_file],
            file_store.reload,
            interval=settings.reload_interval,
            name="credential-store",
        )
        components.add("credential-store", watcher)
        return file_store
    if kind == "kubernetes":
        if client is None:
            raise ConfigError(
                "--store kubernetes needs a cluster: pass --kubeconfig or run in a Pod"
            )
        kube_store = kubestore.KubernetesCredentialStore(client, namespace)
        components.add("credential-store", kube_store.informer)
        return kube_store
    raise ConfigError(f"--store {kind!r}: expected kubernetes, file or none")


def _credentials(
    settings: Settings,
    cluster: Cluster | None,
    namespace: str,
    served: ServedPolicy,
    metrics: Metrics,
    components: Manager,
) -> _Credentials:
    """The pull-secret provisioner and the credential store the settings ask for."""
    client = cluster.client if cluster is not None else None
    store = _store(settings, client, namespace, components)
    if store is None:
        return _Credentials(StandalonePullSecrets())
    readiness: dict[str, Check] = {"credential-store": store.problem}
    providers = _provider_source(settings, served.current())
    central = store
    if providers is not None and not isinstance(central, kubestore.KubernetesCredentialStore):
        raise ConfigError(
            "credentials with a provider need --store kubernetes: the "
            "leader publishes their logins there for every replica"
        )
    store = scoped.ScopedStore(store, lambda: served.current().grants)
    if cluster is None or client is None:
        return _Credentials(StandalonePullSecrets(), store, readiness)
    optin, elector = cluster.optin, cluster.elector
    try:
        key = fingerprints.load_or_create_key(client, namespace)
    except kube.KubeError as error:
        raise ConfigError(
            f"cannot read or make Secret {namespace}/{fingerprints.KEY_SECRET}: {error}"
        ) from None
    counter = metrics.pull_secret_writes
    squats = squatters.SquatReporter(client, count=metrics.squatted_copies.inc)
    provisioner = pullsecrets.PullSecretProvisioner(
        client,
        store,
        records=Records(client, namespace),
        optin=optin,
        fingerprints=fingerprints.Fingerprints(key),
        deadline=settings.credential_deadline,
        counter=lambda action: counter.labels(action).inc(),
        squatted=squats.squatted,
    )
    reconciler = Reconciler(
        provisioner,
        client,
        mirror_policy=served.current,
        policy_problem=served.problem,
        is_leader=elector.is_leader,
        interval=settings.reconcile_interval,
    )
    readiness["pull-secrets"] = provisioner.problem
    components.add("squat-reporter", squats)
    components.add("pull-secrets", provisioner)
    components.add("reconciler", reconciler)
    triggers = [reconciler.trigger]
    if providers is not None:
        assert isinstance(central, kubestore.KubernetesCredentialStore)
        refresher = refresher_.ProviderRefresher(
            providers,
            client,
            store=central,
            mirror_policy=served.current,
            is_leader=elector.is_leader,
            observe=metrics.credential_refreshed,
        )
        components.add("provider-refresher", refresher)
        triggers.append(refresher.trigger)
    advisories = (
        (central.advisories,) if isinstance(central, kubestore.KubernetesCredentialStore) else ()
    )
    return _Credentials(provisioner, store, readiness, triggers, advisories, optin)


def _provider_source(
    settings: Settings, mirror_policy: policy.Policy
) -> provider.ProviderSource | None:
    """The plugins for the policy's provider credentials; None when it names none."""
    wanted = {
        name: grant.provider for name, grant in mirror_policy.grants.items() if grant.provider
    }
    if settings.credential_provider_config is None:
        if wanted:
            raise ConfigError(
                f"credentials.{min(wanted)}.provider: needs --credential-provider-config and "
                "--credential-provider-socket (or --credential-provider-bin-dir)"
            )
        return None
    runner = pluginhost.runner(
        bin_dir=settings.credential_provider_bin_dir,
        socket_path=settings.credential_provider_socket,
        timeout=settings.credential_provider_timeout,
    )
    try:
        config = providerconfig.load(settings.credential_provider_config)
    except providerconfig.ProviderConfigError as error:
        raise ConfigError(str(error)) from None
    problems = providerconfig.policy_problems(
        config, mirror_policy, source=settings.credential_provider_config
    )
    if problems:
        raise ConfigError("; ".join(problems))
    return provider.ProviderSource(config, runner)


def _publish_policy(
    runtime: app.Runtime, loaded: policyfile.LoadedPolicy, refused: str | None
) -> None:
    """What :class:`.policies.ServedPolicy` has in force, as the endpoints read it."""
    runtime.policy_refused = refused
    if loaded is not runtime.policy:
        runtime.set_policy(loaded)  # runs the runtime's on_policy_change


def build(settings: Settings, *, secrets: admission.PullSecrets | None = None) -> Server:
    """Load everything once, failing with ConfigError before any port is opened.

    ``secrets`` stands in for the credential settings (a test's recording fake).
    """
    components = Manager(deadline=SHUTDOWN_DEADLINE)
    metrics = Metrics()
    client = _connect(settings)
    namespace = settings.namespace or kube.own_namespace()
    state = None if client is None else policystate.PolicyState(client, namespace)
    if state is not None:
        components.add("policy-state", state)
    served = ServedPolicy(
        settings.policy,
        client=client,
        state=state,
        metrics=metrics,
        interval=settings.reload_interval,
    )
    cluster = None if client is None else Cluster.make(client, namespace, components)
    if cluster is not None:
        served.watch(cluster)
    upkeep = None
    if settings.tls_secret is not None:
        upkeep = _self_managed_certificates(settings, client, namespace)
        components.add("certificate-upkeep", upkeep)
        cert_file, key_file = str(upkeep.cert_file), str(upkeep.key_file)
    elif settings.tls_cert is not None and settings.tls_key is not None:
        cert_file, key_file = settings.tls_cert, settings.tls_key
    else:
        raise ConfigError("pass --tls-cert and --tls-key, or --tls-secret")
    certificate = reloaders.ServingCertificate(
        cert_file,
        key_file,
        client_ca=settings.client_ca,
        kubelet_ca=kubelet.client_ca(settings, client),
        metrics=metrics,
        interval=settings.reload_interval,
    )
    # Large reviews are screened in a worker process, off the event loop.
    screener = offload.Screener(max_waiting=settings.limits.max_connections)
    components.add("review-worker", screener)
    made = (
        _Credentials(secrets)
        if secrets is not None
        else _credentials(settings, cluster, namespace, served, metrics, components)
    )
    readiness = dict(made.readiness)
    if cluster is not None:
        readiness["policy-objects"] = served.problem
    if upkeep is not None:
        readiness["certificate-upkeep"] = lambda: upkeep.problem
    runtime = app.Runtime(
        policy=served.loaded,
        secrets=made.secrets,
        metrics=metrics,
        readiness=readiness,
        audit_only=settings.audit_only,
        policy_refused=served.refused,
        max_containers=settings.limits.max_containers,
        screener=screener,
        on_policy_change=list(made.on_policy_change),
    )
    served.subscribe(functools.partial(_publish_policy, runtime))
    if served.objects is not None:
        runtime.policy_objects = served.objects.context
    health_monitor = probing.mirror_health(settings, made.store, served, runtime, components)
    # The monitor publishes into the runtime, so it is made after it and registered here.
    runtime.advisories.append(health_monitor.problems)
    runtime.advisories.extend(made.advisories)
    runtime.on_policy_change.append(health_monitor.trigger)
    components.add("mirror-health", health_monitor)
    served.add_components(components)
    components.add("serving-certificate", certificate)
    components.add("log-flusher", Ticker(logs.flush, interval=1.0, name="flush-logs"))

    apart = settings.metrics_port is not None
    application = app.create_app(runtime, monitoring_apart=apart)
    application.router.lifespan_context = functools.partial(_lifespan, components)
    reloaders.log_warnings(served.loaded)  # once it is sure to be served
    return Server(
        settings=settings,
        runtime=runtime,
        certificates=certificate.contexts,
        application=application,
        monitoring=monitoring.create_app(runtime) if apart else None,
        kubelet=kubelet.endpoint(
            settings,
            client,
            store=made.store,
            namespaces=made.namespaces,
            mirror_policy=served.policy_for,
            metrics=metrics,
        ),
        components=components,
    )


@contextlib.asynccontextmanager
async def _lifespan(components: Manager, _: Starlette) -> AsyncIterator[None]:
    """The components run from the application's startup to its shutdown, which comes after
    uvicorn has drained the requests in flight."""
    components.start()
    # Everything loaded so far lives as long as the process: keep it out of
    # the collector's generations. A review decodes into thousands of
    # dicts and lists that reference counting frees at once; with the
    # default threshold (700) nearly every large admission would also pay
    # for a collection that finds nothing, so collect far less often.
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    try:
        yield
    finally:
        shutdown = components.stop()
        for name in shutdown.late:
            logger.warning(
                "component still stopping at the deadline", extra={"fields": {"component": name}}
            )
        for name, error in shutdown.failed:
            logger.error(
                "component failed to stop",
                extra={"fields": {"component": name, "error": str(error)}},
            )
        logger.info("mirrorgate stopped", extra={"fields": {}})
        logs.flush()
