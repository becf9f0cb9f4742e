"""Which CAs the API server is to trust for mirrorgate: its CA, and for a while the one before.

Replicas switch to a new CA each at its own check: until the last has, some still serve
a certificate from the CA it replaced. So the CA Secret keeps that CA's certificate
(:data:`PREVIOUS_CA`, never its key) until :data:`PREVIOUS_UNTIL`, and while it is in
force every ``caBundle`` and the published ConfigMap carry it after the CA itself. The
replicas coordinate only through that Secret: whichever makes a new CA (or finds a CA
served that the Secret does not trust) writes the previous one there, and whichever checks
after the time has passed removes it.

Values in, values out, with the clock passed in: the decisions are tested without a
cluster (tests/webhook/test_catrust.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

from mirrorgate import certs
from mirrorgate.certs import CA_CERT

__all__ = [
    "MIN_OVERLAP",
    "PREVIOUS_CA",
    "PREVIOUS_KEYS",
    "PREVIOUS_UNTIL",
    "outgoing",
    "overlap",
    "previous",
    "successor",
    "trusted",
]

PREVIOUS_CA = "previous-ca.crt"
PREVIOUS_UNTIL = "previous-ca.until"
"""When the previous CA stops being trusted: an ISO 8601 time with its UTC offset."""
PREVIOUS_KEYS = (PREVIOUS_CA, PREVIOUS_UNTIL)
MIN_OVERLAP = datetime.timedelta(minutes=10)
"""However often replicas check: room for a replica that restarts, or whose checks fail
for a while, to switch before the CA it serves from is dropped."""


def overlap(check_interval: float) -> datetime.timedelta:
    """How long a replaced CA stays trusted: two checks of every replica, at least
    :data:`MIN_OVERLAP`."""
    return max(datetime.timedelta(seconds=2 * check_interval), MIN_OVERLAP)


def _split(pem: bytes | None) -> list[bytes]:
    """The certificates in ``pem``, each as canonical PEM; none if it is not PEM."""
    if not pem:
        return []
    try:
        return [certs.encode_certificate(c) for c in certs.load_certificates(pem)]
    except ValueError:
        return []


def _until(data: Mapping[str, bytes]) -> datetime.datetime | None:
    try:
        until = datetime.datetime.fromisoformat(data[PREVIOUS_UNTIL].decode())
    except (KeyError, UnicodeDecodeError, ValueError):
        return None
    return until if until.tzinfo is not None else None  # no offset: unreadable


def previous(data: Mapping[str, bytes], *, now: datetime.datetime) -> list[bytes]:
    """The replaced CAs the CA Secret's ``data`` still trusts at ``now`` (PEM each).

    None once its time has passed, or when it cannot be read: a damaged entry must not
    keep a CA trusted for ever."""
    until = _until(data)
    if until is None or until <= now:
        return []
    own = _split(data.get(CA_CERT))
    return [c for c in _split(data.get(PREVIOUS_CA)) if c not in own]


def trusted(data: Mapping[str, bytes], *, now: datetime.datetime) -> bytes:
    """What ``caBundle`` and the published ConfigMap carry: the CA, then any replaced one
    still in force. The same on every replica that reads the same Secret at about the
    same time, so that they do not undo each other's writes."""
    return data[CA_CERT] + b"".join(previous(data, now=now))


def outgoing(data: Mapping[str, bytes], served: Iterable[bytes | None]) -> list[bytes]:
    """The CAs in ``served`` (what replicas may be serving certificates from: the TLS
    Secret's ``ca.crt``, a replica's own files) that the CA Secret's ``data`` does not have
    as its CA. Entries that are not certificates are left out."""
    own = _split(data.get(CA_CERT))
    found: list[bytes] = []
    for pem in served:
        found += [c for c in _split(pem) if c not in own and c not in found]
    return found


def successor(
    data: Mapping[str, bytes],
    *,
    served: Iterable[bytes | None],
    now: datetime.datetime,
    hold: datetime.timedelta,
) -> dict[str, bytes]:
    """The CA Secret's data as it should be at ``now``: its CA and key; every CA in
    ``served`` that is not that CA trusted until ``hold`` from now (replicas still serve
    from it); an earlier replaced CA kept until its own time; nothing of a time passed.

    Equal to ``data`` when there is nothing to write. For a new CA, ``data`` is that CA
    and the old Secret's previous entries, and ``served`` includes the old CA."""
    kept = previous(data, now=now)
    added = [c for c in outgoing(data, served) if c not in kept]
    fresh = {k: v for k, v in data.items() if k not in PREVIOUS_KEYS}
    if not kept and not added:
        return fresh
    untils = [u for u in (_until(data) if kept else None, now + hold if added else None) if u]
    until = max(untils)  # a CA served since the last write: trusted a whole hold from now
    fresh[PREVIOUS_CA] = b"".join([*kept, *added])
    fresh[PREVIOUS_UNTIL] = until.isoformat().encode()
    return fresh
