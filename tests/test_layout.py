"""The source tree keeps the shape docs/development.md describes: small modules with one job."""

from __future__ import annotations

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
# The packages a newcomer reads first; every module there should fit in one sitting.
PACKAGES = ("policy", "webhook", "certs")
MAX_LINES = 450


def test_no_module_is_over_the_line_budget() -> None:
    modules = [path for package in PACKAGES for path in (REPOSITORY / package).rglob("*.py")]
    # A moved tree would make the check vacuous.
    assert len(modules) > 50
    sizes = {
        str(path.relative_to(REPOSITORY)): len(path.read_text(encoding="utf-8").splitlines())
        for path in modules
    }
    over = {name: lines for name, lines in sorted(sizes.items()) if lines > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines (split by job, in a pure-move commit): {over}"
