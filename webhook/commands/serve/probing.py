"""serve's mirror health: the background probes, and the mirror CA bundle they trust."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from mirrorgate import policy
from mirrorgate.webhook.background import Manager
from mirrorgate.webhook.commands.serve import reloaders
from mirrorgate.webhook.commands.serve.policies import ServedPolicy
from mirrorgate.webhook.commands.serve.settings import Settings
from mirrorgate.webhook.credentials import store as credentials
from mirrorgate.webhook.edge import app
from mirrorgate.webhook.mirrorhealth import monitor

__all__ = ["mirror_health"]


def mirror_health(
    settings: Settings,
    store: credentials.CredentialStore | None,
    served: ServedPolicy,
    runtime: app.Runtime,
    components: Manager,
) -> monitor.HealthMonitor:
    """The background probes, publishing into the runtime what admission reads; with
    ``--mirror-ca``, the bundle's reloader too, which probes again when it changes."""
    mirror_ca = None
    if settings.mirror_ca is not None:
        mirror_ca = reloaders.MirrorCA(settings.mirror_ca, interval=settings.reload_interval)
        components.add("mirror-ca", mirror_ca)

    def snapshot() -> Mapping[str, credentials.Credential] | None:
        assert store is not None
        return store.snapshot() if store.problem() is None else None

    health_monitor = monitor.HealthMonitor(
        mirror_policy=served.current,
        credentials=snapshot if store else None,
        publish=functools.partial(_publish_health, runtime),
        metrics=runtime.metrics,
        probe=settings.health_probes,
        mirror_ca=mirror_ca.current if mirror_ca else None,
        team_rules=served.team_rules,
    )
    if mirror_ca is not None:
        mirror_ca.subscribe(health_monitor.trigger)
    # What admission reads before the first round: UNPROBED without probes.
    _publish_health(runtime, health_monitor.health)
    if store is not None:
        store.subscribe(health_monitor.trigger)
    return health_monitor


def _publish_health(runtime: app.Runtime, value: policy.Health) -> None:
    runtime.health = value  # one reference swap: admission reads it without a lock
