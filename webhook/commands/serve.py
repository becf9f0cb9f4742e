"""`mirrorgate serve`: wiring only. Settings in, a running HTTPS admission server out."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import signal
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn, TextIO

import uvicorn
from starlette.applications import Starlette

from mirrorgate import certs, policy
from mirrorgate.webhook import admission, logs, policyfile
from mirrorgate.webhook.background import Ticker
from mirrorgate.webhook.cluster import kube, leader, policystate, selfcerts
from mirrorgate.webhook.cluster.optin import NamespaceOptIn
from mirrorgate.webhook.commands import EXIT_OK
from mirrorgate.webhook.credentials import (
    filestore,
    fingerprints,
    kubestore,
    provider,
    providerconfig,
    pullsecrets,
    scoped,
)
from mirrorgate.webhook.credentials import refresher as refresher_
from mirrorgate.webhook.credentials import store as credentials
from mirrorgate.webhook.credentials.records import Records
from mirrorgate.webhook.edge import accept, app, connections, filewatch, offload, tls
from mirrorgate.webhook.edge.limits import Limits
from mirrorgate.webhook.logs import logger
from mirrorgate.webhook.mirrorhealth import monitor
from mirrorgate.webhook.version import VERSION

__all__ = ["Settings", "StandalonePullSecrets", "build", "run", "serve"]


GC_THRESHOLD = 100_000


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


class StandalonePullSecrets:
    """No Kubernetes API: no pull secret can be made, so images that need one stay as written."""

    reason = "no Kubernetes API is configured (standalone mode)"

    def missing(self, namespace: str, credentials: Sequence[str]) -> list[str]:
        return list(credentials)

    async def ensure(self, namespace: str, credentials: Sequence[str]) -> dict[str, str]:
        return dict.fromkeys(credentials, self.reason)


@dataclasses.dataclass
class Server:
    settings: Settings
    runtime: app.Runtime
    certificates: tls.CertificateReloader
    application: Starlette
    connections: connections.ConnectionTable | None = None
    """The open connections, once :func:`uvicorn_config` has made the table."""


@dataclasses.dataclass
class Background:
    """Threads and watchers that live as long as the server: started and stopped together."""

    starts: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    stops: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    watchers: list[filewatch.FileWatcher] = dataclasses.field(default_factory=list)


def _connect(settings: Settings) -> kube.Kube | None:
    """The cluster from --kubeconfig or the in-cluster service account; None standalone."""
    if settings.kubeconfig is None and "KUBERNETES_SERVICE_HOST" not in os.environ:
        return None
    try:
        return kube.Kube.connect(kubeconfig=settings.kubeconfig, context=settings.kube_context)
    except kube.KubeError as error:
        raise policyfile.ConfigError(str(error)) from None


def _self_managed_certificates(
    settings: Settings, client: kube.Kube | None, background: Background
) -> selfcerts.SelfManagedCertificates:
    """--tls-secret: certificates kept in a Secret and renewed by the server itself."""
    if client is None:
        raise policyfile.ConfigError(
            "--tls-secret needs a cluster: pass --kubeconfig or run in a Pod"
        )
    directory = Path(settings.tls_dir or tempfile.mkdtemp(prefix="mirrorgate-tls-"))
    manager = selfcerts.SelfManagedCertificates(
        client,
        namespace=settings.namespace or kube.own_namespace(),
        secret=str(settings.tls_secret),
        service=settings.service,
        webhook_configuration=settings.webhook_configuration,
        directory=directory,
        check_interval=settings.cert_check_interval,
        extra_names=settings.tls_names,
    )
    try:
        manager.reconcile()
    except (kube.KubeError, ValueError, OSError) as error:
        raise policyfile.ConfigError(
            f"cannot set up the serving certificate from Secret {settings.tls_secret!r}: {error}"
        ) from None
    background.starts.append(manager.start)
    background.stops.append(manager.stop)
    return manager


def _credentials(
    settings: Settings,
    client: kube.Kube | None,
    runtime: app.Runtime,
    background: Background,
) -> tuple[admission.PullSecrets, credentials.CredentialStore | None]:
    """The pull-secret provisioner and the credential store the settings ask for."""
    kind = settings.store or ("kubernetes" if client else "file" if settings.store_file else "none")
    namespace = settings.namespace or kube.own_namespace()
    store: credentials.CredentialStore
    if kind == "none":
        return StandalonePullSecrets(), None
    if kind == "file":
        if settings.store_file is None:
            raise policyfile.ConfigError("--store file needs --store-file FILE")
        try:
            key = filestore.load_key(key_file=settings.store_key_file, environ=os.environ)
            file_store = filestore.FileCredentialStore(settings.store_file, key)
        except credentials.StoreError as error:
            raise policyfile.ConfigError(str(error)) from None
        background.watchers.append(
            filewatch.FileWatcher(
                [settings.store_file],
                file_store.reload,
                interval=settings.reload_interval,
                name="credential-store",
            )
        )
        store = file_store
    elif kind == "kubernetes":
        if client is None:
            raise policyfile.ConfigError(
                "--store kubernetes needs a cluster: pass --kubeconfig or run in a Pod"
            )
        kube_store = kubestore.KubernetesCredentialStore(client, namespace)
        background.starts.append(kube_store.start)
        background.stops.append(kube_store.informer.stop)
        store = kube_store
    else:
        raise policyfile.ConfigError(f"--store {kind!r}: expected kubernetes, file or none")
    runtime.readiness["credential-store"] = store.problem
    providers = _provider_source(settings, runtime.policy.policy)
    central = store
    if providers is not None and not isinstance(central, kubestore.KubernetesCredentialStore):
        raise policyfile.ConfigError(
            "credentials with a provider need --store kubernetes: the "
            "leader publishes their logins there for every replica"
        )
    store = scoped.ScopedStore(store, lambda: runtime.policy.policy.grants)
    if client is None:
        return StandalonePullSecrets(), store
    try:
        key = fingerprints.load_or_create_key(client, namespace)
    except kube.KubeError as error:
        raise policyfile.ConfigError(
            f"cannot read or make Secret {namespace}/{fingerprints.KEY_SECRET}: {error}"
        ) from None
    counter = runtime.metrics.pull_secret_writes
    optin = NamespaceOptIn(client)
    provisioner = pullsecrets.PullSecretProvisioner(
        client,
        store,
        records=Records(client, namespace),
        optin=optin,
        fingerprints=fingerprints.Fingerprints(key),
        deadline=settings.credential_deadline,
        counter=lambda action: counter.labels(action).inc(),
    )
    elector = leader.LeaderElector(client, namespace=namespace)
    reconciler = pullsecrets.Reconciler(
        provisioner,
        client,
        rules=lambda: runtime.policy.policy,
        is_leader=elector.is_leader,
        interval=settings.reconcile_interval,
    )
    runtime.readiness["pull-secrets"] = provisioner.problem
    background.starts += [optin.informer.start, provisioner.start, elector.start, reconciler.start]
    background.stops += [reconciler.stop, elector.stop, provisioner.stop, optin.informer.stop]
    runtime.on_policy_change.append(reconciler.trigger)
    if providers is not None:
        assert isinstance(central, kubestore.KubernetesCredentialStore)
        refresher = refresher_.ProviderRefresher(
            providers,
            client,
            store=central,
            rules=lambda: runtime.policy.policy,
            is_leader=elector.is_leader,
            observe=runtime.metrics.credential_refreshed,
        )
        background.starts.append(refresher.start)
        background.stops.insert(0, refresher.stop)
        runtime.on_policy_change.append(refresher.trigger)
    return provisioner, store


def _mirror_health(
    settings: Settings,
    store: credentials.CredentialStore | None,
    runtime: app.Runtime,
    background: Background,
) -> None:
    """The background probes, publishing into the runtime what admission reads."""

    def snapshot() -> Mapping[str, credentials.Credential] | None:
        assert store is not None
        return store.snapshot() if store.problem() is None else None

    def publish(value: policy.Health) -> None:
        runtime.health = value  # one reference swap: admission reads it without a lock

    health_monitor = monitor.HealthMonitor(
        rules=lambda: runtime.policy.policy,
        credentials=snapshot if store else None,
        publish=publish,
        metrics=runtime.metrics,
        probe=settings.health_probes,
    )
    runtime.advisories.append(health_monitor.problems)
    runtime.on_policy_change.append(health_monitor.trigger)
    if store is not None:
        store.subscribe(health_monitor.trigger)
    background.starts.append(health_monitor.start)
    background.stops.append(health_monitor.stop)


def _provider_source(settings: Settings, rules: policy.Policy) -> provider.ProviderSource | None:
    """The plugins for the policy's provider credentials; None when it names none."""
    wanted = {name: grant.provider for name, grant in rules.grants.items() if grant.provider}
    if settings.credential_provider_config is None:
        if wanted:
            raise policyfile.ConfigError(
                f"credentials.{min(wanted)}.provider: needs --credential-provider-config and "
                "--credential-provider-bin-dir"
            )
        return None
    if settings.credential_provider_bin_dir is None:
        raise policyfile.ConfigError(
            "--credential-provider-config needs --credential-provider-bin-dir"
        )
    try:
        config = providerconfig.load(settings.credential_provider_config)
    except providerconfig.ProviderConfigError as error:
        raise policyfile.ConfigError(str(error)) from None
    problems = providerconfig.policy_problems(
        config, rules, source=settings.credential_provider_config
    )
    if problems:
        raise policyfile.ConfigError("; ".join(problems))
    return provider.ProviderSource(
        config, settings.credential_provider_bin_dir, timeout=settings.credential_provider_timeout
    )


def _initial_policy(
    settings: Settings,
    state: policystate.PolicyState | None,
) -> tuple[policyfile.LoadedPolicy, str | None]:
    """The policy file; if it is refused, the last accepted policy and why (with a cluster).

    Without a cluster, or with no policy ever accepted there (a first install),
    a refused policy is still a ConfigError: there is nothing safe to serve.
    """
    try:
        return policyfile.read_policy(settings.policy), None
    except policyfile.ConfigError as error:
        refused = error
    data = state.load_accepted() if state is not None else None
    if state is None or data is None:
        raise refused
    try:
        kept = policyfile.read_policy(
            f"ConfigMap {state.namespace}/{policystate.ACCEPTED}", data=data
        )
    except policyfile.ConfigError:
        raise refused from None
    why = f"{refused}; serving the last accepted policy {kept.version}"
    logger.error(
        "policy refused at start; serving the last accepted policy",
        extra={"fields": {"error": str(refused), "live": kept.version}},
    )
    state.rejected(str(refused), serving=kept.version)
    return kept, why


def _log_warnings(loaded: policyfile.LoadedPolicy) -> None:
    """One line per warning of a policy just put in force: valid, so it is served, but
    unsafe or rarely meant (what `policy check` prints). Warnings name fields, hosts and
    credential names, never a login."""
    for warning in loaded.policy.warnings:
        logger.warning(
            "policy warning",
            extra={
                "fields": {"file": loaded.path, "version": loaded.version, "warning": str(warning)}
            },
        )


def build(settings: Settings, *, secrets: admission.PullSecrets | None = None) -> Server:
    """Load everything once, failing with ConfigError before any port is opened."""
    background = Background()
    client = _connect(settings)
    state = (
        None
        if client is None
        else policystate.PolicyState(client, settings.namespace or kube.own_namespace())
    )
    loaded, refused = _initial_policy(settings, state)
    if state is not None:
        background.starts.append(state.start)
        background.stops.append(state.stop)
        if refused is None:
            state.accepted(loaded.data, loaded.version)
    if settings.tls_secret is not None:
        manager = _self_managed_certificates(settings, client, background)
        cert_file, key_file = str(manager.cert_file), str(manager.key_file)
    elif settings.tls_cert is not None and settings.tls_key is not None:
        cert_file, key_file = settings.tls_cert, settings.tls_key
    else:
        raise policyfile.ConfigError("pass --tls-cert and --tls-key, or --tls-secret")
    certificates = tls.CertificateReloader(cert_file, key_file)
    # The provisioner reports to the runtime's metrics and readiness, so the
    # runtime comes first and receives it just after.
    runtime = app.Runtime(
        policy=loaded,
        secrets=StandalonePullSecrets(),
        audit_only=settings.audit_only,
        policy_refused=refused,
        max_containers=settings.limits.max_containers,
    )
    # Large reviews are screened in a worker process, off the event loop.
    runtime.screener = offload.Screener()
    background.starts.append(runtime.screener.start)
    background.stops.append(runtime.screener.stop)
    store: credentials.CredentialStore | None = None
    if secrets is None:
        secrets, store = _credentials(settings, client, runtime, background)
    runtime.secrets = secrets
    _mirror_health(settings, store, runtime, background)
    if settings.tls_secret is not None:
        runtime.readiness["certificate-upkeep"] = lambda: manager.problem

    def record_certificate_expiry() -> None:
        # Read after a successful load: should the file change in between,
        # the next poll loads that one too.
        with contextlib.suppress(OSError, ValueError):
            runtime.metrics.certificate_expiry.set(
                certs.certificate_expiry(Path(cert_file).read_bytes()).timestamp()
            )

    record_certificate_expiry()

    def reload_policy() -> None:
        try:
            fresh = policyfile.read_policy(settings.policy)
        except policyfile.ConfigError as error:
            live = runtime.policy.version
            runtime.metrics.policy_reload_failures.inc()
            runtime.policy_refused = f"{error}; still serving policy {live}"
            logger.error(
                "policy rejected; the previous policy stays in force",
                extra={"fields": {"error": str(error), "live": live}},
            )
            if state is not None:
                state.rejected(str(error), serving=live)
            return
        runtime.policy_refused = None
        runtime.set_policy(fresh)
        if state is not None:
            state.accepted(fresh.data, fresh.version)
        logger.info("policy reloaded", extra={"fields": {"version": fresh.version}})
        _log_warnings(fresh)

    def reload_certificates() -> None:
        try:
            certificates.reload()
        except policyfile.ConfigError as error:
            # Often a half-written Secret update (new cert, old key): the next
            # poll retries, and the old certificate keeps serving meanwhile.
            runtime.metrics.certificate_reloads.labels("failed").inc()
            logger.warning(
                "certificate reload failed; still serving the previous one",
                extra={"fields": {"error": str(error)}},
            )
            watcher_certs.reset()
            return
        runtime.metrics.certificate_reloads.labels("loaded").inc()
        record_certificate_expiry()
        logger.info("serving certificate reloaded", extra={"fields": {}})

    watcher_policy = filewatch.FileWatcher(
        [settings.policy], reload_policy, interval=settings.reload_interval, name="policy"
    )
    watcher_certs = filewatch.FileWatcher(
        [cert_file, key_file],
        reload_certificates,
        interval=settings.reload_interval,
        name="certificates",
    )

    background.watchers += [watcher_policy, watcher_certs]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        for start in background.starts:
            start()
        for watcher in background.watchers:
            watcher.start()
        flusher = Ticker(logs.flush, interval=1.0, name="flush-logs")
        flusher.start()
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
            # After uvicorn has drained the requests in flight.
            await flusher.stop()
            for watcher in background.watchers:
                watcher.stop()
            for stop in background.stops:
                stop()
            logger.info("mirrorgate stopped", extra={"fields": {}})
            logs.flush()

    application = app.create_app(runtime)
    application.router.lifespan_context = lifespan
    _log_warnings(loaded)  # once it is sure to be served
    return Server(
        settings=settings, runtime=runtime, certificates=certificates, application=application
    )


def uvicorn_config(server: Server) -> uvicorn.Config:
    """uvicorn on uvloop, with TLS and every limit applied by :mod:`webhook.connections`."""
    settings = server.settings
    problems = settings.limits.problems()
    if problems:
        raise policyfile.ConfigError("; ".join(problems))
    config = uvicorn.Config(
        server.application,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # uvloop: an idle TLS connection costs about 50 KB under it and
        # 280 KB under asyncio's own loop, which zero-fills a 256 KB buffer
        # per connection (measured: 1,000 idle connections, +46 vs +274 MB).
        loop="uvloop",
        http="httptools",
        ws="none",
        # Idle keep-alive connections: uvicorn's timer, armed after each answer.
        timeout_keep_alive=settings.limits.idle_timeout,
    )  # type: ignore[arg-type]
    config.load()
    metrics = server.runtime.metrics
    table = connections.ConnectionTable(
        settings.limits, on_close=lambda reason: metrics.connections_dropped.labels(reason).inc()
    )
    metrics.open_connections.set_function(lambda: len(table.open))
    server.connections = table
    # The server itself is plain TCP: each connection is counted from its
    # accept and upgraded to TLS (>= 1.2, hot-swapped certificates) by the
    # acceptor, within the header timeout.
    config.ssl = None
    config.http_protocol_class = accept.protocol_factory(  # type: ignore[assignment]
        table, server.certificates.base
    )
    return config


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; a one-line ConfigError when that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Restarts may reuse a port in TIME_WAIT; a listening owner still refuses.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise policyfile.ConfigError(
            f"cannot listen on {host}:{port}: {error.strerror or error}"
        ) from None
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn that says "serving" once it accepts connections, not before."""

    def __init__(self, config: uvicorn.Config, *, runtime: app.Runtime, address: str) -> None:
        super().__init__(config)
        self.runtime, self.address = runtime, address

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            loaded = self.runtime.policy
            logger.info(
                "mirrorgate serving",
                extra={
                    "fields": {
                        "address": self.address,
                        "version": VERSION,
                        "policy": loaded.version,
                        "mode": self.runtime.mode,
                    }
                },
            )
            logs.flush()


def _exit_quietly(signum: int, frame: object) -> NoReturn:
    # While serving, uvicorn takes SIGTERM, drains the requests in flight and
    # then raises the signal again for the handler it found: this one, so
    # that a graceful stop exits 0 instead of dying of the signal. Before
    # serving starts it ends the process at once, also with 0.
    raise SystemExit(0)


def serve(settings: Settings) -> None:
    """Listen first (a busy port is a ConfigError), then build and serve until SIGTERM."""
    logs.configure(settings.log_level)
    listener = listen(settings.host, settings.port)
    signal.signal(signal.SIGTERM, _exit_quietly)
    server = build(settings)
    config = uvicorn_config(server)
    accept.raise_file_limit(settings.limits.max_connections)
    host, port = listener.getsockname()[:2]
    address = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    # run(), not asyncio.run(serve()): run() uses the loop the config names (uvloop).
    _Uvicorn(config, runtime=server.runtime, address=address).run(sockets=[listener])


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`mirrorgate serve`: its flags as :class:`Settings`, served until SIGTERM."""
    serve(
        Settings(
            policy=args.policy,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            host=args.host,
            port=args.port,
            reload_interval=args.reload_interval,
            log_level=args.log_level,
            kubeconfig=args.kubeconfig,
            kube_context=args.context,
            namespace=args.namespace,
            store=args.store,
            store_file=args.store_file,
            store_key_file=args.key_file,
            credential_deadline=args.credential_deadline,
            audit_only=args.audit_only,
            reconcile_interval=args.reconcile_interval,
            credential_provider_config=args.credential_provider_config,
            credential_provider_bin_dir=args.credential_provider_bin_dir,
            credential_provider_timeout=args.credential_provider_timeout,
            tls_secret=args.tls_secret,
            service=args.service,
            webhook_configuration=args.webhook_config,
            cert_check_interval=args.cert_check_interval,
            tls_dir=args.tls_dir,
            tls_names=tuple(args.tls_name),
            limits=Limits(
                max_connections=args.max_connections,
                max_header_bytes=args.max_header_bytes,
                max_headers=args.max_headers,
                header_timeout=args.header_timeout,
                body_timeout=args.body_timeout,
                idle_timeout=args.idle_timeout,
                max_buffered_bytes=args.max_buffered_bytes,
                max_containers=args.max_containers,
                write_timeout=args.write_timeout,
                max_unsent_bytes=args.max_unsent_bytes,
                max_pipelined=args.max_pipelined,
            ),
            health_probes=args.health_probes,
        )
    )
    return EXIT_OK
