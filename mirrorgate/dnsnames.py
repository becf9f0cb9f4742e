"""The RFC 1123 DNS label: Kubernetes object names (namespaces, Secrets, label values
mirrorgate makes) and the labels of a certificate's host names.

Its one definition, here at the top of the package because both ``policy``
and ``certs`` need it and neither may import the other (pyproject.toml's
import contracts): this module imports nothing of the project.
"""

from __future__ import annotations

import re

__all__ = ["DNS_LABEL", "DNS_LABEL_RE", "MAX_LABEL_LENGTH"]

MAX_LABEL_LENGTH = 63
DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
"""1 to 63 lower-case letters, digits and '-', neither first nor last a '-'."""
DNS_LABEL_RE = re.compile(DNS_LABEL, re.ASCII)
"""A Kubernetes name that must be a DNS label (RFC 1123): lower case only; use ``fullmatch``."""
