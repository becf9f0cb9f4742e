"""`mirrorgate serve`: wiring only. Settings in, a running HTTPS admission server out."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence

import uvicorn
from starlette.applications import Starlette

from webhook import admission, app, logs, policyfile, tls, watch
from webhook.logs import logger

__all__ = ["Settings", "StandalonePullSecrets", "build", "serve"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    policy: str
    """Path of the policy YAML; watched and reloaded on change."""
    tls_cert: str
    tls_key: str
    host: str = "127.0.0.1"
    port: int = 8443
    reload_interval: float = 1.0
    """Seconds between checks of the policy and certificate files."""
    log_level: str = "info"


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


def build(settings: Settings, *, secrets: admission.PullSecrets | None = None) -> Server:
    """Load everything once, failing with ConfigError before any port is opened."""
    loaded = policyfile.read_policy(settings.policy)
    certificates = tls.CertificateReloader(settings.tls_cert, settings.tls_key)
    runtime = app.Runtime(policy=loaded, secrets=secrets or StandalonePullSecrets())
    runtime.readiness["certificates"] = lambda: None if certificates.current else "not loaded"

    def reload_policy() -> None:
        try:
            fresh = policyfile.read_policy(settings.policy)
        except policyfile.ConfigError as error:
            runtime.metrics.policy_reload_failures.inc()
            logger.error("policy rejected; the previous policy stays in force",
                         extra={"fields": {"error": str(error), "live": runtime.policy.version}})
            return
        runtime.set_policy(fresh)
        logger.info("policy reloaded", extra={"fields": {"version": fresh.version,
                                                          "mode": fresh.policy.mode}})

    def reload_certificates() -> None:
        try:
            certificates.reload()
        except policyfile.ConfigError as error:
            # Often a half-written Secret update (new cert, old key): the next
            # poll retries, and the old certificate keeps serving meanwhile.
            runtime.metrics.certificate_reloads.labels("failed").inc()
            logger.warning("certificate reload failed; still serving the previous one",
                           extra={"fields": {"error": str(error)}})
            watcher_certs.reset()
            return
        runtime.metrics.certificate_reloads.labels("loaded").inc()
        logger.info("serving certificate reloaded", extra={"fields": {}})

    watcher_policy = watch.FileWatcher([settings.policy], reload_policy,
                                       interval=settings.reload_interval, name="policy")
    watcher_certs = watch.FileWatcher([settings.tls_cert, settings.tls_key], reload_certificates,
                                      interval=settings.reload_interval, name="certificates")

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        watcher_policy.start()
        watcher_certs.start()
        logger.info("mirrorgate serving", extra={"fields": {
            "address": f"https://{settings.host}:{settings.port}",
            "policy": loaded.version, "mode": loaded.policy.mode}})
        try:
            yield
        finally:
            await watcher_policy.stop()
            await watcher_certs.stop()

    application = app.create_app(runtime)
    application.router.lifespan_context = lifespan
    return Server(settings=settings, runtime=runtime, certificates=certificates,
                  application=application)


def uvicorn_config(server: Server) -> uvicorn.Config:
    settings = server.settings
    config = uvicorn.Config(
        server.application, host=settings.host, port=settings.port,
        ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key,
        log_config=None, access_log=False, lifespan="on",
        # The API server keeps connections alive between admissions.
        timeout_keep_alive=60)
    config.load()
    config.ssl = server.certificates.base  # TLS >= 1.2, hot-swapped certificates
    return config


def serve(settings: Settings) -> None:
    logs.configure(settings.log_level)
    server = build(settings)
    asyncio.run(uvicorn.Server(uvicorn_config(server)).serve())
