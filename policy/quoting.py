"""Quoting values in warnings, log lines and errors: always a bounded prefix.

Whatever a client writes into a Pod or a review (an image of megabytes, a
namespace, a uid, a Content-Type) may end up quoted in a message. A message
that quotes it whole is an amplifier: the warning goes back to the caller,
into the API server's audit log, into our log and into cached plans. Every
quoted value therefore passes through :func:`quote`, which keeps a prefix
long enough to recognise the value (any valid image reference fits) and says
how long the whole was.
"""

from __future__ import annotations

import json

__all__ = ["QUOTE_LIMIT", "prefix", "quote"]

QUOTE_LIMIT = 800
"""Characters kept: more than the longest valid image reference (policy.reference)."""


def prefix(text: str, *, limit: int = QUOTE_LIMIT) -> str:
    """``text`` unquoted, cut to ``limit`` characters with a mark: for structured log fields."""
    return text if len(text) <= limit else text[:limit] + "…"


def quote(value: object, *, limit: int = QUOTE_LIMIT, json_style: bool = False) -> str:
    """``value`` quoted as ``repr`` does (or as JSON), cut to ``limit`` characters.

    A cut value reads ``'aaaa…' (2621440 characters)``, so that a reader
    knows it was cut and by how much. Non-strings are rendered by ``repr``
    and cut likewise (they come from decoded JSON: dicts, lists, numbers).
    """
    text = value if isinstance(value, str) else None
    if text is None:
        rendered = _render(value, json_style=json_style)
        if len(rendered) <= limit:
            return rendered
        return f"{rendered[:limit]}… ({len(rendered)} characters)"
    if len(text) <= limit:
        return json.dumps(text) if json_style else repr(text)
    cut = prefix(text, limit=limit)
    return f"{json.dumps(cut) if json_style else repr(cut)} ({len(text)} characters)"


def _render(value: object, *, json_style: bool) -> str:
    if not json_style:
        return _bounded_repr(value)
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return _bounded_repr(value)


def _bounded_repr(value: object) -> str:
    try:
        return repr(value)
    except RecursionError:  # a structure nested thousands deep
        return f"<{type(value).__name__} nested too deeply to show>"
