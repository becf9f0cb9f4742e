"""Durations as Go's time.ParseDuration reads them: ``12h``, ``1h30m``, ``500ms``, ``0``.

The one grammar for every duration mirrorgate reads: the policy's ``health``
block and the kubelet's CredentialProviderConfig and plugin responses. Each
caller keeps its own range and its own message (a probe interval is not
negative; a cache duration is at most Go's range).
"""

from __future__ import annotations

import re

__all__ = ["parse_duration"]

_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)", re.ASCII)
# Go durations are int64 nanoseconds: ParseDuration refuses anything longer
# (about 292 years), and so does this, which also keeps every expiry a datetime.
_DURATION_MAX = (2**63 - 1) / 1e9


def parse_duration(text: object) -> float | None:
    """Seconds in a Go duration string (``"12h"``, ``"1h30m"``, ``"0"``); None if invalid.

    Invalid includes what Go refuses as out of range, more than 2562047h, and
    digits other than ASCII ones (Python's float() would read them; Go does not).
    """
    if not isinstance(text, str) or not text:
        return None
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    if body == "0":
        return 0.0
    position, total = 0, 0.0
    while position < len(body):
        part = _DURATION_PART.match(body, position)
        if part is None:
            return None
        total += float(part.group(1)) * _DURATION_UNITS[part.group(2)]
        position = part.end()
    if not body or total > _DURATION_MAX:
        return None
    return sign * total
