"""Short-lived logins from provider plugins, kept current in the central store by the leader.

A policy credential with ``provider: NAME`` has no Secret written by a
person: the replica holding the Lease runs the plugin (off the admission
path) and writes the login into mirrorgate's namespace as an ordinary
credential-store Secret of the credential's name, labelled
``mirrorgate.io/provider`` and annotated with when it was issued and when it
expires. Every replica reads it through the Kubernetes store like any other
credential, so all of them hand out the same login, and a new one rotates the
namespaces' copies through the reconciler as any change of the store does.

The login is asked for again at 80 % of its lifetime. When the plugin fails,
the last good login stays in the store until it expires (admission refuses
an expired one, and then ``onCredentialError`` applies); the refresher tries
again every ``retry`` seconds meanwhile.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from mirrorgate import policy
from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.credentials.kubestore import (
    CREDENTIAL_LABEL,
    CREDENTIAL_LABEL_VALUE,
    EXPIRES_ANNOTATION,
    KubernetesCredentialStore,
    parse_expiry,
    secret_from_credential,
)
from mirrorgate.webhook.credentials.provider import REFRESH_AT, ProviderError, ProviderSource
from mirrorgate.webhook.credentials.store import Credential, StoreError, rfc3339
from mirrorgate.webhook.logs import logger

__all__ = ["ISSUED_ANNOTATION", "PROVIDER_LABEL", "ProviderRefresher", "probe_image"]

PROVIDER_LABEL = "mirrorgate.io/provider"
ISSUED_ANNOTATION = "mirrorgate.io/issued"

Observer = Callable[[str, str, "datetime.datetime | None"], Any]
"""(credential, outcome "refreshed" | "failed", expiry of the login in the store)."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def renew_at(issued: datetime.datetime, expires: datetime.datetime) -> datetime.datetime:
    """When a login issued at ``issued`` and expiring at ``expires`` is asked for again."""
    return issued + (expires - issued) * REFRESH_AT


def probe_image(mirror_policy: policy.Policy, credential: str) -> str | None:
    """The image a plugin is asked about for ``credential``: the first mirror that uses it."""
    for rule in mirror_policy.rules:
        if credential in rule.credentials:
            return str(rule.mirror)
    return None


class ProviderRefresher(Loop):
    def __init__(
        self,
        source: ProviderSource,
        client: kube.Kube,
        *,
        store: KubernetesCredentialStore,
        mirror_policy: Callable[[], policy.Policy],
        is_leader: Callable[[], bool],
        observe: Observer | None = None,
        retry: float = 5.0,
        clock: Callable[[], datetime.datetime] = _now,
    ) -> None:
        super().__init__("provider-refresher")
        self.source = source
        self.client = client
        self.store = store
        self.mirror_policy = mirror_policy
        self.is_leader = is_leader
        self.observe = observe or (lambda credential, outcome, expires: None)
        self.retry = retry
        self.clock = clock
        self._next: dict[str, datetime.datetime] = {}
        """When to ask again, by credential, as this replica decided it."""

    def _run(self) -> None:
        while not self.stopping:
            wait = self.retry
            if not self.is_leader():
                self._next.clear()  # another replica may refresh meanwhile
            elif self.store.informer.synced.is_set():
                try:
                    wait = self.refresh_due()
                except Exception:
                    logger.exception("credential refresh pass failed", extra={"fields": {}})
            self.sleep(max(wait, 0.05))

    def _published(self, name: str) -> dict[str, Any] | None:
        return self.store.informer.items.get((self.store.namespace, name))

    def due(self, name: str) -> datetime.datetime | None:
        """When the published login of ``name`` should be renewed; None: now."""
        secret = self._published(name)
        if secret is None:
            return None
        annotations = (secret.get("metadata") or {}).get("annotations") or {}
        try:
            issued = parse_expiry(str(annotations.get(ISSUED_ANNOTATION)), where=name)
            expires = parse_expiry(str(annotations.get(EXPIRES_ANNOTATION)), where=name)
        except StoreError:
            return None
        return renew_at(issued, expires)

    def refresh_due(self) -> float:
        """Renew every provider login that is due; seconds until the next one is."""
        mirror_policy, now = self.mirror_policy(), self.clock()
        wait = self.retry * 12
        for name, grant in mirror_policy.grants.items():
            image = probe_image(mirror_policy, name)
            if grant.provider is None or image is None:
                continue
            # What this replica last did decides while it leads; the published
            # annotations decide after a restart or a change of leader.
            due = self._next.get(name) or self.due(name)
            if due is None or now >= due:
                due = self.refresh(name, grant.provider, image)
            wait = min(wait, (due - now).total_seconds())
        return wait

    def refresh(self, name: str, provider: str, image: str) -> datetime.datetime:
        """Ask the plugin and publish the login (logged, observed); when to ask again."""
        current = self.store.snapshot().get(name)
        kept = current.expires if current is not None else None
        try:
            login = self.source.login(name, provider, image)
            self._publish(login, provider)
        except (ProviderError, kube.KubeError) as error:
            logger.warning(
                "credential refresh failed",
                extra={
                    "fields": {
                        "credential": name,
                        "provider": provider,
                        "reason": str(error),
                        "kept_until": rfc3339(kept) if kept else None,
                    }
                },
            )
            self.observe(name, "failed", kept)
            retry = self._next[name] = self.clock() + datetime.timedelta(seconds=self.retry)
            return retry
        assert login.expires is not None
        assert login.issued is not None
        logger.info(
            "credential refreshed",
            extra={
                "fields": {
                    "credential": name,
                    "provider": provider,
                    "registry": login.registry,
                    "expires": rfc3339(login.expires),
                }
            },
        )
        self.observe(name, "refreshed", login.expires)
        due = self._next[name] = renew_at(login.issued, login.expires)
        return due

    def _publish(self, login: Credential, provider: str) -> None:
        assert login.expires is not None
        assert login.issued is not None
        namespace = self.store.namespace
        body = secret_from_credential(
            login,
            namespace,
            login.name,
            labels={PROVIDER_LABEL: provider, CREDENTIAL_LABEL: CREDENTIAL_LABEL_VALUE},
            annotations={
                ISSUED_ANNOTATION: rfc3339(login.issued),
                EXPIRES_ANNOTATION: rfc3339(login.expires),
            },
        )
        existing = self._published(login.name)
        if existing is None:
            self.client.create(kube.secrets_path(namespace), body)
            return
        metadata = existing.get("metadata") or {}
        if PROVIDER_LABEL not in (metadata.get("labels") or {}):
            # A credential a person put there under this name: never overwritten.
            raise ProviderError(
                f"Secret {namespace}/{login.name} exists and was not made by "
                f"a provider refresh (no {PROVIDER_LABEL} label); not replacing "
                "it"
            )
        body["metadata"]["resourceVersion"] = metadata.get("resourceVersion")
        self.client.replace(kube.secrets_path(namespace, login.name), body)
