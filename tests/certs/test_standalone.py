"""``certs`` stands alone: importing it pulls in no other project or server package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("webhook", "policy", "kubernetes", "starlette", "uvicorn")


def test_import_certs_loads_no_forbidden_packages() -> None:
    """A fresh interpreter importing certs has none of the forbidden packages loaded."""
    code = (
        "import sys, certs\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
