"""In-cluster certificates: mirrorgate keeps its own CA, serving certificate and caBundle healthy.

At start-up, and every ``check_interval`` seconds after, each replica makes
sure that the Secret ``--tls-secret`` holds a CA (with its key) and a serving
certificate for the Service that is not near expiry, creating or renewing
what is missing, expired or damaged; the serving files the server reads are
written from that Secret (and the server's certificate watcher picks them
up); and every webhook of the MutatingWebhookConfiguration carries that CA
as its ``caBundle``. That configuration is also watched: a replace-style
apply (``kubectl replace``, ``helm upgrade --force``) stores it without
``caBundle``, and the API server then cannot verify mirrorgate until it is
set again, so a change to it wakes the check at once.

The CA lives ten years while the leaf is renewed a month before its 90
days are up, so ``caBundle`` rarely changes. Replicas race safely: writes
carry the resourceVersion they read, and a replica that loses adopts what
the winner wrote.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mirrorgate import certs
from mirrorgate.certs import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY
from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.informer import Informer
from mirrorgate.webhook.logs import logger

__all__ = ["SelfManagedCertificates"]

RENEW_BEFORE = datetime.timedelta(days=30)
# The API server watches webhook configurations; give it this long to see a
# new caBundle before the certificate it must verify changes.
CA_SWITCH_GRACE = 2.0
CA_RENEW_BEFORE = datetime.timedelta(days=180)
# After a failed check, the next one comes this soon (not a whole interval
# later), then twice as late after each further failure.
RETRY_AFTER = 2.0
# The Secret's keys are the bundle's file names: the kubernetes.io/tls pair
# plus the CA and its key.


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class SelfManagedCertificates(Loop):
    def __init__(
        self,
        client: kube.Kube,
        *,
        namespace: str,
        secret: str,
        service: str,
        webhook_configuration: str | None,
        directory: Path,
        check_interval: float = 300.0,
        extra_names: Sequence[str] = (),
    ) -> None:
        super().__init__("self-certs")
        self.client = client
        self.namespace, self.secret, self.service = namespace, secret, service
        self.webhook_configuration = webhook_configuration
        self.directory = directory
        self.check_interval = check_interval
        dns, ips = certs.split_identities(extra_names)
        self.dns_names = [*certs.service_dns_names(service=service, namespace=namespace), *dns]
        self.ips = ips
        self.cert_file = directory / TLS_CERT
        self.key_file = directory / TLS_KEY
        self.problem: str | None = None
        self._bundle: str | None = None  # the caBundle (base64) last set or found set
        self.informer = (
            None
            if webhook_configuration is None
            else Informer(
                client,
                kube.webhook_configuration_path(),
                name="webhook-configuration",
                field_selector=f"metadata.name={webhook_configuration}",
                on_change=self._configuration_changed,
            )
        )

    # -- the Secret -------------------------------------------------------------------

    def _issue(self, authority: certs.CertificateAuthority) -> certs.KeyPair:
        return authority.issue_serving(dns_names=self.dns_names, ips=self.ips)

    def _covers(self, cert_pem: bytes) -> bool:
        names = certs.subject_alternative_names(cert_pem)
        return set(self.dns_names) | set(self.ips) <= names

    def _usable(self, data: dict[str, bytes]) -> str | None:
        """None when the Secret's contents can serve as they are, else what is wrong."""
        if any(key not in data for key in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)):
            return "incomplete"
        try:
            authority = certs.CertificateAuthority.load(
                cert_pem=data[CA_CERT], key_pem=data[CA_KEY]
            )
            leaf = certs.KeyPair(cert_pem=data[TLS_CERT], key_pem=data[TLS_KEY])
            if certs.certificate_expiry(authority.cert_pem) - CA_RENEW_BEFORE < _now():
                return "the CA is near expiry"
            if leaf.is_near_expiry(now=_now(), margin=RENEW_BEFORE):
                return "the serving certificate is near expiry or expired"
            if not self._covers(leaf.cert_pem):
                return "the serving certificate does not cover every name"
        except ValueError as error:
            return f"unreadable ({error})"
        return None

    def _contents(self, secret: dict[str, Any] | None) -> dict[str, bytes]:
        data = (secret or {}).get("data") or {}
        try:
            return {key: base64.b64decode(value) for key, value in data.items()}
        except ValueError:
            return {}

    def _renewed(self, data: dict[str, bytes], why: str) -> dict[str, bytes]:
        authority = None
        if why.startswith("the serving certificate"):
            # Keep the CA (and so caBundle); only the leaf is due.
            authority = certs.CertificateAuthority.load(
                cert_pem=data[CA_CERT], key_pem=data[CA_KEY]
            )
        authority = authority or certs.CertificateAuthority.generate(
            common_name=f"{self.service}.{self.namespace} CA"
        )
        leaf = self._issue(authority)
        return {
            CA_CERT: authority.cert_pem,
            CA_KEY: authority.key_pem,
            TLS_CERT: leaf.cert_pem,
            TLS_KEY: leaf.key_pem,
        }

    def _body(self, data: dict[str, bytes], resource_version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": self.secret,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/name": "mirrorgate"},
        }
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": metadata,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }

    def ensure_secret(self) -> dict[str, bytes]:
        """The Secret's contents, made usable first if they were not."""
        path = kube.secrets_path(self.namespace, self.secret)
        for _ in range(3):
            try:
                secret: dict[str, Any] | None = self.client.get(path)
            except kube.NotFound:
                secret = None
            data = self._contents(secret)
            why = self._usable(data) if secret is not None else "missing"
            if why is None:
                return data
            fresh = self._renewed(data, why)
            try:
                if secret is None:
                    self.client.create(kube.secrets_path(self.namespace), self._body(fresh, None))
                else:
                    version = (secret.get("metadata") or {}).get("resourceVersion")
                    self.client.replace(path, self._body(fresh, version))
            except (kube.AlreadyExists, kube.Conflict):
                continue  # another replica wrote first: adopt what it wrote
            logger.info(
                "serving certificate written",
                extra={"fields": {"secret": f"{self.namespace}/{self.secret}", "reason": why}},
            )
            return fresh
        raise kube.KubeError(
            0, "Conflict", f"Secret {self.namespace}/{self.secret} kept changing under us"
        )

    # -- files and caBundle -----------------------------------------------------------

    def write_files(self, data: dict[str, bytes]) -> None:
        if (
            self.cert_file.exists()
            and self.cert_file.read_bytes() == data[TLS_CERT]
            and self.key_file.read_bytes() == data[TLS_KEY]
        ):
            return
        # Key first: the watcher reloads on either change and retries a mismatch.
        certs.write_bundle(
            self.directory, ca_pem=data[CA_CERT], cert_pem=data[TLS_CERT], key_pem=data[TLS_KEY]
        )

    def ensure_ca_bundle(self, ca_pem: bytes) -> bool:
        """Set caBundle on every webhook of the configuration; True if it changed.

        A configuration that does not exist yet (installed after the server,
        or being re-applied) is not an error: the next round sets it.
        """
        if self.webhook_configuration is None:
            return False
        path = kube.webhook_configuration_path(self.webhook_configuration)
        bundle = base64.b64encode(ca_pem).decode()
        for _ in range(3):
            try:
                configuration = self.client.get(path)
            except kube.NotFound:
                logger.warning(
                    "webhook configuration not found; caBundle not set yet",
                    extra={"fields": {"name": self.webhook_configuration}},
                )
                return False
            webhooks = configuration.get("webhooks") or []
            operations = [
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                for i, webhook in enumerate(webhooks)
                if (webhook.get("clientConfig") or {}).get("caBundle") != bundle
            ]
            self._bundle = bundle
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
                        "webhookconfiguration": self.webhook_configuration,
                        "webhooks": len(operations),
                    }
                },
            )
            return True
        raise kube.KubeError(
            0,
            "Conflict",
            f"MutatingWebhookConfiguration {self.webhook_configuration} kept changing under us",
        )

    def reconcile(self) -> None:
        data = self.ensure_secret()
        served_ca = (
            (self.directory / CA_CERT).read_bytes() if (self.directory / CA_CERT).exists() else None
        )
        switched = served_ca is not None and served_ca != data[CA_CERT]
        if switched:
            # A new CA (the Secret was lost or its CA expired): trust both
            # while the served certificate changes, so that no API server
            # request meets a certificate its caBundle does not cover.
            assert served_ca is not None
            if self.ensure_ca_bundle(data[CA_CERT] + served_ca):
                self.pause(CA_SWITCH_GRACE)
        self.write_files(data)
        if switched:
            self.pause(CA_SWITCH_GRACE)  # the server's file watcher reloads meanwhile
        self.ensure_ca_bundle(data[CA_CERT])
        self.problem = None

    # -- the loop ---------------------------------------------------------------------

    def _configuration_changed(self, kind: str, configuration: dict[str, Any]) -> None:
        """The informer's callback: wake the check when a webhook lost our caBundle."""
        if kind == "DELETED":
            return  # nothing to set; a new one comes as ADDED
        bundles = {
            (webhook.get("clientConfig") or {}).get("caBundle")
            for webhook in configuration.get("webhooks") or []
        }
        # Before any caBundle was set (None: the configuration came after us), any change.
        if bundles and (self._bundle is None or bundles != {self._bundle}):
            self.trigger()

    def _run(self) -> None:
        wait, failures = self.check_interval, 0
        while True:
            self.sleep(wait)
            if self.stopping:
                return
            try:
                self.reconcile()
                wait, failures = self.check_interval, 0
            except (kube.KubeError, ValueError, OSError) as error:
                # The certificate in use keeps serving; the check is retried soon.
                self.problem = f"certificate upkeep failed: {error}"
                wait = min(RETRY_AFTER * 2**failures, self.check_interval)
                failures += 1
                logger.warning(
                    "certificate upkeep failed",
                    extra={"fields": {"error": str(error), "retry_in_s": wait}},
                )

    def start(self) -> None:
        super().start()
        if self.informer is not None:
            self.informer.start()

    def stop(self) -> None:
        super().stop()
        if self.informer is not None:
            self.informer.stop()
