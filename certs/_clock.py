"""Time handling shared by the certificate modules.

Every public function that depends on the clock takes an optional ``now`` so
tests can mint expired or nearly expired certificates without patching
anything. X.509 validity is defined in UTC, so naive datetimes are rejected
rather than guessed at: a naive value silently read as local time would shift
validity by the host's UTC offset.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["resolve_now", "to_utc"]


def to_utc(value: datetime, *, what: str) -> datetime:
    """Return ``value`` in UTC; raise ``ValueError`` naming ``what`` if it is naive."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware (got naive datetime {value.isoformat()})")
    return value.astimezone(UTC)


def resolve_now(now: datetime | None) -> datetime:
    """Return ``now`` in UTC, or the current time if it is ``None``."""
    if now is None:
        return datetime.now(UTC)
    return to_utc(now, what="now")
