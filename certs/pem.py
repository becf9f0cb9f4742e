"""PEM encoding and decoding, and the ``caBundle`` encoding.

Decoding errors from ``cryptography`` say only "Unable to load PEM file"; the
``what`` argument lets callers name the file or field at fault, which is what
a person fixing a broken Secret needs to know.
"""

from __future__ import annotations

import base64
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

__all__ = [
    "SigningKey",
    "ca_bundle_b64",
    "certificate_expiry",
    "encode_certificate",
    "encode_private_key",
    "load_certificate",
    "load_certificates",
    "load_private_key",
    "public_keys_match",
    "subject_alternative_names",
]

# Key types that can sign certificates and that we know the digest for.
SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey

_CERT_HEADER = b"-----BEGIN CERTIFICATE-----"


def load_certificates(data: bytes, *, what: str = "certificate") -> list[x509.Certificate]:
    """Parse one or more PEM certificates.

    Raises:
        ValueError: naming ``what`` if ``data`` holds no parseable certificate.
    """
    if _CERT_HEADER not in data:
        raise ValueError(f"{what}: no PEM certificate found (expected {_CERT_HEADER.decode()})")
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise ValueError(f"{what}: not a valid PEM certificate ({exc})") from exc


def load_certificate(data: bytes, *, what: str = "certificate") -> x509.Certificate:
    """Parse exactly one PEM certificate.

    Raises:
        ValueError: naming ``what`` if ``data`` is not exactly one certificate.
    """
    certs = load_certificates(data, what=what)
    if len(certs) != 1:
        raise ValueError(f"{what}: expected one PEM certificate, found {len(certs)}")
    return certs[0]


def load_private_key(data: bytes, *, what: str = "private key") -> SigningKey:
    """Parse an unencrypted PEM private key (PKCS#8, SEC1 or PKCS#1).

    Raises:
        ValueError: naming ``what`` if the key is unparseable, encrypted, or of
            a type that cannot sign certificates here.
    """
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:
        # cryptography signals "this key is encrypted" with TypeError.
        raise ValueError(f"{what}: encrypted private keys are not supported") from exc
    except ValueError as exc:
        raise ValueError(f"{what}: not a valid unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, SigningKey):
        raise ValueError(f"{what}: unsupported key type {type(key).__name__}")
    return key


def encode_certificate(cert: x509.Certificate) -> bytes:
    """Return ``cert`` as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


def encode_private_key(key: SigningKey) -> bytes:
    """Return ``key`` as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )


def public_keys_match(a: PublicKeyTypes, b: PublicKeyTypes) -> bool:
    """Return whether two public keys are the same key."""
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return a.public_bytes(der, fmt) == b.public_bytes(der, fmt)


def ca_bundle_b64(ca_pem: bytes) -> str:
    """Return the ``caBundle`` value for a webhook configuration: base64 of the PEM, once.

    The API server base64-decodes ``caBundle`` and expects PEM inside. Encoding
    twice (or putting raw PEM in YAML) is a classic mistake that surfaces only
    as "x509: certificate signed by unknown authority", so the input is checked
    to really be PEM certificates before it is encoded.

    Raises:
        ValueError: if ``ca_pem`` is not PEM certificates (e.g. already base64).
    """
    load_certificates(ca_pem, what="CA bundle")
    return base64.b64encode(ca_pem).decode("ascii")


def certificate_expiry(cert_pem: bytes) -> datetime:
    """Return the ``notAfter`` of a single PEM certificate, as an aware UTC datetime."""
    return load_certificate(cert_pem).not_valid_after_utc


def subject_alternative_names(cert_pem: bytes) -> set[str]:
    """The DNS names and IP addresses (as text) a PEM certificate is valid for."""
    try:
        extension = load_certificate(cert_pem).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
    except x509.ExtensionNotFound:
        return set()
    names = set(extension.value.get_values_for_type(x509.DNSName))
    names |= {str(ip) for ip in extension.value.get_values_for_type(x509.IPAddress)}
    return names
