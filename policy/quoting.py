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
from collections.abc import Iterator
from typing import Any

__all__ = ["QUOTE_LIMIT", "prefix", "quote"]

QUOTE_LIMIT = 800
"""Characters kept: more than the longest valid image reference (policy.reference)."""


def prefix(text: str, *, limit: int = QUOTE_LIMIT) -> str:
    """``text`` unquoted, cut to ``limit`` characters with a mark: for structured log fields."""
    return text if len(text) <= limit else text[:limit] + "…"


def quote(value: object, *, limit: int = QUOTE_LIMIT, json_style: bool = False) -> str:
    """``value`` quoted as ``repr`` does (or as JSON), cut to ``limit`` characters.

    A cut string reads ``'aaaa…' (2621440 characters)``, so that a reader
    knows it was cut and by how much. Non-strings (decoded JSON or YAML:
    dicts, lists, numbers) are rendered piece by piece and the rendering
    stops at the limit: a structure whose parts are shared (a YAML alias
    bomb) can be billions of characters long, and nested thousands deep.
    Such a cut value reads ``['aaaa', ['b…' (more than 800 characters)``.
    """
    text = value if isinstance(value, str) else None
    if text is None:
        rendered, cut = _render(value, limit=limit, json_style=json_style)
        return f"{rendered[:limit]}… (more than {limit} characters)" if cut else rendered
    if len(text) <= limit:
        return json.dumps(text) if json_style else repr(text)
    cut_text = prefix(text, limit=limit)
    return f"{json.dumps(cut_text) if json_style else repr(cut_text)} ({len(text)} characters)"


_JSON_CONSTANTS: dict[object, str] = {True: "true", False: "false", None: "null"}


def _scalar(value: object, *, limit: int, json_style: bool) -> str:
    """One leaf; a string is rendered from a prefix, which is all that can be shown of it."""
    if isinstance(value, str):
        shown = value[: limit + 1]
        return json.dumps(shown) if json_style else repr(shown)
    if json_style and (value is None or type(value) is bool):
        return _JSON_CONSTANTS[value]
    if json_style and isinstance(value, (int, float)):
        return json.dumps(value)
    return repr(value)


def _render(value: object, *, limit: int, json_style: bool) -> tuple[str, bool]:
    """``value`` rendered until just past ``limit`` characters, and whether it was cut.

    Iterative (an explicit stack of iterators), so that depth costs no recursion.
    """
    pieces: list[str] = []
    size = 0
    # Each frame: the items still to render, whether they are dict items, the closer,
    # whether the next item is the first.
    stack: list[tuple[Iterator[Any], bool, str, list[bool]]] = []
    pending: list[object] = [value]
    while True:
        if pending:
            item = pending.pop()
            if isinstance(item, dict):
                piece = "{"
                stack.append((iter(item.items()), True, "}", [True]))
            elif isinstance(item, (list, tuple)):
                tuple_like = isinstance(item, tuple) and not json_style
                piece = "(" if tuple_like else "["
                stack.append((iter(item), False, ")" if tuple_like else "]", [True]))
            else:
                piece = _scalar(item, limit=limit, json_style=json_style)
        elif stack:
            items, is_dict, closer, first = stack[-1]
            entry: Any = next(items, _END)
            if entry is _END:
                stack.pop()
                piece = closer
            else:
                piece = "" if first[0] else ", "
                first[0] = False
                if is_dict:
                    key, entry = entry
                    piece += (
                        _scalar(
                            key if not json_style or isinstance(key, str) else str(key),
                            limit=limit,
                            json_style=json_style,
                        )
                        + ": "
                    )
                pending.append(entry)
        else:
            return "".join(pieces), False
        pieces.append(piece)
        size += len(piece)
        if size > limit:
            return "".join(pieces), True


_END = object()
