"""``generate_bundle``: the one call behind ``mirrorgate certs generate``.

Re-running it must not silently change the CA: the CA certificate is pasted
into the webhook configuration's ``caBundle``, and a new CA would break the
API server's trust in the webhook until that is updated too. So an existing
``ca.crt``/``ca.key`` pair in the output directory is reused while it is
valid, and only the serving certificate is reissued.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from mirrorgate.certs._clock import resolve_now
from mirrorgate.certs.authority import CertificateAuthority, KeyPair
from mirrorgate.certs.files import CA_CERT, CA_KEY, write_bundle
from mirrorgate.certs.names import service_dns_names
from mirrorgate.certs.pem import certificate_expiry

__all__ = ["generate_bundle"]


def generate_bundle(
    *,
    service: str,
    namespace: str,
    out: Path,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    now: datetime | None = None,
) -> KeyPair:
    """Write a CA and a serving certificate for a Service into ``out``; return the leaf.

    The leaf covers the four in-cluster names of ``service`` in ``namespace``
    plus the extra ``dns`` names and ``ips``. The CA in ``out`` is reused if
    both its files exist and it is currently valid; an expired CA is replaced
    (the ``caBundle`` must then be updated). ``ca.key`` is written next to the
    serving files so the next run can reuse the CA: do not mount it into the
    webhook Pod.

    Raises:
        ValueError: if a name or IP is invalid, or the existing CA files are
            unusable (corrupt, mismatched, only one of the pair present): the
            CA is never overwritten unless it has expired.
    """
    now = resolve_now(now)
    dns_names = [*service_dns_names(service=service, namespace=namespace), *dns]
    ca = _existing_ca(out, now=now) or CertificateAuthority.generate(now=now)
    leaf = ca.issue_serving(dns_names=dns_names, ips=ips, now=now)
    write_bundle(
        out, ca_pem=ca.cert_pem, cert_pem=leaf.cert_pem, key_pem=leaf.key_pem, ca_key_pem=ca.key_pem
    )
    return leaf


def _existing_ca(out: Path, *, now: datetime) -> CertificateAuthority | None:
    cert_path, key_path = out / CA_CERT, out / CA_KEY
    present = [path for path in (cert_path, key_path) if path.exists()]
    if not present:
        return None
    if len(present) == 1:
        missing = key_path if present[0] == cert_path else cert_path
        raise ValueError(
            f"{present[0]} exists but {missing} does not; restore it or remove both "
            "to generate a new CA"
        )
    try:
        ca = CertificateAuthority.load(
            cert_pem=cert_path.read_bytes(), key_pem=key_path.read_bytes()
        )
    except ValueError as exc:
        raise ValueError(f"existing CA in {out} is unusable: {exc}") from exc
    if now >= certificate_expiry(ca.cert_pem):
        return None
    return ca
