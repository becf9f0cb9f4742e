"""One JSON object per log line, for log pipelines.

Callers pass fields explicitly (``extra={"fields": {...}}``); nothing logs a
whole object, so a Pod spec or a Secret cannot end up in the logs by accident.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from typing import Any

import orjson

__all__ = ["JsonFormatter", "configure", "logger"]

logger = logging.getLogger("mirrorgate")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
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


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("mirrorgate", "uvicorn", "uvicorn.error"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(level.upper())
        log.propagate = False
    # One line per admission is ours; uvicorn's access log would double it.
    logging.getLogger("uvicorn.access").disabled = True
