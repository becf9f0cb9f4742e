"""In-cluster certificates: mirrorgate keeps its own CA, serving certificate and caBundle healthy.

At start-up, and every ``check_interval`` seconds after, each replica makes
sure that the Secret ``--ca-secret`` holds a CA (certificate and key) and the
Secret ``--tls-secret`` a serving certificate from that CA for the Service
that is not near expiry, creating or renewing what is missing, expired or
damaged; that the ConfigMap ``--ca-configmap`` publishes the CA certificate
(for Prometheus and anyone else who verifies mirrorgate: no key); that the
serving files the server reads are written from the TLS Secret (and the
server's certificate watcher picks them up); and that every webhook of its
two webhook configurations carries that CA as its ``caBundle``
(:mod:`.cabundle`, which also watches them).

The CA's key is in a Secret of its own: whoever may read the serving pair
or the CA certificate (a scraper, a sidecar) cannot mint a certificate the
API server trusts. Earlier versions kept it in the TLS Secret beside the
pair; such a CA is moved, not replaced (so caBundle stays), and its key is
removed from the TLS Secret once the CA Secret is :data:`LEGACY_KEY_GRACE`
old, so that replicas of the earlier version, which need it there, are gone.

The CA lives ten years while the leaf is renewed a month before its 90
days are up, so ``caBundle`` rarely changes. When it does (the CA Secret
deleted, damaged or near expiry), the replicas do not switch at once: each
serves a certificate from the old CA until its own check. So the CA Secret
keeps the old CA's certificate for a while, and ``caBundle`` and the
ConfigMap trust both until then (:mod:`.catrust`); each check sets
``caBundle`` before the serving certificate may change. Replicas race
safely: writes carry the resourceVersion they read, and a replica that
loses adopts what the winner wrote.
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
from mirrorgate.webhook.cluster import cabundle, catrust, kube
from mirrorgate.webhook.logs import logger

__all__ = ["SelfManagedCertificates"]

RENEW_BEFORE = datetime.timedelta(days=30)
# The API server watches webhook configurations; give it this long to see a
# new caBundle before the certificate it must verify changes.
CA_SWITCH_GRACE = 2.0
CA_RENEW_BEFORE = datetime.timedelta(days=180)
LEGACY_KEY_GRACE = datetime.timedelta(minutes=10)
"""How old the CA Secret must be before ``ca.key`` is removed from the TLS Secret."""
# After a failed check, the next one comes this soon (not a whole interval
# later), then twice as late after each further failure.
RETRY_AFTER = 2.0
_SECRET_LABELS = {"app.kubernetes.io/name": "mirrorgate"}
"""Not managed-by: the clean-up of what mirrorgate made (docs/install.md) keeps the CA,
which goes with the namespace."""
_CONFIGMAP_LABELS = {**_SECRET_LABELS, kube.MANAGED_BY_LABEL: "mirrorgate"}


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _decoded(obj: dict[str, Any] | None) -> dict[str, bytes]:
    data = (obj or {}).get("data") or {}
    try:
        return {key: base64.b64decode(value) for key, value in data.items()}
    except ValueError:
        return {}


def _older_than(obj: dict[str, Any], age: datetime.timedelta) -> bool:
    created = str((obj.get("metadata") or {}).get("creationTimestamp", ""))
    try:
        return datetime.datetime.fromisoformat(created) + age < _now()
    except ValueError:
        return False  # unreadable: taken for new


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
        ca_secret: str,
        ca_configmap: str,
        check_interval: float = 300.0,
        extra_names: Sequence[str] = (),
        legacy_key_grace: datetime.timedelta = LEGACY_KEY_GRACE,
    ) -> None:
        super().__init__("self-certs")
        self.client = client
        self.namespace, self.secret, self.service = namespace, secret, service
        self.ca_secret, self.ca_configmap = ca_secret, ca_configmap
        self.legacy_key_grace = legacy_key_grace
        self.webhook_configuration = webhook_configuration
        self.directory = directory
        self.check_interval = check_interval
        self.hold = catrust.overlap(check_interval)
        """How long a replaced CA stays trusted beside the new one."""
        dns, ips = certs.split_identities(extra_names)
        self.dns_names = [*certs.service_dns_names(service=service, namespace=namespace), *dns]
        self.ips = ips
        self.cert_file = directory / TLS_CERT
        self.key_file = directory / TLS_KEY
        self.problem: str | None = None
        self.bundles = (
            None
            if webhook_configuration is None
            else cabundle.CABundles(client, webhook_configuration, wake=self.trigger)
        )

    # -- the Secrets ------------------------------------------------------------------

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.client.get(path)
        except kube.NotFound:
            return None
        return found

    def _write(
        self, name: str, kind: str, found: dict[str, Any] | None, data: dict[str, bytes]
    ) -> None:
        """Create or replace (by the resourceVersion read) one of the two Secrets."""
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": _SECRET_LABELS,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": kind,
            "metadata": metadata,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        if found is None:
            self.client.create(kube.secrets_path(self.namespace), body)
            return
        metadata["resourceVersion"] = (found.get("metadata") or {}).get("resourceVersion")
        self.client.replace(kube.secrets_path(self.namespace, name), body)

    @staticmethod
    def _authority(data: dict[str, bytes]) -> tuple[certs.CertificateAuthority | None, str]:
        """The CA in ``data`` if it can serve on, else None and what is wrong."""
        if CA_CERT not in data or CA_KEY not in data:
            return None, "missing"
        try:
            authority = certs.CertificateAuthority.load(
                cert_pem=data[CA_CERT], key_pem=data[CA_KEY]
            )
        except ValueError as error:
            return None, f"unreadable ({error})"
        if certs.certificate_expiry(authority.cert_pem) - CA_RENEW_BEFORE < _now():
            return None, "the CA is near expiry"
        return authority, ""

    def ensure_ca(
        self, served: Sequence[bytes | None]
    ) -> tuple[certs.CertificateAuthority, dict[str, bytes], bool]:
        """The CA from ``--ca-secret``, made (or moved from the TLS Secret) first if need be.

        ``served`` are the CA certificates replicas may still serve from (the TLS
        Secret's, this replica's files): one that is not the CA stays trusted beside it
        for :attr:`hold`. Also the CA Secret's data, and whether the CA in it is old
        enough that the TLS Secret may lose an earlier version's copy of the key.
        """
        for _ in range(3):
            found = self._get(kube.secrets_path(self.namespace, self.ca_secret))
            current = _decoded(found)
            authority, why = self._authority(current)
            replaced: str | None = None  # why the CA changes, if it does
            serving = list(served)
            if authority is None:
                legacy = None
                if found is None:  # an earlier version's CA, beside the serving pair
                    legacy, _ = self._authority(
                        _decoded(self._get(kube.secrets_path(self.namespace, self.secret)))
                    )
                authority = legacy or certs.CertificateAuthority.generate(
                    common_name=f"{self.service}.{self.namespace} CA"
                )
                replaced = f"moved from Secret {self.secret}" if legacy else why
                # The old CA (if it is a certificate at all) joins what replicas serve.
                serving.insert(0, current.get(CA_CERT))
                base = {
                    **{k: v for k, v in current.items() if k in catrust.PREVIOUS_KEYS},
                    CA_CERT: authority.cert_pem,
                    CA_KEY: authority.key_pem,
                }
            else:
                base = current
            data = catrust.successor(base, served=serving, now=_now(), hold=self.hold)
            settled = replaced is None and _older_than(found or {}, self.legacy_key_grace)
            if data == current:
                return authority, data, settled
            try:
                self._write(self.ca_secret, "Opaque", found, data)
            except (kube.AlreadyExists, kube.Conflict):
                continue  # another replica wrote first: adopt what it wrote
            self._log_ca_written(data, replaced)
            return authority, data, settled
        raise kube.KubeError(
            0, "Conflict", f"Secret {self.namespace}/{self.ca_secret} kept changing under us"
        )

    def _log_ca_written(self, data: dict[str, bytes], replaced: str | None) -> None:
        fields: dict[str, object] = {"secret": f"{self.namespace}/{self.ca_secret}"}
        if catrust.PREVIOUS_UNTIL in data:
            fields["previous_ca_until"] = data[catrust.PREVIOUS_UNTIL].decode()
        if replaced is not None:
            logger.info("CA written", extra={"fields": {**fields, "reason": replaced}})
        elif catrust.PREVIOUS_CA in data:
            logger.info("previous CA trusted beside the CA", extra={"fields": fields})
        else:
            logger.info("previous CA no longer trusted", extra={"fields": fields})

    def _serving_problem(
        self, data: dict[str, bytes], authority: certs.CertificateAuthority
    ) -> str | None:
        """None when the serving pair can serve as it is, else what is wrong."""
        if TLS_CERT not in data or TLS_KEY not in data:
            return "incomplete"
        try:
            leaf = certs.KeyPair(cert_pem=data[TLS_CERT], key_pem=data[TLS_KEY])
            if data.get(CA_CERT) != authority.cert_pem or not authority.issued(leaf.cert_pem):
                return "the serving certificate is not from the CA"
            if leaf.is_near_expiry(now=_now(), margin=RENEW_BEFORE):
                return "the serving certificate is near expiry or expired"
            names = certs.subject_alternative_names(leaf.cert_pem)
            if not set(self.dns_names) | set(self.ips) <= names:
                return "the serving certificate does not cover every name"
        except ValueError as error:
            return f"unreadable ({error})"
        return None

    @staticmethod
    def _stale_key(data: dict[str, bytes], authority: certs.CertificateAuthority) -> bool:
        """Whether the TLS Secret holds a ``ca.key`` that is not the CA's: one an earlier
        version left there before the CA was replaced, never to sit beside the new one."""
        if CA_KEY not in data:
            return False
        try:
            certs.CertificateAuthority.load(cert_pem=authority.cert_pem, key_pem=data[CA_KEY])
        except ValueError:
            return True
        return False

    def ensure_secret(
        self, authority: certs.CertificateAuthority, *, strip: bool
    ) -> dict[str, bytes]:
        """The serving pair and CA certificate, made usable first if they were not.

        With ``strip``, an earlier version's copy of the CA's key leaves the TLS Secret.
        """
        path = kube.secrets_path(self.namespace, self.secret)
        for _ in range(3):
            secret = self._get(path)
            data = _decoded(secret)
            why = self._serving_problem(data, authority) if secret is not None else "missing"
            stale = self._stale_key(data, authority)
            if why is None and not (CA_KEY in data and (strip or stale)):
                return data
            if why is None:
                why = (
                    "a CA key that is not the CA's"
                    if stale
                    else f"the CA's key moved to Secret {self.ca_secret}"
                )
                leaf = certs.KeyPair(cert_pem=data[TLS_CERT], key_pem=data[TLS_KEY])
            else:
                leaf = authority.issue_serving(dns_names=self.dns_names, ips=self.ips)
            fresh = {CA_CERT: authority.cert_pem, TLS_CERT: leaf.cert_pem, TLS_KEY: leaf.key_pem}
            if CA_KEY in data and not strip and not stale:
                fresh[CA_KEY] = data[CA_KEY]  # still read by an earlier version's replicas
            try:
                self._write(self.secret, "kubernetes.io/tls", secret, fresh)
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

    def publish_ca(self, ca_pem: bytes) -> None:
        """Keep the CA certificates trusted (never a key) in ConfigMap ``--ca-configmap``."""
        path = kube.configmaps_path(self.namespace, self.ca_configmap)
        found = self._get(path)
        if found is not None and (found.get("data") or {}) == {CA_CERT: ca_pem.decode()}:
            return
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.ca_configmap,
                "namespace": self.namespace,
                "labels": _CONFIGMAP_LABELS,
            },
            "data": {CA_CERT: ca_pem.decode()},
        }
        if found is None:
            self.client.create(kube.configmaps_path(self.namespace), body)
        else:  # whichever replica writes last writes the same CAs
            self.client.replace(path, body)

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
        """Set caBundle on every webhook of both configurations; True if it changed."""
        return self.bundles is not None and self.bundles.ensure(ca_pem)

    def _read_served(self) -> list[bytes | None]:
        """The CAs replicas may be serving certificates from: the TLS Secret's (which
        every replica writes its files from) and this replica's own files'."""
        tls = _decoded(self._get(kube.secrets_path(self.namespace, self.secret)))
        own = self.directory / CA_CERT
        return [tls.get(CA_CERT), own.read_bytes() if own.exists() else None]

    def reconcile(self) -> None:
        served = self._read_served()
        authority, ca_data, settled = self.ensure_ca(served)
        trust = catrust.trusted(ca_data, now=_now())
        # Trust first: the serving certificate may change below, here or (through the
        # TLS Secret) in another replica, and the API server must know its CA by then.
        switching = any(ca is not None and ca != authority.cert_pem for ca in served)
        if self.ensure_ca_bundle(trust) and switching:
            self.pause(CA_SWITCH_GRACE)
        self.publish_ca(trust)
        data = self.ensure_secret(authority, strip=settled)
        self.write_files(data)
        self.problem = None

    # -- the loop ---------------------------------------------------------------------

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
        if self.bundles is not None:
            self.bundles.start()

    def stop(self) -> None:
        super().stop()
        if self.bundles is not None:
            self.bundles.stop()
