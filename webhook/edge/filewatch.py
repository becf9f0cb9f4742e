"""Polling file watchers for the files Kubernetes mounts: the policy and the serving certificate.

Mounted ConfigMaps and Secrets change by an atomic symlink swap, which
inotify on the file itself does not see; polling a stat signature (and the
content hash only when it moves) sees every swap and costs next to nothing.

Each watcher is a background :class:`Loop`, a thread of its own, never a
ticker on the event loop: reading, hashing and parsing a file (a policy of
15,000 rules takes about a second) would stall every admission in flight.
``on_change`` therefore runs in that thread: the reloaders swap one reference
and set thread-safe events.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence

from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.logs import logger

__all__ = ["STOP_TIMEOUT", "FileWatcher", "fingerprint"]

STOP_TIMEOUT = 5.0
"""Seconds stopping waits for a reload in hand."""


def fingerprint(paths: Sequence[str]) -> str | None:
    """sha256 over the files' contents; None while any of them cannot be read."""
    digest = hashlib.sha256()
    try:
        for path in paths:
            with open(path, "rb") as handle:
                digest.update(handle.read())
            digest.update(b"\0")
    except OSError:
        return None
    return digest.hexdigest()


def _signature(paths: Sequence[str]) -> tuple[tuple[int, int, int], ...] | None:
    try:
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in map(os.stat, paths))
    except OSError:
        return None


class FileWatcher(Loop):
    """Calls ``on_change`` when the contents of ``paths`` change (checked every ``interval`` s),
    from a thread of its own (see the module's docstring)."""

    def __init__(
        self,
        paths: Sequence[str],
        on_change: Callable[[], None],
        *,
        interval: float = 1.0,
        name: str = "files",
    ) -> None:
        # Stopping waits for a reload in hand, as long as reading a policy may take.
        super().__init__(f"watch-{name}", stop_timeout=STOP_TIMEOUT)
        self.paths = list(paths)
        self.on_change = on_change
        self.interval = interval
        self.name = name
        self._signature = _signature(self.paths)
        self._fingerprint = fingerprint(self.paths)

    def reset(self) -> None:
        """Forget what was seen, so that the next poll reports the files again."""
        self._signature = None
        self._fingerprint = None

    def poll(self) -> bool:
        """Check once; True when a change was found and handed to ``on_change``."""
        signature = _signature(self.paths)
        if signature == self._signature:
            return False
        self._signature = signature
        current = fingerprint(self.paths)
        if current is None or current == self._fingerprint:
            return False
        self._fingerprint = current
        try:
            self.on_change()
        except Exception:
            logger.exception("reload failed", extra={"fields": {"watch": self.name}})
        return True

    def _run(self) -> None:
        while not self.pause(self.interval):
            self.poll()
