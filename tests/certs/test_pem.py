"""caBundle encoding and certificate expiry."""

from __future__ import annotations

import base64
from datetime import UTC, timedelta

import pytest

from mirrorgate.certs import CertificateAuthority, ca_bundle_b64, certificate_expiry


def test_ca_bundle_b64_decodes_back_to_pem_exactly(ca: CertificateAuthority) -> None:
    """Strict base64 decoding of caBundle gives back the PEM bytes, byte for byte."""
    encoded = ca_bundle_b64(ca.cert_pem)
    assert isinstance(encoded, str)
    assert "\n" not in encoded
    assert base64.b64decode(encoded, validate=True) == ca.cert_pem


def test_ca_bundle_b64_is_encoded_exactly_once(ca: CertificateAuthority) -> None:
    """One decode yields PEM, not more base64 (the double-encoding mistake)."""
    decoded = base64.b64decode(ca_bundle_b64(ca.cert_pem))
    assert decoded.startswith(b"-----BEGIN CERTIFICATE-----")


def test_ca_bundle_b64_accepts_several_cas(
    ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    """A bundle of CAs (as during rotation) encodes as a whole."""
    both = ca.cert_pem + other_ca.cert_pem
    assert base64.b64decode(ca_bundle_b64(both)) == both


@pytest.mark.parametrize("kind", ["already-encoded", "private-key", "empty"])
def test_ca_bundle_b64_rejects_non_certificates(ca: CertificateAuthority, kind: str) -> None:
    """Input that is not PEM certificates raises instead of producing a useless caBundle."""
    data = {
        "already-encoded": ca_bundle_b64(ca.cert_pem).encode(),
        "private-key": ca.key_pem,
        "empty": b"",
    }[kind]
    with pytest.raises(ValueError, match="CA bundle: no PEM certificate found"):
        ca_bundle_b64(data)


def test_certificate_expiry(ca: CertificateAuthority) -> None:
    """certificate_expiry returns the aware UTC notAfter of a leaf."""
    leaf = ca.issue_serving(dns_names=["a.x"], valid_for=timedelta(days=7))
    expiry = certificate_expiry(leaf.cert_pem)
    assert expiry.tzinfo is UTC
    assert expiry == leaf.not_valid_after


def test_certificate_expiry_rejects_garbage() -> None:
    """Non-certificate input raises ValueError."""
    with pytest.raises(ValueError, match="no PEM certificate found"):
        certificate_expiry(b"junk")
