"""CertificateAuthority and KeyPair: certificate contents, lifetimes, loading, reprs."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mirrorgate.certs import CLOCK_SKEW, CertificateAuthority, KeyPair, service_dns_names

_E = TypeVar("_E", bound=x509.ExtensionType)

# Whole seconds: X.509 times have no fractions, so comparisons stay exact.
NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _ext(cert: x509.Certificate, kind: type[_E]) -> x509.Extension[_E]:
    return cert.extensions.get_extension_for_class(kind)


def _key_body(pem: bytes) -> bytes:
    # The base64 lines between the armour: what must never leak.
    return b"".join(pem.strip().splitlines()[1:-1])


@pytest.fixture(scope="module")
def fixed_ca() -> CertificateAuthority:
    """A CA created at NOW, valid for one year."""
    return CertificateAuthority.generate(valid_for=timedelta(days=365), now=NOW)


def test_ca_extensions(fixed_ca: CertificateAuthority) -> None:
    """The CA has critical BasicConstraints(ca, path_length=0), critical KeyUsage and an SKI."""
    cert = _cert(fixed_ca.cert_pem)
    constraints = _ext(cert, x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value == x509.BasicConstraints(ca=True, path_length=0)
    usage = _ext(cert, x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign
    assert usage.value.crl_sign
    assert not usage.value.digital_signature
    assert _ext(cert, x509.SubjectKeyIdentifier).value == x509.SubjectKeyIdentifier.from_public_key(
        cert.public_key()
    )
    assert cert.subject == cert.issuer
    assert cert.subject.rfc4514_string() == "CN=mirrorgate-ca"


def test_ca_validity_window(fixed_ca: CertificateAuthority) -> None:
    """The CA is backdated by the skew allowance and lasts valid_for from now."""
    cert = _cert(fixed_ca.cert_pem)
    assert cert.not_valid_before_utc == NOW - CLOCK_SKEW
    assert cert.not_valid_after_utc == NOW + timedelta(days=365)


def test_keys_are_p256_pkcs8(fixed_ca: CertificateAuthority) -> None:
    """CA and leaf keys are unencrypted PKCS#8 PEM holding ECDSA P-256 keys."""
    leaf = fixed_ca.issue_serving(dns_names=["a.example"], now=NOW)
    for pem in (fixed_ca.key_pem, leaf.key_pem):
        assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")
        key = serialization.load_pem_private_key(pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert isinstance(key.curve, ec.SECP256R1)


def test_serving_leaf_extensions(fixed_ca: CertificateAuthority) -> None:
    """A serving leaf is a signed non-CA with digitalSignature, serverAuth, AKI and SKI."""
    ca_cert = _cert(fixed_ca.cert_pem)
    cert = _cert(fixed_ca.issue_serving(dns_names=["a.example"], now=NOW).cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    constraints = _ext(cert, x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value == x509.BasicConstraints(ca=False, path_length=None)
    usage = _ext(cert, x509.KeyUsage).value
    assert usage.digital_signature
    assert not usage.key_encipherment
    assert not usage.key_cert_sign
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    aki = _ext(cert, x509.AuthorityKeyIdentifier).value
    ski = _ext(ca_cert, x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    assert cert.issuer == ca_cert.subject


def test_serving_san_for_service_names(fixed_ca: CertificateAuthority) -> None:
    """The SAN lists every Service name and the IPs; the CN is the first name."""
    names = service_dns_names(service="mirrorgate", namespace="infra")
    cert = _cert(fixed_ca.issue_serving(dns_names=names, ips=["10.0.0.7", "::1"], now=NOW).cert_pem)
    san = _ext(cert, x509.SubjectAlternativeName)
    assert not san.critical
    assert san.value.get_values_for_type(x509.DNSName) == [
        "mirrorgate",
        "mirrorgate.infra",
        "mirrorgate.infra.svc",
        "mirrorgate.infra.svc.cluster.local",
    ]
    assert san.value.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.7"),
        ipaddress.ip_address("::1"),
    ]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "mirrorgate"


def test_serving_cn_falls_back_to_ip(fixed_ca: CertificateAuthority) -> None:
    """With only IPs, the CN is the first IP."""
    cert = _cert(fixed_ca.issue_serving(ips=["127.0.0.1"], now=NOW).cert_pem)
    assert cert.subject.rfc4514_string() == "CN=127.0.0.1"


def test_serving_duplicates_are_dropped(fixed_ca: CertificateAuthority) -> None:
    """Repeated names and IPs appear once in the SAN."""
    cert = _cert(
        fixed_ca.issue_serving(dns_names=["a.x", "a.x"], ips=["::1", "::1"], now=NOW).cert_pem
    )
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert len(list(san)) == 2


def test_serving_empty_subject_marks_san_critical(fixed_ca: CertificateAuthority) -> None:
    """When no identity fits in a CN the subject is empty and the SAN critical (RFC 5280)."""
    cert = _cert(fixed_ca.issue_serving(dns_names=["a" * 63 + ".b"], now=NOW).cert_pem)
    assert len(cert.subject) == 0
    assert _ext(cert, x509.SubjectAlternativeName).critical


def test_client_leaf(fixed_ca: CertificateAuthority) -> None:
    """A client leaf has CN and O in the subject, clientAuth EKU and no SAN."""
    pair = fixed_ca.issue_client(common_name="alice", organizations=["dev", "ops"], now=NOW)
    cert = _cert(pair.cert_pem)
    cert.verify_directly_issued_by(_cert(fixed_ca.cert_pem))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["alice"]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "dev",
        "ops",
    ]
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_serial_numbers_are_random(fixed_ca: CertificateAuthority) -> None:
    """Two leaves for the same names get different serial numbers."""
    serials = {
        _cert(fixed_ca.issue_serving(dns_names=["a.x"], now=NOW).cert_pem).serial_number
        for _ in range(3)
    }
    assert len(serials) == 3


def test_leaf_validity_window(fixed_ca: CertificateAuthority) -> None:
    """A leaf is backdated by the skew allowance and lasts valid_for."""
    pair = fixed_ca.issue_serving(dns_names=["a.x"], valid_for=timedelta(days=30), now=NOW)
    assert pair.not_valid_before == NOW - CLOCK_SKEW
    assert pair.not_valid_after == NOW + timedelta(days=30)
    assert pair.not_valid_after.tzinfo is UTC


def test_leaf_never_outlives_ca(fixed_ca: CertificateAuthority) -> None:
    """A leaf asked to outlive the CA is clamped to the CA's notAfter."""
    ca_expiry = _cert(fixed_ca.cert_pem).not_valid_after_utc
    late = ca_expiry - timedelta(days=10)
    serving = fixed_ca.issue_serving(dns_names=["a.x"], valid_for=timedelta(days=90), now=late)
    client = fixed_ca.issue_client(common_name="c", valid_for=timedelta(days=90), now=late)
    assert serving.not_valid_after == ca_expiry
    assert client.not_valid_after == ca_expiry


def test_expired_ca_refuses_to_issue(fixed_ca: CertificateAuthority) -> None:
    """Issuing at or after the CA's expiry is an error that names the expiry."""
    after = _cert(fixed_ca.cert_pem).not_valid_after_utc
    with pytest.raises(ValueError, match=r"expired at 2031-06-01"):
        fixed_ca.issue_serving(dns_names=["a.x"], now=after)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "at least one DNS name or IP"),
        ({"dns_names": ["bad_name.example"]}, "'bad_name.example'"),
        ({"dns_names": ["10.0.0.1"]}, "is an IP address"),
        ({"ips": ["10.0.0.256"]}, "'10.0.0.256' is not a valid IPv4 or IPv6"),
        ({"ips": ["localhost"]}, "'localhost' is not a valid"),
        ({"dns_names": ["a.x"], "valid_for": timedelta(0)}, "valid_for must be positive"),
    ],
)
def test_issue_serving_rejects_bad_input(
    fixed_ca: CertificateAuthority, kwargs: dict[str, object], message: str
) -> None:
    """Invalid identities or lifetimes raise ValueError naming the problem."""
    with pytest.raises(ValueError, match=message):
        fixed_ca.issue_serving(now=NOW, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "x" * 65])
def test_issue_client_rejects_bad_common_name(fixed_ca: CertificateAuthority, name: str) -> None:
    """An empty or over-long client CN raises ValueError naming common_name."""
    with pytest.raises(ValueError, match="common_name"):
        fixed_ca.issue_client(common_name=name, now=NOW)


def test_naive_now_is_rejected() -> None:
    """A naive datetime for now raises instead of being read as local time."""
    with pytest.raises(ValueError, match="timezone-aware"):
        CertificateAuthority.generate(now=datetime(2030, 1, 1))


def test_is_near_expiry(fixed_ca: CertificateAuthority) -> None:
    """is_near_expiry is true once now + margin reaches notAfter, and when expired."""
    pair = fixed_ca.issue_serving(dns_names=["a.x"], valid_for=timedelta(days=90), now=NOW)
    margin = timedelta(days=30)
    assert not pair.is_near_expiry(now=NOW, margin=margin)
    assert not pair.is_near_expiry(now=NOW + timedelta(days=59, hours=23), margin=margin)
    assert pair.is_near_expiry(now=NOW + timedelta(days=60), margin=margin)
    assert pair.is_near_expiry(now=NOW + timedelta(days=91), margin=timedelta(0))
    with pytest.raises(ValueError, match="timezone-aware"):
        pair.is_near_expiry(now=datetime(2030, 1, 1), margin=margin)
    with pytest.raises(ValueError, match="margin must not be negative"):
        pair.is_near_expiry(now=NOW, margin=-margin)


def test_reprs_hold_no_key_material(fixed_ca: CertificateAuthority) -> None:
    """repr() and str() of KeyPair and CertificateAuthority never show a private key."""
    pair = fixed_ca.issue_serving(dns_names=["a.x"], now=NOW)
    for obj, key_pem in ((pair, pair.key_pem), (fixed_ca, fixed_ca.key_pem)):
        for text in (repr(obj), str(obj)):
            assert "PRIVATE KEY" not in text
            assert _key_body(key_pem).decode() not in text
            for line in key_pem.splitlines()[1:-1]:
                assert line.decode() not in text
    assert "CN=mirrorgate-ca" in repr(fixed_ca)


def test_keypair_is_frozen_value(fixed_ca: CertificateAuthority) -> None:
    """KeyPair is immutable and compares by value."""
    pair = fixed_ca.issue_serving(dns_names=["a.x"], now=NOW)
    assert KeyPair(cert_pem=pair.cert_pem, key_pem=pair.key_pem) == pair
    with pytest.raises(AttributeError):
        pair.key_pem = b""  # type: ignore[misc]


def test_load_round_trip(fixed_ca: CertificateAuthority) -> None:
    """load() of generated PEM gives back the same PEM."""
    loaded = CertificateAuthority.load(cert_pem=fixed_ca.cert_pem, key_pem=fixed_ca.key_pem)
    assert loaded.cert_pem == fixed_ca.cert_pem
    assert loaded.key_pem == fixed_ca.key_pem


def test_load_rejects_garbage_certificate(fixed_ca: CertificateAuthority) -> None:
    """Garbage in cert_pem is reported as a bad CA certificate."""
    with pytest.raises(ValueError, match="CA certificate: no PEM certificate found"):
        CertificateAuthority.load(cert_pem=b"not a cert", key_pem=fixed_ca.key_pem)


def test_load_rejects_corrupt_certificate(fixed_ca: CertificateAuthority) -> None:
    """A PEM-armoured but corrupt certificate is reported as a bad CA certificate."""
    corrupt = fixed_ca.cert_pem.replace(b"\nM", b"\n!", 1)
    with pytest.raises(ValueError, match="CA certificate: not a valid PEM certificate"):
        CertificateAuthority.load(cert_pem=corrupt, key_pem=fixed_ca.key_pem)


def test_load_rejects_garbage_key(fixed_ca: CertificateAuthority) -> None:
    """Garbage in key_pem is reported as a bad CA private key."""
    with pytest.raises(ValueError, match="CA private key: not a valid unencrypted PEM"):
        CertificateAuthority.load(cert_pem=fixed_ca.cert_pem, key_pem=b"junk")


def test_load_rejects_encrypted_key(fixed_ca: CertificateAuthority) -> None:
    """An encrypted key is reported as unsupported, not as garbage."""
    key = serialization.load_pem_private_key(fixed_ca.key_pem, password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"),
    )
    with pytest.raises(ValueError, match="CA private key: encrypted private keys"):
        CertificateAuthority.load(cert_pem=fixed_ca.cert_pem, key_pem=encrypted)


def test_load_rejects_mismatched_key(
    fixed_ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    """A key from another CA is reported as not matching the certificate."""
    with pytest.raises(ValueError, match="does not match the CA certificate"):
        CertificateAuthority.load(cert_pem=fixed_ca.cert_pem, key_pem=other_ca.key_pem)


def test_load_rejects_leaf_as_ca(fixed_ca: CertificateAuthority) -> None:
    """A leaf certificate with its own key is reported as not a CA."""
    leaf = fixed_ca.issue_serving(dns_names=["a.x"], now=NOW)
    with pytest.raises(ValueError, match="is not a CA: BasicConstraints has ca=False"):
        CertificateAuthority.load(cert_pem=leaf.cert_pem, key_pem=leaf.key_pem)


def test_load_rejects_several_certificates(
    fixed_ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    """A bundle of certificates is not a single CA certificate."""
    with pytest.raises(ValueError, match="expected one PEM certificate, found 2"):
        CertificateAuthority.load(
            cert_pem=fixed_ca.cert_pem + other_ca.cert_pem, key_pem=fixed_ca.key_pem
        )


def test_a_ca_tells_its_own_leaves_from_anothers() -> None:
    """A serving pair kept apart from its CA is checked against it: another CA's leaf (one
    with the same name, say after the CA was replaced) and garbage are not
    its leaves."""
    ca = CertificateAuthority.generate(common_name="mirrorgate.mirrorgate CA")
    twin = CertificateAuthority.generate(common_name="mirrorgate.mirrorgate CA")
    own = ca.issue_serving(dns_names=["mirrorgate.mirrorgate.svc"])
    other = twin.issue_serving(dns_names=["mirrorgate.mirrorgate.svc"])
    assert ca.issued(own.cert_pem)
    assert not ca.issued(other.cert_pem)
    assert not twin.issued(own.cert_pem)
    assert not ca.issued(b"-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
