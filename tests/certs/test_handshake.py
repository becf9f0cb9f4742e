"""End-to-end: issued certificates work in real TLS handshakes, and wrong ones fail.

After trustme's ``test_stdlib_end_to_end``: every positive handshake has
negative controls showing the same code fails when the certificate, the host
name, the CA or the clock is wrong, and each failure is checked for its reason.
"""

from __future__ import annotations

import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair, service_dns_names
from tests.certs.handshake import handshake

NAMES = service_dns_names(service="mirrorgate", namespace="mirrorgate-system")


@pytest.fixture(scope="module")
def serving(ca: CertificateAuthority) -> KeyPair:
    """A serving certificate for the Service names and 127.0.0.1."""
    return ca.issue_serving(dns_names=NAMES, ips=["127.0.0.1"])


def _verify_message(error: Exception | None) -> str:
    assert isinstance(error, ssl.SSLCertVerificationError), repr(error)
    return error.verify_message


@pytest.mark.parametrize("hostname", NAMES)
def test_handshake_succeeds_for_each_service_name(
    tmp_path: Path, ca: CertificateAuthority, serving: KeyPair, hostname: str
) -> None:
    """A client trusting only the CA verifies the leaf under every Service name."""
    outcome = handshake(
        tmp_path, server=serving, trusted_ca_pem=ca.cert_pem, server_hostname=hostname
    )
    assert outcome.ok, outcome


def test_handshake_succeeds_for_ip_san(
    tmp_path: Path, ca: CertificateAuthority, serving: KeyPair
) -> None:
    """Connecting to 127.0.0.1 by address is verified through the IP SAN."""
    outcome = handshake(
        tmp_path, server=serving, trusted_ca_pem=ca.cert_pem, server_hostname="127.0.0.1"
    )
    assert outcome.ok, outcome


def test_wrong_hostname_fails(tmp_path: Path, ca: CertificateAuthority, serving: KeyPair) -> None:
    """A host name not in the SAN fails hostname verification."""
    outcome = handshake(
        tmp_path, server=serving, trusted_ca_pem=ca.cert_pem, server_hostname="evil.example.com"
    )
    assert "Hostname mismatch" in _verify_message(outcome.client_error)


def test_ip_not_in_san_fails(tmp_path: Path, ca: CertificateAuthority) -> None:
    """A DNS-only leaf is not accepted for an IP host, even on that IP."""
    leaf = ca.issue_serving(dns_names=["localhost"])
    outcome = handshake(
        tmp_path, server=leaf, trusted_ca_pem=ca.cert_pem, server_hostname="127.0.0.1"
    )
    assert "IP address mismatch" in _verify_message(outcome.client_error)


def test_different_ca_fails(
    tmp_path: Path, other_ca: CertificateAuthority, serving: KeyPair
) -> None:
    """A client trusting another CA (even with the same CN) rejects the leaf."""
    outcome = handshake(
        tmp_path, server=serving, trusted_ca_pem=other_ca.cert_pem, server_hostname=NAMES[0]
    )
    assert "unable to get local issuer certificate" in _verify_message(outcome.client_error)


def test_expired_leaf_fails(tmp_path: Path, ca: CertificateAuthority) -> None:
    """A leaf issued in the past and already expired fails verification."""
    leaf = ca.issue_serving(
        dns_names=NAMES,
        valid_for=timedelta(days=1),
        now=datetime.now(UTC) - timedelta(days=30),
    )
    outcome = handshake(tmp_path, server=leaf, trusted_ca_pem=ca.cert_pem, server_hostname=NAMES[0])
    assert "certificate has expired" in _verify_message(outcome.client_error)


def test_not_yet_valid_leaf_fails(tmp_path: Path, ca: CertificateAuthority) -> None:
    """A leaf whose notBefore lies beyond the skew allowance is rejected."""
    leaf = ca.issue_serving(dns_names=NAMES, now=datetime.now(UTC) + timedelta(hours=1))
    outcome = handshake(tmp_path, server=leaf, trusted_ca_pem=ca.cert_pem, server_hostname=NAMES[0])
    assert "certificate is not yet valid" in _verify_message(outcome.client_error)


def test_clock_skew_allowance_accepts_fresh_leaf_from_fast_clock(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    """A leaf minted by a signer whose clock is 2 minutes fast is still valid here."""
    leaf = ca.issue_serving(dns_names=NAMES, now=datetime.now(UTC) + timedelta(minutes=2))
    outcome = handshake(tmp_path, server=leaf, trusted_ca_pem=ca.cert_pem, server_hostname=NAMES[0])
    assert outcome.ok, outcome


def test_leaf_with_empty_subject_passes_strict_verification(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    """When no name fits a CN the subject is empty and the critical SAN still verifies."""
    long_name = ".".join(["a" * 60, "b" * 60])
    leaf = ca.issue_serving(dns_names=[long_name])
    outcome = handshake(
        tmp_path, server=leaf, trusted_ca_pem=ca.cert_pem, server_hostname=long_name
    )
    assert outcome.ok, outcome


def test_loaded_ca_issues_certificates_trusted_by_original(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    """A CA round-tripped through PEM issues leaves that verify against the same cert."""
    loaded = CertificateAuthority.load(cert_pem=ca.cert_pem, key_pem=ca.key_pem)
    leaf = loaded.issue_serving(dns_names=NAMES)
    outcome = handshake(
        tmp_path, server=leaf, trusted_ca_pem=ca.cert_pem, server_hostname=NAMES[-1]
    )
    assert outcome.ok, outcome


def test_mutual_tls_with_client_certificate(
    tmp_path: Path, ca: CertificateAuthority, serving: KeyPair
) -> None:
    """A client certificate from the CA is accepted and its CN and O reach the server."""
    client = ca.issue_client(common_name="system:apiserver", organizations=["system:masters"])
    outcome = handshake(
        tmp_path,
        server=serving,
        trusted_ca_pem=ca.cert_pem,
        server_hostname=NAMES[0],
        client=client,
        client_trust_ca_pem=ca.cert_pem,
    )
    assert outcome.ok, outcome
    assert outcome.client_subject_seen_by_server == {
        "commonName": "system:apiserver",
        "organizationName": "system:masters",
    }


@pytest.mark.parametrize(
    ("wrong", "expected"),
    [
        ("serving-cert-as-client", "unsuitable certificate purpose"),
        ("other-ca", "unable to get local issuer certificate"),
    ],
)
def test_mutual_tls_rejects_wrong_client_certificate(
    tmp_path: Path,
    ca: CertificateAuthority,
    other_ca: CertificateAuthority,
    serving: KeyPair,
    wrong: str,
    expected: str,
) -> None:
    """The server rejects a client cert without clientAuth EKU or from another CA."""
    client = (
        serving
        if wrong == "serving-cert-as-client"
        else other_ca.issue_client(common_name="intruder")
    )
    outcome = handshake(
        tmp_path,
        server=serving,
        trusted_ca_pem=ca.cert_pem,
        server_hostname=NAMES[0],
        client=client,
        client_trust_ca_pem=ca.cert_pem,
    )
    assert not outcome.ok
    assert expected in _verify_message(outcome.server_error)
