"""The background health of mirrors and credentials, published to admission as a value.

A thread probes, once per ``health.interval`` (start to start), every mirror
host the policies in force name (``GET /v2/``: the cluster's, and those the
namespaces' MirrorPolicies add, up to a cap: :mod:`.targets`) and, where the
host is up, logs in with every credential the policies use on it. Consecutive results move each
target between up and down by the policy's thresholds; the first result for
a target decides at once. Whenever the conclusion changes, a new
:class:`policy.Health` is handed to ``publish``: admission reads that value
from memory and never waits for a probe.

Configuration problems need no probing and count at once: a policy
credential missing from the store, or for another registry host than its
mirror's, is reported and treated like a credential that cannot log in.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import ssl
import time
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType

from mirrorgate import policy
from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.logs import logger
from mirrorgate.webhook.mirrorhealth import probes
from mirrorgate.webhook.mirrorhealth.targets import (
    MAX_TEAM_HOSTS,
    Targets,
    TeamRules,
    Transport,
    credential_problems,
    probed_targets,
)

__all__ = ["HealthMonitor", "credential_problems", "probe_mirrors"]

MAX_PROBE_THREADS = 8
UNPROBED_SHOWN = 5
"""Hosts past the cap that the warning and /readyz name (the count says how many more)."""


def probe_mirrors(mirror_policy: policy.Policy, hosts: Collection[str]) -> policy.Health:
    """One probe of each mirror host in ``hosts``, at once: for commands, not for the server."""
    transports = {rule.mirror.host: Transport.of(rule) for rule in mirror_policy.rules}

    def probe(host: str) -> probes.Answer:
        try:
            context = transports.get(host, Transport()).context()
        except ValueError as error:
            return probes.Answer(False, str(error))
        return probes.check_mirror(host, context=context, timeout=mirror_policy.health.timeout)

    with concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, min(MAX_PROBE_THREADS, len(hosts)))
    ) as pool:
        answers = dict(zip(hosts, pool.map(probe, hosts), strict=True))
    return policy.Health(down={host: a.reason for host, a in answers.items() if not a.ok})


def _past_the_cap(unprobed: Mapping[str, tuple[str, ...]], cap: int) -> str:
    """Which hosts past the cap are not probed, and what that means for their rules."""
    shown = sorted(unprobed)[:UNPROBED_SHOWN]
    more = len(unprobed) - len(shown)
    named = ", ".join(
        f"{host} ({', '.join(unprobed[host][:3])}{', ...' if len(unprobed[host]) > 3 else ''})"
        for host in shown
    )
    return (
        f"{len(unprobed):,} mirror host{'s' if len(unprobed) != 1 else ''} of MirrorPolicies "
        f"past the cap of {cap} more than the cluster's: {named}"
        f"{f' and {more:,} more' if more else ''}; not probed, so their rules rewrite as if "
        "the mirror were up (no failover, no fallback while it is down)"
    )


@dataclasses.dataclass
class _Track:
    """One target's state between probes: up (True), down (False) or not yet known (None)."""

    up: bool | None = None
    streak: int = 0
    """Consecutive results that disagree with ``up``."""
    reason: str = ""

    def observe(self, ok: bool, reason: str, settings: policy.HealthSettings) -> bool:
        """Count one result; True when it changes ``up``."""
        if ok == self.up:
            self.streak = 0
            if not ok:
                self.reason = reason
            return False
        self.streak += 1
        needed = settings.success_threshold if ok else settings.failure_threshold
        if self.up is None or self.streak >= needed:
            self.up, self.streak, self.reason = ok, 0, reason
            return True
        return False


class HealthMonitor(Loop):
    """Probes in a thread of its own; ``publish`` receives every new health value.

    ``credentials`` is the store's current snapshot, or None while the store
    cannot be read (not synced yet): credentials then keep their last state.
    Without a store at all (``credentials`` None), no credential is checked.
    ``probe`` false checks the configuration only and makes no network call.
    ``team_rules`` gives the namespaces' own rules (a cluster's MirrorPolicies), whose
    mirrors are probed beside the cluster's ``mirror_policy`` (up to ``cap`` hosts more).
    """

    def __init__(
        self,
        *,
        mirror_policy: Callable[[], policy.Policy],
        credentials: Callable[[], Mapping[str, Credential] | None] | None,
        publish: Callable[[policy.Health], None],
        metrics: Metrics,
        probe: bool = True,
        mirror_ca: Callable[[], str] | None = None,
        team_rules: Callable[[], TeamRules] | None = None,
        cap: int = MAX_TEAM_HOSTS,
    ) -> None:
        # Stopping waits for the round in hand (at most two probe timeouts).
        super().__init__("mirrorgate-health", stop_timeout=30)
        self._mirror_policy, self._credentials = mirror_policy, credentials
        self._publish, self._metrics, self._probe = publish, metrics, probe
        self._mirror_ca = mirror_ca
        self._team_rules, self._cap = team_rules, cap
        self._unprobed: Mapping[str, tuple[str, ...]] = {}
        self._hosts: dict[str, _Track] = {}
        self._logins: dict[str, _Track] = {}
        self._misconfigured: Mapping[str, str] = {}
        # Without probes nothing is known to be up, and the audit says so.
        self._well = policy.HEALTHY if probe else policy.UNPROBED
        self._health = self._well
        self._contexts: dict[Transport, tuple[int, ssl.SSLContext | None]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=MAX_PROBE_THREADS, thread_name_prefix="mirrorgate-probe"
        )

    @property
    def health(self) -> policy.Health:
        return self._health

    def stop(self) -> None:
        super().stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def problems(self) -> Mapping[str, str]:
        """What /readyz lists: down mirrors and credentials that cannot serve, with why."""
        health = self._health  # one value, replaced whole by the probe thread
        found = {
            **{f"mirror {host}": f"down: {why}" for host, why in sorted(health.down.items())},
            **{f"credential {name}": why for name, why in sorted(health.failing.items())},
        }
        unprobed = self._unprobed  # replaced whole by the probe thread
        if unprobed:
            found["mirror probes"] = _past_the_cap(unprobed, self._cap)
        return found

    def _run(self) -> None:
        while not self.stopping:
            started = time.monotonic()
            settings = self._mirror_policy().health
            try:
                self.probe_round()
            except Exception:  # a bug of ours must not end probing for the process's life
                logger.exception("health probe round failed", extra={"fields": {}})
            # Start to start, so that an outage is seen within
            # failureThreshold × interval + timeout, however long a round took.
            self.sleep(max(0.0, started + settings.interval - time.monotonic()))

    def probe_round(self) -> None:
        """Probe every target once, then publish what changed (also callable directly)."""
        mirror_policy = self._mirror_policy()
        settings = mirror_policy.health
        snapshot = self._credentials() if self._credentials is not None else None
        targets = probed_targets(
            mirror_policy,
            snapshot or {},
            self._team_rules() if self._team_rules is not None else None,
            cap=self._cap,
        )
        if snapshot is None:
            # No store (nothing to check), or one not readable yet (credentials
            # keep the state they had): no login, no verdict on the configuration.
            known = self._misconfigured if self._credentials is not None else {}
            targets = dataclasses.replace(targets, logins={}, misconfigured=known)
        self._forget(targets, logins=snapshot is not None or self._credentials is None)
        self._note_misconfigured(targets.misconfigured)
        self._note_unprobed(targets.unprobed)
        if self._probe:
            self._probe_targets(targets, snapshot, settings)
        self._conclude(targets)

    def _probe_targets(
        self,
        targets: Targets,
        snapshot: Mapping[str, Credential] | None,
        settings: policy.HealthSettings,
    ) -> None:
        """Every mirror at once, then every login on a mirror that is up, at once.

        A round takes about two timeouts however many targets there are (up
        to the pool's size), so rounds keep to their interval.
        """
        contexts: dict[str, ssl.SSLContext | None] = {}
        mirrors: dict[str, concurrent.futures.Future[probes.Answer]] = {}
        for host, transport in targets.hosts.items():
            try:
                contexts[host] = self._context(transport)
            except ValueError as error:
                self._observe(self._hosts, host, "mirror", False, str(error), settings)
                continue
            mirrors[host] = self._pool.submit(
                probes.check_mirror, host, context=contexts[host], timeout=settings.timeout
            )
        up = set()
        for host, future in mirrors.items():
            answer = future.result()
            self._observe(self._hosts, host, "mirror", answer.ok, answer.reason, settings)
            if answer.ok:
                up.add(host)
        logins = {
            name: self._pool.submit(
                probes.check_login,
                host,
                credential.username,
                credential.password,
                repository=repository,
                context=contexts[host],
                timeout=settings.timeout,
            )
            for name, (host, repository) in targets.logins.items()
            if host in up
            and snapshot is not None
            and (credential := snapshot.get(name)) is not None
        }
        for name, login_future in logins.items():
            login = login_future.result()
            if login.verdict != "unknown":  # no answer says nothing of the credential
                self._observe(
                    self._logins,
                    name,
                    "credential",
                    login.verdict == "valid",
                    login.reason,
                    settings,
                )

    def _context(self, transport: Transport) -> ssl.SSLContext | None:
        """A TLS context per transport (None: plain HTTP), made again when its CA file changes.

        Loading a trust store parses every certificate in it: once per change, not per probe.
        The system store (or ``SSL_CERT_FILE``) is fixed for the process's life; the
        ``--mirror-ca`` bundle added to it is read as its reloader has it now.
        """
        ca_file = transport.ca_file
        mirror_ca = self._mirror_ca() if self._mirror_ca and ca_file is None else None
        try:
            stamp = os.stat(ca_file).st_mtime_ns if ca_file is not None else hash(mirror_ca)
        except OSError as error:
            raise ValueError(f"cannot read caFile {ca_file!r}: {error.strerror}") from None
        found = self._contexts.get(transport)
        if found is None or found[0] != stamp:
            found = self._contexts[transport] = (stamp, transport.context(mirror_ca))
        return found[1]

    def _observe(
        self,
        tracks: dict[str, _Track],
        name: str,
        kind: str,
        ok: bool,
        reason: str,
        settings: policy.HealthSettings,
    ) -> None:
        track = tracks.setdefault(name, _Track())
        first = track.up is None
        if not track.observe(ok, reason, settings):
            return
        if first and ok:
            return  # up from the start is not news
        words = {
            ("mirror", True): "mirror up",
            ("mirror", False): "mirror down",
            ("credential", True): "credential logs in",
            ("credential", False): "credential cannot log in",
        }[(kind, ok)]
        fields = {kind: name, "reason": reason}
        if ok:
            logger.info(words, extra={"fields": fields})
        else:
            logger.warning(words, extra={"fields": fields})

    def _note_misconfigured(self, misconfigured: Mapping[str, str]) -> None:
        for name, why in misconfigured.items():
            if self._misconfigured.get(name) != why:
                logger.warning(
                    "credential cannot serve its mirror",
                    extra={"fields": {"credential": name, "reason": why}},
                )
        for name in self._misconfigured.keys() - misconfigured.keys():
            logger.info("credential configuration fixed", extra={"fields": {"credential": name}})
        self._misconfigured = dict(misconfigured)

    def _note_unprobed(self, unprobed: Mapping[str, tuple[str, ...]]) -> None:
        if unprobed.keys() != self._unprobed.keys() and unprobed:
            logger.warning(
                "mirror hosts of MirrorPolicies past the probes' cap are not probed",
                extra={"fields": {"why": _past_the_cap(unprobed, self._cap)}},
            )
        self._unprobed = dict(unprobed)
        self._metrics.mirror_hosts_unprobed.set(len(unprobed))

    def _forget(self, targets: Targets, *, logins: bool) -> None:
        """Drop targets the policy no longer names (after a reload)."""
        pairs: list[tuple[dict[str, _Track], Collection[str]]] = [
            (self._hosts, targets.hosts.keys())
        ]
        if logins:
            pairs.append((self._logins, targets.logins.keys()))
        for tracks, keep in pairs:
            for name in tracks.keys() - keep:
                del tracks[name]
        for transport in self._contexts.keys() - set(targets.hosts.values()):
            del self._contexts[transport]

    def _conclude(self, targets: Targets) -> None:
        down = {host: t.reason for host, t in self._hosts.items() if t.up is False}
        failing = {name: t.reason for name, t in self._logins.items() if t.up is False}
        failing.update(targets.misconfigured)
        # Only targets probed at least once: a gauge that says 1 must have been seen up.
        up = {
            mirror: self._hosts[host].up is True
            for mirror, host in targets.mirrors.items()
            if host in self._hosts and self._hosts[host].up is not None
        }
        valid = {name: t.up is True for name, t in self._logins.items() if t.up is not None}
        valid.update(dict.fromkeys(targets.misconfigured, False))
        self._metrics.set_health(mirror_up=up, credential_valid=valid)
        # All well is always the one HEALTHY (or UNPROBED) value, whatever came before.
        health = (
            policy.Health(
                down=MappingProxyType(down), failing=MappingProxyType(failing), probed=self._probe
            )
            if down or failing
            else self._well
        )
        if (health.down, health.failing) != (self._health.down, self._health.failing):
            self._health = health
            self._publish(health)
