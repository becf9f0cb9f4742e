"""A small certificate authority for the webhook's serving certificate.

The API server only talks to a webhook over TLS and trusts it through the
``caBundle`` in the webhook configuration, so mirrorgate needs a private CA
and a leaf for its Service names. This module is that CA (after trustme's
``CA``/``issue_cert`` and controller-runtime's TinyCA), with production
lifetimes instead of test ones.

Choices, and why:

* ECDSA P-256 for every key: fast to generate (tests make many) and
  universally supported by TLS 1.2+ stacks.
* ``notBefore`` is ``now - 5 minutes`` so a peer whose clock is slightly
  behind does not reject a certificate minted a moment ago.
* A leaf never outlives its CA: its ``notAfter`` is clamped to the CA's, as a
  leaf beyond that point fails verification anyway and would only mislead
  expiry monitoring.
* The CA has ``path_length=0``: it signs leaves, never other CAs.
* Every clock-dependent call takes ``now`` so tests can create expired or
  nearly expired certificates without patching time.
* Private keys never appear in ``repr()``; reprs end up in logs.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Final, TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mirrorgate.certs._clock import resolve_now, to_utc
from mirrorgate.certs.names import validate_dns_name
from mirrorgate.certs.pem import (
    SigningKey,
    encode_certificate,
    encode_private_key,
    load_certificate,
    load_private_key,
    public_keys_match,
)

__all__ = ["CLOCK_SKEW", "CertificateAuthority", "KeyPair"]

CLOCK_SKEW: Final = timedelta(minutes=5)
"""How far ``notBefore`` is backdated from ``now``."""

_MAX_NAME_ATTRIBUTE: Final = 64  # upper bound for CN and O (RFC 5280 ub-common-name)

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key.

    The validity helpers parse ``cert_pem`` on each call; construction does
    not validate, so a ``KeyPair`` can wrap bytes read from anywhere.
    """

    cert_pem: bytes
    key_pem: bytes = dataclasses.field(repr=False)

    @property
    def not_valid_before(self) -> datetime:
        """The certificate's ``notBefore``, an aware UTC datetime."""
        return load_certificate(self.cert_pem, what="KeyPair.cert_pem").not_valid_before_utc

    @property
    def not_valid_after(self) -> datetime:
        """The certificate's ``notAfter``, an aware UTC datetime."""
        return load_certificate(self.cert_pem, what="KeyPair.cert_pem").not_valid_after_utc

    def is_near_expiry(self, *, now: datetime, margin: timedelta) -> bool:
        """Return whether the certificate expires within ``margin`` of ``now``.

        An already expired certificate is near expiry. ``now`` must be aware.
        """
        if margin < timedelta(0):
            raise ValueError(f"margin must not be negative (got {margin})")
        return to_utc(now, what="now") + margin >= self.not_valid_after


class CertificateAuthority:
    """A CA certificate with its private key; issues serving and client leaves.

    Make one with :meth:`generate` or :meth:`load`. The constructor takes
    ``cryptography`` objects and checks them the same way ``load`` does.
    """

    __slots__ = ("_cert", "_cert_pem", "_key", "_key_pem")

    def __init__(self, *, certificate: x509.Certificate, private_key: SigningKey) -> None:
        _check_ca(certificate, private_key)
        self._cert = certificate
        self._key = private_key
        self._cert_pem = encode_certificate(certificate)
        self._key_pem = encode_private_key(private_key)

    @classmethod
    def generate(
        cls,
        *,
        common_name: str = "mirrorgate-ca",
        valid_for: timedelta = timedelta(days=3650),
        now: datetime | None = None,
    ) -> CertificateAuthority:
        """Create a new self-signed CA with a fresh P-256 key."""
        now = resolve_now(now)
        _check_positive(valid_for)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([_name_attribute(NameOID.COMMON_NAME, common_name, what="common_name")])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + valid_for)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, _digest_for(key))
        )
        return cls(certificate=cert, private_key=key)

    @classmethod
    def load(cls, *, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        """Load a CA from PEM bytes.

        Raises:
            ValueError: saying which input is bad: unparseable certificate or
                key, a key that does not belong to the certificate, or a
                certificate that is not a CA.
        """
        cert = load_certificate(cert_pem, what="CA certificate")
        key = load_private_key(key_pem, what="CA private key")
        return cls(certificate=cert, private_key=key)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate as PEM (what goes into ``caBundle``, base64-encoded)."""
        return self._cert_pem

    @property
    def key_pem(self) -> bytes:
        """The CA private key as unencrypted PKCS#8 PEM."""
        return self._key_pem

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(subject={self._cert.subject.rfc4514_string()!r}, "
            f"not_valid_after={self._cert.not_valid_after_utc.isoformat()!r})"
        )

    def issued(self, cert_pem: bytes) -> bool:
        """Whether this CA signed ``cert_pem`` (its issuer and signature, not its dates).

        A serving certificate kept apart from its CA must be checked against it:
        after the CA is replaced, the old leaf no longer verifies under caBundle.
        """
        try:
            load_certificate(cert_pem).verify_directly_issued_by(self._cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True

    def issue_serving(
        self,
        *,
        dns_names: Sequence[str] = (),
        ips: Sequence[str] = (),
        valid_for: timedelta = timedelta(days=90),
        now: datetime | None = None,
    ) -> KeyPair:
        """Issue a TLS server certificate for the given DNS names and IP addresses.

        The subject CN is the first name (DNS before IP) that fits in a CN;
        clients match on the SAN only, the CN is for humans reading the cert.

        Raises:
            ValueError: if there are no identities, one is invalid (named in
                the message), ``valid_for`` is not positive, or the CA has
                expired.
        """
        names = _unique(validate_dns_name(name) for name in dns_names)
        addresses = _unique(_parse_ip(ip) for ip in ips)
        if not names and not addresses:
            raise ValueError("issue_serving needs at least one DNS name or IP address")
        identities = [*names, *(str(address) for address in addresses)]
        common_name = next((i for i in identities if len(i) <= _MAX_NAME_ATTRIBUTE), None)
        subject = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
        )
        san = x509.SubjectAlternativeName(
            [*(x509.DNSName(name) for name in names), *(x509.IPAddress(a) for a in addresses)]
        )
        return self._issue(
            subject=subject,
            san=san,
            # RFC 5280 §4.2.1.6: with an empty subject the SAN must be critical.
            san_critical=common_name is None,
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
            valid_for=valid_for,
            now=now,
        )

    def issue_client(
        self,
        *,
        common_name: str,
        organizations: Sequence[str] = (),
        valid_for: timedelta = timedelta(days=90),
        now: datetime | None = None,
    ) -> KeyPair:
        """Issue a TLS client certificate.

        Kubernetes reads the CN as the user name and each O as a group.

        Raises:
            ValueError: if a name is empty or longer than 64 characters,
                ``valid_for`` is not positive, or the CA has expired.
        """
        attributes = [_name_attribute(NameOID.COMMON_NAME, common_name, what="common_name")]
        attributes += [
            _name_attribute(NameOID.ORGANIZATION_NAME, org, what="organization")
            for org in _unique(organizations)
        ]
        return self._issue(
            subject=x509.Name(attributes),
            san=None,
            san_critical=False,
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
            valid_for=valid_for,
            now=now,
        )

    def _issue(
        self,
        *,
        subject: x509.Name,
        san: x509.SubjectAlternativeName | None,
        san_critical: bool,
        usage: x509.ObjectIdentifier,
        valid_for: timedelta,
        now: datetime | None,
    ) -> KeyPair:
        now = resolve_now(now)
        _check_positive(valid_for)
        ca_expiry = self._cert.not_valid_after_utc
        if now >= ca_expiry:
            raise ValueError(
                f"CA {self._cert.subject.rfc4514_string()!r} expired at "
                f"{ca_expiry.isoformat()}; generate a new CA"
            )
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(min(now + valid_for, ca_expiry))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # digital_signature only: ECDHE key exchange never encrypts to the key.
            .add_extension(_key_usage(digital_signature=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(self._authority_key_identifier(), critical=False)
        )
        if san is not None:
            builder = builder.add_extension(san, critical=san_critical)
        cert = builder.sign(self._key, _digest_for(self._key))
        return KeyPair(cert_pem=encode_certificate(cert), key_pem=encode_private_key(key))

    def _authority_key_identifier(self) -> x509.AuthorityKeyIdentifier:
        # Prefer the CA's own SKI so the two match byte for byte even if the
        # CA was made elsewhere with a different SKI method.
        try:
            ski = self._cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        except x509.ExtensionNotFound:
            return x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key())
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value)


def _check_ca(cert: x509.Certificate, key: SigningKey) -> None:
    if not public_keys_match(cert.public_key(), key.public_key()):
        raise ValueError("CA private key does not match the CA certificate's public key")
    subject = cert.subject.rfc4514_string()
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise ValueError(
            f"CA certificate {subject!r} is not a CA: it has no BasicConstraints extension"
        ) from None
    if not constraints.ca:
        raise ValueError(f"CA certificate {subject!r} is not a CA: BasicConstraints has ca=False")
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return  # no KeyUsage means no restriction
    if not usage.key_cert_sign:
        raise ValueError(f"CA certificate {subject!r} has a KeyUsage without keyCertSign")


def _key_usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _digest_for(key: SigningKey) -> hashes.SHA256 | None:
    # Ed25519 signs the message itself; cryptography requires algorithm=None.
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _name_attribute(
    oid: x509.ObjectIdentifier, value: str, *, what: str
) -> x509.NameAttribute[str]:
    if not 1 <= len(value) <= _MAX_NAME_ATTRIBUTE:
        raise ValueError(
            f"{what} {value!r} must be 1-{_MAX_NAME_ATTRIBUTE} characters (got {len(value)})"
        )
    return x509.NameAttribute(oid, value)


def _parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"IP address {value!r} is not a valid IPv4 or IPv6 address") from None


def _check_positive(valid_for: timedelta) -> None:
    if valid_for <= timedelta(0):
        raise ValueError(f"valid_for must be positive (got {valid_for})")


def _unique(items: Iterable[_T]) -> list[_T]:
    # dict keeps first-seen order; duplicate SANs are legal but sloppy.
    return list(dict.fromkeys(items))
