"""What the benchmarks measured last, kept in bench/results.json for docs/development.md.

Each benchmark prints its report as usual and records the same text under
its section; ``python -m bench.figures`` renders the figures of docs/development.md from
the file, so that they are always those of the last run.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "capture", "load", "record"]

RESULTS = Path(__file__).resolve().parent / "results.json"


def load(path: Path = RESULTS) -> dict[str, Any]:
    """Every recorded section; empty before the first run."""
    if not path.exists():
        return {}
    value = json.loads(path.read_text())
    assert isinstance(value, dict)
    return value


def record(section: str, report: str, *, command: str, path: Path = RESULTS) -> None:
    """Keep ``report`` (Markdown) as the latest figures of ``section``."""
    results = load(path)
    results[section] = {
        "command": command,
        "measured": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "report": report.strip("\n"),
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    temporary.replace(path)


class _Tee(io.TextIOBase):
    def __init__(self, *streams: io.TextIOBase | Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def capture(section: str, *, command: str, path: Path = RESULTS) -> Iterator[None]:
    """Print as usual inside the block, and record what was printed as ``section``."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, printed)):
        yield
    record(section, printed.getvalue(), command=command, path=path)
