"""generate_bundle: what ``mirrorgate certs generate`` writes, and CA reuse."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from mirrorgate.certs import CertificateAuthority, generate_bundle, read_bundle
from tests.certs.handshake import handshake


def _san(cert_pem: bytes) -> x509.SubjectAlternativeName:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def test_generate_writes_usable_bundle(tmp_path: Path) -> None:
    """The written files serve TLS for the Service name with ca.crt as the trust anchor."""
    out = tmp_path / "out"
    leaf = generate_bundle(service="mirrorgate", namespace="infra", out=out)
    ca_pem, cert_pem, key_pem = read_bundle(out)
    assert (cert_pem, key_pem) == (leaf.cert_pem, leaf.key_pem)
    assert (out / "ca.key").exists()
    outcome = handshake(
        tmp_path, server=leaf, trusted_ca_pem=ca_pem, server_hostname="mirrorgate.infra.svc"
    )
    assert outcome.ok, outcome


def test_generate_includes_service_names_and_extras(tmp_path: Path) -> None:
    """The SAN has the four Service names, then the extra DNS names, and the IPs."""
    leaf = generate_bundle(
        service="mg",
        namespace="ns",
        out=tmp_path,
        dns=["mg.example.com"],
        ips=["127.0.0.1", "fd00::1"],
    )
    san = _san(leaf.cert_pem)
    assert san.get_values_for_type(x509.DNSName) == [
        "mg",
        "mg.ns",
        "mg.ns.svc",
        "mg.ns.svc.cluster.local",
        "mg.example.com",
    ]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("fd00::1"),
    ]


def test_generate_reuses_valid_ca(tmp_path: Path) -> None:
    """A second run keeps ca.crt/ca.key and issues a new leaf from the same CA."""
    first = generate_bundle(service="mg", namespace="ns", out=tmp_path)
    ca_before = (tmp_path / "ca.crt").read_bytes(), (tmp_path / "ca.key").read_bytes()
    second = generate_bundle(service="mg", namespace="ns", out=tmp_path)
    assert ((tmp_path / "ca.crt").read_bytes(), (tmp_path / "ca.key").read_bytes()) == ca_before
    assert second.cert_pem != first.cert_pem
    outcome = handshake(
        tmp_path, server=second, trusted_ca_pem=ca_before[0], server_hostname="mg.ns.svc"
    )
    assert outcome.ok, outcome


def test_generate_replaces_expired_ca(tmp_path: Path) -> None:
    """An expired CA in the output directory is replaced by a new one."""
    long_ago = datetime.now(UTC) - timedelta(days=3651)
    generate_bundle(service="mg", namespace="ns", out=tmp_path, now=long_ago)
    old_ca = (tmp_path / "ca.crt").read_bytes()
    leaf = generate_bundle(service="mg", namespace="ns", out=tmp_path)
    new_ca = (tmp_path / "ca.crt").read_bytes()
    assert new_ca != old_ca
    assert leaf.not_valid_after > datetime.now(UTC)


def test_generate_uses_existing_external_ca(tmp_path: Path, ca: CertificateAuthority) -> None:
    """A CA placed in the directory beforehand signs the leaf."""
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    (tmp_path / "ca.key").write_bytes(ca.key_pem)
    leaf = generate_bundle(service="mg", namespace="ns", out=tmp_path)
    x509.load_pem_x509_certificate(leaf.cert_pem).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca.cert_pem)
    )


@pytest.mark.parametrize(("present", "missing"), [("ca.crt", "ca.key"), ("ca.key", "ca.crt")])
def test_generate_refuses_half_a_ca(
    tmp_path: Path, ca: CertificateAuthority, present: str, missing: str
) -> None:
    """With only one of ca.crt/ca.key present it fails naming the missing one, writing nothing."""
    (tmp_path / present).write_bytes(ca.cert_pem if present == "ca.crt" else ca.key_pem)
    with pytest.raises(ValueError, match=rf"{missing} does not"):
        generate_bundle(service="mg", namespace="ns", out=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [present]


def test_generate_refuses_corrupt_ca(tmp_path: Path, ca: CertificateAuthority) -> None:
    """A corrupt existing CA is reported and left in place, never silently overwritten."""
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    (tmp_path / "ca.key").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"existing CA in .* is unusable: CA private key"):
        generate_bundle(service="mg", namespace="ns", out=tmp_path)
    assert (tmp_path / "ca.key").read_bytes() == b"junk"


def test_generate_rejects_bad_names_before_writing(tmp_path: Path) -> None:
    """An invalid extra name fails with the name in the message and writes no files."""
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="'bad_name'"):
        generate_bundle(service="mg", namespace="ns", out=out, dns=["bad_name"])
    assert not out.exists()
