"""Errors about what the operator gave us (files, flags, sockets), shared by every layer."""

from __future__ import annotations

__all__ = ["ConfigError", "why_unreadable"]


class ConfigError(Exception):
    """A file the operator gave us cannot be used; the message names it and says why."""


def why_unreadable(path: str) -> str | None:
    """None when ``path`` opens for reading, else why not: "no such file", or the
    errno's own words (a directory that may not be searched is "Permission denied",
    not a missing file, as ``os.path.exists`` would have it)."""
    try:
        with open(path, "rb"):
            return None
    except FileNotFoundError:
        return "no such file"
    except OSError as error:
        return f"cannot read: {error.strerror}"
