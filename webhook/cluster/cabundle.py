"""mirrorgate's CA as the ``caBundle`` of every webhook of its two webhook configurations.

The MutatingWebhookConfiguration holds the Pod webhooks, the ValidatingWebhookConfiguration
of the same name the policy's (validating webhooks run after every mutating one, so what
they judge is what is stored). Both are kept in step with one CA and both are watched: a
replace-style apply (``kubectl replace``, ``helm upgrade --force``) stores a configuration
without ``caBundle``, and the API server then cannot verify mirrorgate until it is set
again, so a change to either wakes the check at once. A configuration that does not exist
(installed after the server, or an install from before the validating one) is not an
error: the next round sets it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.informer import Informer
from mirrorgate.webhook.logs import logger

__all__ = ["KINDS", "CABundles"]

KINDS = {
    "MutatingWebhookConfiguration": kube.webhook_configuration_path,
    "ValidatingWebhookConfiguration": kube.validating_webhook_configuration_path,
}
"""The two configurations named ``--webhook-config``, and where each lives."""


class CABundles:
    def __init__(self, client: kube.Kube, name: str, *, wake: Callable[[], None]) -> None:
        self.client, self.name, self._wake = client, name, wake
        self._bundle: str | None = None  # the caBundle (base64) last set or found set
        self.informers = [
            Informer(
                client,
                path(),
                name=f"webhook-configuration-{kind}",
                field_selector=f"metadata.name={name}",
                on_change=self._changed,
            )
            for kind, path in KINDS.items()
        ]

    def ensure(self, ca_pem: bytes) -> bool:
        """Set caBundle on every webhook of both configurations; True if any changed."""
        bundle = base64.b64encode(ca_pem).decode()
        changed = [self._ensure(kind, path(self.name), bundle) for kind, path in KINDS.items()]
        self._bundle = bundle
        return any(changed)

    def _ensure(self, kind: str, path: str, bundle: str) -> bool:
        for _ in range(3):
            try:
                configuration = self.client.get(path)
            except kube.NotFound:
                logger.warning(
                    "webhook configuration not found; caBundle not set yet",
                    extra={"fields": {"kind": kind, "name": self.name}},
                )
                return False
            webhooks = configuration.get("webhooks") or []
            operations = [
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                for i, webhook in enumerate(webhooks)
                if (webhook.get("clientConfig") or {}).get("caBundle") != bundle
            ]
            if not operations:
                return False
            # Guard on the version we read: after a concurrent edit (another
            # replica woken by the same change), whose failed test the API
            # server answers 422 Invalid, read again.
            version = (configuration.get("metadata") or {}).get("resourceVersion")
            try:
                self.client.patch(
                    path,
                    [
                        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                        *operations,
                    ],
                    patch_type="json",
                )
            except kube.KubeError as error:
                if error.status != 422:
                    raise
                continue
            logger.info(
                "caBundle updated",
                extra={
                    "fields": {
                        "kind": kind,
                        "webhookconfiguration": self.name,
                        "webhooks": len(operations),
                    }
                },
            )
            return True
        raise kube.KubeError(0, "Conflict", f"{kind} {self.name} kept changing under us")

    def _changed(self, kind: str, configuration: dict[str, Any]) -> None:
        """The informers' callback: wake the check when a webhook lost our caBundle."""
        if kind == "DELETED":
            return  # nothing to set; a new one comes as ADDED
        bundles = {
            (webhook.get("clientConfig") or {}).get("caBundle")
            for webhook in configuration.get("webhooks") or []
        }
        # Before any caBundle was set (None: the configuration came after us), any change.
        if bundles and (self._bundle is None or bundles != {self._bundle}):
            self._wake()

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
