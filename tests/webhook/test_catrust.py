"""Which CAs caBundle trusts while replicas switch to a new one (webhook/cluster/catrust.py).

Pure: the CA Secret's data in, its next data and the bundle out, on a clock moved by
hand. Each step reads as one replica's check: what it serves, what it finds, what it
writes.
"""

from __future__ import annotations

import datetime

import pytest

from mirrorgate.certs import CA_CERT, CA_KEY, CertificateAuthority
from mirrorgate.webhook.cluster import catrust
from mirrorgate.webhook.cluster.catrust import PREVIOUS_CA, PREVIOUS_UNTIL

HOLD = datetime.timedelta(minutes=10)


class Clock:
    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)

    def advance(self, **delta: float) -> datetime.datetime:
        self.now += datetime.timedelta(**delta)
        return self.now


@pytest.fixture(scope="module")
def cas() -> list[CertificateAuthority]:
    return [CertificateAuthority.generate(common_name=f"ca-{n}") for n in range(3)]


def _secret(ca: CertificateAuthority) -> dict[str, bytes]:
    return {CA_CERT: ca.cert_pem, CA_KEY: ca.key_pem}


def _rotated(
    old: dict[str, bytes], new: CertificateAuthority, served: list[bytes | None], clock: Clock
) -> dict[str, bytes]:
    """As ensure_ca makes a new CA: its previous entries carried, the old CA served."""
    base = {k: v for k, v in old.items() if k in catrust.PREVIOUS_KEYS} | _secret(new)
    return catrust.successor(base, served=[old.get(CA_CERT), *served], now=clock.now, hold=HOLD)


def test_the_old_ca_is_trusted_beside_the_new_until_its_time(
    cas: list[CertificateAuthority],
) -> None:
    old, new = cas[0], cas[1]
    clock = Clock()
    rotated = _rotated(_secret(old), new, [old.cert_pem, old.cert_pem], clock)
    assert rotated[PREVIOUS_CA] == old.cert_pem
    until = clock.now + HOLD
    assert rotated[PREVIOUS_UNTIL] == until.isoformat().encode()
    assert catrust.trusted(rotated, now=clock.now) == new.cert_pem + old.cert_pem

    # Replica B, still serving the old CA, and A, serving the new one: nothing to write,
    # and both trust the same two CAs.
    clock.advance(minutes=9, seconds=59)
    for served in ([new.cert_pem, old.cert_pem], [new.cert_pem, new.cert_pem]):
        assert catrust.successor(rotated, served=served, now=clock.now, hold=HOLD) == rotated
    assert catrust.trusted(rotated, now=clock.now) == new.cert_pem + old.cert_pem

    # Its time passed: the first check drops it, and the bundle is the new CA alone.
    clock.advance(seconds=1)
    assert catrust.trusted(rotated, now=clock.now) == new.cert_pem
    served = [new.cert_pem, new.cert_pem]
    assert catrust.successor(rotated, served=served, now=clock.now, hold=HOLD) == _secret(new)


def test_a_deleted_secret_learns_the_old_ca_from_what_is_served(
    cas: list[CertificateAuthority],
) -> None:
    """The CA Secret deleted: the old CA is known only from the TLS Secret and the files."""
    old, new = cas[0], cas[1]
    clock = Clock()
    rotated = _rotated({}, new, [old.cert_pem, None], clock)
    assert catrust.trusted(rotated, now=clock.now) == new.cert_pem + old.cert_pem


def test_a_replica_serving_a_ca_no_longer_trusted_makes_it_trusted_again(
    cas: list[CertificateAuthority],
) -> None:
    """A replica whose checks failed past the overlap still serves the old CA: its first
    check that succeeds trusts that CA again, a whole overlap from then, before it switches."""
    old, new = cas[0], cas[1]
    clock = Clock()
    served = [new.cert_pem, old.cert_pem]
    again = catrust.successor(_secret(new), served=served, now=clock.now, hold=HOLD)
    assert again[PREVIOUS_CA] == old.cert_pem
    assert again[PREVIOUS_UNTIL] == (clock.now + HOLD).isoformat().encode()


def test_a_second_rotation_within_the_overlap_keeps_both_earlier_cas(
    cas: list[CertificateAuthority],
) -> None:
    first, second, third = cas
    clock = Clock()
    once = _rotated(_secret(first), second, [first.cert_pem, first.cert_pem], clock)
    clock.advance(minutes=5)
    # B still serves the first CA, the TLS Secret already the second.
    twice = _rotated(once, third, [second.cert_pem, first.cert_pem], clock)
    assert twice[PREVIOUS_CA] == first.cert_pem + second.cert_pem
    assert twice[PREVIOUS_UNTIL] == (clock.now + HOLD).isoformat().encode()
    bundle = catrust.trusted(twice, now=clock.now)
    assert bundle == third.cert_pem + first.cert_pem + second.cert_pem


def test_a_longer_overlap_already_written_is_not_shortened(
    cas: list[CertificateAuthority],
) -> None:
    """Replicas with a longer check interval wrote a later time: it stands."""
    old, new, other = cas
    clock = Clock()
    long = _rotated(_secret(old), new, [old.cert_pem], clock)
    long[PREVIOUS_UNTIL] = (clock.now + datetime.timedelta(hours=1)).isoformat().encode()
    more = catrust.successor(long, served=[other.cert_pem], now=clock.now, hold=HOLD)
    assert more[PREVIOUS_UNTIL] == long[PREVIOUS_UNTIL]
    assert more[PREVIOUS_CA] == old.cert_pem + other.cert_pem


def test_steady_state_writes_nothing(cas: list[CertificateAuthority]) -> None:
    ca = cas[0]
    clock = Clock()
    data = _secret(ca)
    # First start (no TLS Secret, no files), every later check, and damaged entries.
    for served in ([None, None], [ca.cert_pem, ca.cert_pem], [b"not PEM", b""]):
        assert catrust.successor(data, served=served, now=clock.now, hold=HOLD) == data
    assert catrust.trusted(data, now=clock.now) == ca.cert_pem


@pytest.mark.parametrize(
    "damage",
    [
        {PREVIOUS_UNTIL: b"next Tuesday"},
        {PREVIOUS_UNTIL: b"2099-01-01T00:00:00"},  # no offset
        {PREVIOUS_UNTIL: b"\xff"},
        {PREVIOUS_CA: b"not a certificate"},
    ],
)
def test_a_damaged_entry_trusts_nothing_and_is_dropped(
    cas: list[CertificateAuthority], damage: dict[str, bytes]
) -> None:
    old, new = cas[0], cas[1]
    clock = Clock()
    data = _rotated(_secret(old), new, [old.cert_pem], clock) | damage
    assert catrust.trusted(data, now=clock.now) == new.cert_pem
    served = [new.cert_pem]
    assert catrust.successor(data, served=served, now=clock.now, hold=HOLD) == _secret(new)


def test_the_bundle_holds_certificates_only(cas: list[CertificateAuthority]) -> None:
    old, new = cas[0], cas[1]
    clock = Clock()
    rotated = _rotated(_secret(old), new, [old.cert_pem], clock)
    assert b"PRIVATE KEY" not in catrust.trusted(rotated, now=clock.now)
    assert b"PRIVATE KEY" not in rotated[PREVIOUS_CA]


@pytest.mark.parametrize(
    ("check_interval", "minutes"), [(1.0, 10), (300.0, 10), (600.0, 20), (3600.0, 120)]
)
def test_the_overlap_is_two_checks_and_at_least_ten_minutes(
    check_interval: float, minutes: int
) -> None:
    assert catrust.overlap(check_interval) == datetime.timedelta(minutes=minutes)
