"""One JSON object per log line, for log pipelines.

Callers pass fields explicitly (``extra={"fields": {...}}``); nothing logs a
whole object, so a Pod spec or a Secret cannot end up in the logs by accident.

The admission path logs one line per request, so the production set-up
avoids the costs the stdlib charges by default: no caller lookup (a frame
walk per record), no thread or process names, a timestamp formatted once a
second, and lines written to a block-buffered stream that :func:`flush`
empties every second (warnings and errors are flushed at once).

A warning that anyone who reaches the port can cause at will is written
through a :class:`Sampled`, within a budget.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
import weakref
from typing import Any, TextIO

import orjson

__all__ = ["JsonFormatter", "Sampled", "admission", "configure", "flush", "logger"]

logger = logging.getLogger("mirrorgate")

_stream: TextIO | None = None
_formatter: JsonFormatter | None = None
_sampled: weakref.WeakSet[Sampled] = weakref.WeakSet()


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.timestamp(record.created),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info and record.exc_info[0] is not None:
            # The type and where it was raised, never the message: messages of
            # client-library errors can quote request or response bodies.
            entry["error_type"] = record.exc_info[0].__name__
            entry["error_at"] = [
                f"{f.filename}:{f.lineno} {f.name}"
                for f in traceback.extract_tb(record.exc_info[2])
            ][-5:]
        return orjson.dumps(entry, default=str).decode()


class _BufferedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes without a flush per line; warnings and errors flush at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + "\n")
            if record.levelno >= logging.WARNING:
                self.stream.flush()
        except Exception:
            self.handleError(record)


def admission(fields: dict[str, Any]) -> None:
    """The one line per admission.

    Once :func:`configure` has run, it is formatted and written straight to
    the stream: a LogRecord costs more than everything else in the line.
    Before that (in tests, embedded use) it goes through ``logger`` as usual.
    """
    if _stream is not None and _formatter is not None:
        if logger.isEnabledFor(logging.INFO):
            entry = {
                "time": _formatter.timestamp(time.time()),
                "level": "info",
                "msg": "admission",
                **fields,
            }
            _stream.write(orjson.dumps(entry, default=str).decode() + "\n")
    else:
        logger.info("admission", extra={"fields": fields})


def configure(level: str = "info") -> None:
    global _stream, _formatter
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # skips the caller lookup (a frame walk per record)
    # A private, block-buffered handle on stderr: sys.stderr flushes every line.
    _stream = open(  # noqa: SIM115 - lives as long as the process
        os.dup(sys.stderr.fileno()),
        "w",
        buffering=1 << 16,
        encoding="utf-8",
        closefd=True,
    )
    handler = _BufferedHandler(_stream)
    _formatter = JsonFormatter()
    handler.setFormatter(_formatter)
    for name in ("mirrorgate", "uvicorn", "uvicorn.error"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(level.upper())
        log.propagate = False
    # One line per admission is ours; uvicorn's access log would double it.
    logging.getLogger("uvicorn.access").disabled = True


class Sampled:
    """One warning, written within a budget: a client could otherwise cause it at will.

    In each ``interval`` seconds the first ``burst`` occurrences are written
    in full, and so is the first of each kind never seen before (up to
    ``kinds`` kinds remembered for the life of the process); the others are
    counted, and once the interval is over one line says how many were left
    out (written by :func:`flush`, or by the next occurrence).
    """

    def __init__(self, message: str, *, burst: int, interval: float, kinds: int = 256) -> None:
        self.message, self.burst, self.interval, self.kinds = message, burst, interval, kinds
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # flush() may come from another server's thread (tests)
        self._since, self._written, self._left_out = time.monotonic(), 0, 0
        _sampled.add(self)

    def warning(self, kind: str, fields: dict[str, Any]) -> None:
        with self._lock:
            self._summarize(time.monotonic())
            new = kind not in self._seen and len(self._seen) < self.kinds
            if new:
                self._seen.add(kind)
            if not new and self._written >= self.burst:
                self._left_out += 1
                return
            self._written += 1
        logger.warning(self.message, extra={"fields": fields})

    def summarize(self) -> None:
        """Say how many were left out, once their interval is over."""
        with self._lock:
            self._summarize(time.monotonic())

    def _summarize(self, now: float) -> None:
        if now - self._since < self.interval:
            return
        if self._left_out:
            logger.warning(
                f"{self.message}: more not logged",
                extra={
                    "fields": {"not_logged": self._left_out, "seconds": round(now - self._since, 1)}
                },
            )
        self._since, self._written, self._left_out = now, 0, 0


def flush() -> None:
    """Write out buffered lines (the server calls this every second and at exit)."""
    for sampled in list(_sampled):
        sampled.summarize()
    if _stream is not None:
        _stream.flush()
