"""Shared CAs: key generation is cheap for P-256 but not free, so one per module."""

from __future__ import annotations

import pytest

from mirrorgate.certs import CertificateAuthority


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    """The CA most tests issue from."""
    return CertificateAuthority.generate()


@pytest.fixture(scope="module")
def other_ca() -> CertificateAuthority:
    """An unrelated CA with the same common name, for negative controls."""
    return CertificateAuthority.generate()
