"""Collecting the problems of one policy document, each located by its field path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from mirrorgate.policy.model import MAX_ERRORS, FieldError
from mirrorgate.policy.quoting import quote

__all__ = ["Collector", "json_quote", "type_name"]


def json_quote(value: object) -> str:
    return quote(value, json_style=True)


class Collector:
    """Gathers :class:`FieldError`s so that one load reports every problem."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []
        self.omitted = 0

    def add(self, path: str, message: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(FieldError(path, message))
        else:
            self.omitted += 1

    def mapping(
        self,
        value: object,
        path: str,
        allowed: Sequence[str] | None,
        removed: Mapping[str, str] | None = None,
    ) -> Mapping[str, object]:
        """``value`` as a mapping; ``allowed`` lists its fields (None: any keys);
        ``removed`` says what to do instead of a field that no longer exists."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(path, f"must be a mapping, got {type_name(value)}")
            return {}
        for key in value:
            where = f"{path}.{key}" if path else str(key)
            if removed is not None and key in removed:
                self.add(where, removed[key])
            elif allowed is not None and key not in allowed:
                self.add(where, f"unknown field (expected one of: {', '.join(allowed)})")
        return cast("Mapping[str, object]", value)

    def sequence(self, value: object, path: str) -> Sequence[object]:
        if value is None:
            return ()
        if isinstance(value, str) or not isinstance(value, Sequence):
            self.add(path, f"must be a list, got {type_name(value)}")
            return ()
        return value

    def string_list(self, value: object, path: str) -> tuple[str, ...]:
        items: list[str] = []
        for i, item in enumerate(self.sequence(value, path)):
            if isinstance(item, str) and item:
                items.append(item)
            else:
                self.add(f"{path}[{i}]", f"must be a non-empty string, got {json_quote(item)}")
        return tuple(items)


def type_name(value: object) -> str:
    if value is None:
        return "null"
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)
