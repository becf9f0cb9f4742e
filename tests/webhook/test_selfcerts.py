"""The self-managed certificates' decisions that need no cluster (webhook/cluster/selfcerts.py;
the rest runs against the API server in tests/e2e/api/test_certificates.py)."""

from __future__ import annotations

from mirrorgate.certs import CA_CERT, CA_KEY, CertificateAuthority
from mirrorgate.webhook.cluster.selfcerts import SelfManagedCertificates


def test_an_earlier_versions_ca_key_beside_another_ca_is_stale(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    """An earlier version's ca.key in the TLS Secret stays only beside its own CA."""
    legacy = {CA_CERT: ca.cert_pem, CA_KEY: other_ca.key_pem}
    assert SelfManagedCertificates._stale_key(legacy, ca)
    assert not SelfManagedCertificates._stale_key(legacy | {CA_KEY: ca.key_pem}, ca)
    assert not SelfManagedCertificates._stale_key({CA_CERT: ca.cert_pem}, ca)
