"""Certificates for the webhook: a small CA, serving/client leaves, PEM and files.

Stands alone: only the standard library and ``cryptography``, nothing from
``webhook`` or ``policy`` (enforced by import-linter), so the CLI and tests can
use it without the server's dependencies.
"""

from mirrorgate.certs.authority import CLOCK_SKEW, CertificateAuthority, KeyPair
from mirrorgate.certs.bundle import generate_bundle
from mirrorgate.certs.files import (
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    atomic_write,
    fsync_directory,
    read_bundle,
    write_bundle,
)
from mirrorgate.certs.names import service_dns_names, split_identities, validate_dns_name
from mirrorgate.certs.pem import (
    ca_bundle_b64,
    certificate_expiry,
    encode_certificate,
    load_certificates,
    subject_alternative_names,
)

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CLOCK_SKEW",
    "TLS_CERT",
    "TLS_KEY",
    "CertificateAuthority",
    "KeyPair",
    "atomic_write",
    "ca_bundle_b64",
    "certificate_expiry",
    "encode_certificate",
    "fsync_directory",
    "generate_bundle",
    "load_certificates",
    "read_bundle",
    "service_dns_names",
    "split_identities",
    "subject_alternative_names",
    "validate_dns_name",
    "write_bundle",
]
