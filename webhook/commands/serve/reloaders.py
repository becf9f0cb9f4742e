"""The files `serve` reloads while it runs: the policy, the serving certificate and the
mirrors' CA bundle.

Each reloader owns what it loaded and the :class:`~mirrorgate.webhook.edge.filewatch.FileWatcher`
that sees its files change, and is a component of the server's
:class:`~mirrorgate.webhook.background.Manager` (``start`` and ``stop`` are its watcher's).
A file that cannot be used when it changes never replaces what is in force: the reload is
refused, counted, logged and, for the policy, reported on /readyz.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from mirrorgate import certs, policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.cluster import policystate
from mirrorgate.webhook.edge import filewatch, tls
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.logs import logger

__all__ = ["MirrorCA", "PolicyFile", "ServingCertificate", "log_warnings", "read_bundle"]

Publish = Callable[[policyfile.LoadedPolicy, str | None], None]
"""Receives, after each reload, the policy in force and why the newest was refused (or None)."""


class _Watched:
    """A reloader is a component: it runs while its file watcher runs."""

    watcher: filewatch.FileWatcher

    def start(self) -> None:
        self.watcher.start()

    def stop(self) -> None:
        self.watcher.stop()


class PolicyFile(_Watched):
    """The policy in force: the file, or at start the last accepted policy if the file is
    refused and a cluster keeps one; reloaded when the file changes.

    Without a cluster, or with no policy ever accepted there (a first install), a policy
    refused at start is a ConfigError: there is nothing safe to serve.
    """

    def __init__(
        self,
        path: str,
        *,
        state: policystate.PolicyState | None,
        metrics: Metrics,
        interval: float,
    ) -> None:
        self.path, self._state, self._metrics = path, state, metrics
        self.loaded, self.refused = _initial_policy(path, state)
        if state is not None and self.refused is None:
            state.accepted(self.loaded.data, self.loaded.version)
        self._subscribers: list[Publish] = []
        self.watcher = filewatch.FileWatcher([path], self.reload, interval=interval, name="policy")

    def current(self) -> policy.Policy:
        """The policy in force now (one reference, replaced whole by a reload)."""
        return self.loaded.policy

    def subscribe(self, publish: Publish) -> None:
        self._subscribers.append(publish)

    def reload(self) -> None:
        try:
            fresh = policyfile.read_policy(self.path)
        except ConfigError as error:
            live = self.loaded.version
            self._metrics.policy_reload_failures.inc()
            self.refused = f"{error}; still serving policy {live}"
            self._publish()
            logger.error(
                "policy rejected; the previous policy stays in force",
                extra={"fields": {"error": str(error), "live": live}},
            )
            if self._state is not None:
                self._state.rejected(str(error), serving=live)
            return
        self.loaded, self.refused = fresh, None
        self._publish()
        if self._state is not None:
            self._state.accepted(fresh.data, fresh.version)
        logger.info("policy reloaded", extra={"fields": {"version": fresh.version}})
        log_warnings(fresh)

    def _publish(self) -> None:
        for publish in self._subscribers:
            publish(self.loaded, self.refused)


def _initial_policy(
    path: str, state: policystate.PolicyState | None
) -> tuple[policyfile.LoadedPolicy, str | None]:
    """The policy file; if it is refused, the last accepted policy and why (with a cluster)."""
    try:
        return policyfile.read_policy(path), None
    except ConfigError as error:
        refused = error
    data = state.load_accepted() if state is not None else None
    if state is None or data is None:
        raise refused
    try:
        kept = policyfile.read_policy(
            f"ConfigMap {state.namespace}/{policystate.ACCEPTED}", data=data
        )
    except ConfigError:
        raise refused from None
    why = f"{refused}; serving the last accepted policy {kept.version}"
    logger.error(
        "policy refused at start; serving the last accepted policy",
        extra={"fields": {"error": str(refused), "live": kept.version}},
    )
    state.rejected(str(refused), serving=kept.version)
    return kept, why


def log_warnings(loaded: policyfile.LoadedPolicy) -> None:
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


class ServingCertificate(_Watched):
    """The serving certificate and key, and the client CA callers are checked against:
    loaded at start (a ConfigError names a bad file), reloaded when any of the files
    changes, the certificate's expiry kept in the metrics."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        client_ca: str | None = None,
        kubelet_ca: str | None = None,
        metrics: Metrics,
        interval: float,
    ) -> None:
        self.cert_file, self._metrics = cert_file, metrics
        self.contexts = tls.CertificateReloader(
            cert_file, key_file, client_ca, kubelet_ca=kubelet_ca
        )
        """The TLS contexts handshakes are served from (the acceptors hold the bases)."""
        files = [cert_file, key_file, *(ca for ca in (client_ca, kubelet_ca) if ca)]
        self.watcher = filewatch.FileWatcher(
            files, self.reload, interval=interval, name="certificates"
        )
        self._record_expiry()

    def reload(self) -> None:
        try:
            self.contexts.reload()
        except ConfigError as error:
            # Often a half-written Secret update (new cert, old key): the next
            # poll retries, and the old certificate keeps serving meanwhile.
            self._metrics.certificate_reloads.labels("failed").inc()
            logger.warning(
                "certificate reload failed; still serving the previous one",
                extra={"fields": {"error": str(error)}},
            )
            self.watcher.reset()
            return
        self._metrics.certificate_reloads.labels("loaded").inc()
        self._record_expiry()
        logger.info("serving certificate reloaded", extra={"fields": {}})

    def _record_expiry(self) -> None:
        # Read after a successful load: should the file change in between,
        # the next poll loads that one too.
        with contextlib.suppress(OSError, ValueError):
            self._metrics.certificate_expiry.set(
                certs.certificate_expiry(Path(self.cert_file).read_bytes()).timestamp()
            )


class MirrorCA(_Watched):
    """The private CAs the health probes trust beside the system store (``--mirror-ca``):
    loaded at start (a ConfigError names a bad file), replaced when the file changes by a
    bundle that parses, the previous one kept otherwise. Subscribers hear of each change
    (the monitor probes again at once, with the new trust)."""

    def __init__(self, path: str, *, interval: float) -> None:
        self.path = path
        self.pem = read_bundle(path)
        self._subscribers: list[Callable[[], None]] = []
        self.watcher = filewatch.FileWatcher(
            [path], self.reload, interval=interval, name="mirror-ca"
        )

    def current(self) -> str:
        """The bundle in force, as PEM (one reference, replaced whole by a reload)."""
        return self.pem

    def subscribe(self, changed: Callable[[], None]) -> None:
        self._subscribers.append(changed)

    def reload(self) -> None:
        try:
            self.pem = read_bundle(self.path)
        except ConfigError as error:
            # Perhaps half written: the next poll retries, the previous bundle stays.
            logger.warning(
                "mirror CA bundle refused; the previous one stays in force",
                extra={"fields": {"error": str(error)}},
            )
            self.watcher.reset()
            return
        logger.info("mirror CA bundle reloaded", extra={"fields": {"file": self.path}})
        for changed in self._subscribers:
            changed()


def read_bundle(path: str) -> str:
    """The certificates of a PEM bundle, re-encoded: exactly what was checked is trusted."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"--mirror-ca {path}: cannot read: {error.strerror}") from None
    try:
        found = certs.load_certificates(data, what=f"--mirror-ca {path}")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return b"".join(map(certs.encode_certificate, found)).decode("ascii")
