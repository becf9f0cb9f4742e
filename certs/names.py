"""Host names for serving certificates.

The Kubernetes API server reaches a webhook through its Service, and depending
on how the client resolves it the TLS host name can be any of the four forms
``service_dns_names`` returns; the certificate must carry all of them.

Names are validated here (not left to ``cryptography``, which accepts any
string) so a typo fails when the certificate is made, with the bad name in the
message, instead of later as an opaque hostname mismatch during a handshake.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from mirrorgate.dnsnames import DNS_LABEL, DNS_LABEL_RE

__all__ = ["service_dns_names", "split_identities", "validate_dns_name"]

# RFC 1123 host-name label; compared case-insensitively, as DNS is.
_LABEL = re.compile(DNS_LABEL, re.IGNORECASE | re.ASCII)
# Kubernetes object names: RFC 1123 labels, lower case only.
_K8S_LABEL = DNS_LABEL_RE
_MAX_NAME_LENGTH = 253


def validate_dns_name(name: str) -> str:
    """Return ``name`` unchanged if it is a valid DNS name for a certificate SAN.

    A single leading ``*`` label (a wildcard) is allowed. IP addresses are
    rejected: in a DNS SAN they never match an IP host, which is a confusing
    failure to debug, so they must be passed as IPs instead.

    Raises:
        ValueError: naming ``name`` and what is wrong with it.
    """
    if not name:
        raise ValueError("DNS name must not be empty")
    if not name.isascii():
        raise ValueError(f"DNS name {name!r} is not ASCII; pass the IDNA (xn--) form")
    if len(name) > _MAX_NAME_LENGTH:
        raise ValueError(f"DNS name {name!r} is longer than {_MAX_NAME_LENGTH} characters")
    if _is_ip(name):
        raise ValueError(f"DNS name {name!r} is an IP address; pass it as an IP instead")
    labels = name.split(".")
    if labels[0] == "*":
        labels = labels[1:]
        if len(labels) < 2:
            # "*" or "*.com" would match far more than intended.
            raise ValueError(f"DNS name {name!r}: a wildcard needs at least two labels after it")
    for label in labels:
        if not _LABEL.fullmatch(label):
            raise ValueError(
                f"DNS name {name!r} has an invalid label {label!r} "
                "(1-63 letters, digits or '-', not starting or ending with '-')"
            )
    return name


def service_dns_names(
    *, service: str, namespace: str, cluster_domain: str = "cluster.local"
) -> list[str]:
    """Return the DNS names a Service is reachable by inside the cluster.

    ``[svc, svc.ns, svc.ns.svc, svc.ns.svc.<cluster_domain>]``.

    Raises:
        ValueError: if ``service`` or ``namespace`` is not a valid Kubernetes
            name, or ``cluster_domain`` is not a valid DNS name.
    """
    for what, value in (("service", service), ("namespace", namespace)):
        if not _K8S_LABEL.fullmatch(value):
            raise ValueError(
                f"{what} name {value!r} is not a valid Kubernetes name "
                "(1-63 lower-case letters, digits or '-', not starting or ending with '-')"
            )
    validate_dns_name(cluster_domain)
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    ]


def split_identities(values: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split host identities into ``(dns_names, ips)``, keeping order, dropping duplicates.

    Each value is tried as an IP address first (as trustme does), so
    ``"127.0.0.1"`` and ``"::1"`` become IPs; IPs come back in canonical form
    (``"::1"``, not ``"0:0::1"``). Everything else must be a valid DNS name.

    Raises:
        ValueError: naming the first value that is neither.
    """
    dns_names: list[str] = []
    ips: list[str] = []
    for value in values:
        if _is_ip(value):
            ip = str(ipaddress.ip_address(value))
            if ip not in ips:
                ips.append(ip)
        elif validate_dns_name(value) not in dns_names:
            dns_names.append(value)
    return dns_names, ips


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
