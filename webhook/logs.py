"""One JSON object per log line, for log pipelines.

Callers pass fields explicitly (``extra={"fields": {...}}``); nothing logs a
whole object, so a Pod spec or a Secret cannot end up in the logs by accident.

The admission path logs one line per request, so the production set-up
avoids the costs the stdlib charges by default: no caller lookup (a frame
walk per record), no thread or process names, a timestamp formatted once a
second, and lines written to a block-buffered stream that :func:`flush`
empties every second (warnings and errors are flushed at once).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from typing import Any, TextIO

import orjson

__all__ = ["JsonFormatter", "admission", "configure", "flush", "logger"]

logger = logging.getLogger("mirrorgate")

_stream: TextIO | None = None
_formatter: JsonFormatter | None = None


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
            entry["error_at"] = [f"{f.filename}:{f.lineno} {f.name}"
                                 for f in traceback.extract_tb(record.exc_info[2])][-5:]
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
            entry = {"time": _formatter.timestamp(time.time()), "level": "info",
                     "msg": "admission", **fields}
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
    _stream = open(os.dup(sys.stderr.fileno()), "w", buffering=1 << 16,  # noqa: SIM115
                   encoding="utf-8", closefd=True)
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


def flush() -> None:
    """Write out buffered lines (the server calls this every second and at exit)."""
    if _stream is not None:
        _stream.flush()
