"""image/requirements.lock, read: it pins every runtime dependency by hash (no
podman needed; `make lock` rewrites it from pyproject.toml)."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.image.podman import REPO_ROOT

LOCK = (REPO_ROOT / "image" / "requirements.lock").read_text()
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
# One entry: "name==version [; marker] \" then its "--hash=sha256:..." lines.
ENTRY = re.compile(
    r"^([A-Za-z0-9._-]+)==(\S+)[^\n]*\n"
    r"((?:    --hash=sha256:[0-9a-f]{64}[ \\]*\n)+)",
    re.MULTILINE,
)


def _pins() -> dict[str, str]:
    return {canonicalize_name(m[1]): m[2] for m in ENTRY.finditer(LOCK)}


def test_every_entry_is_pinned_exactly_with_hashes() -> None:
    """Each requirement line is name==version followed by at least one sha256."""
    entries = [line for line in LOCK.splitlines() if line and line[0] not in "# "]
    assert entries, "the lock is empty"
    assert len(entries) == len(ENTRY.findall(LOCK))


def test_pins_satisfy_pyproject_and_the_build_backend() -> None:
    """Every runtime dependency and the build backend are in the lock, at a
    version their specifiers accept."""
    pins = _pins()
    wanted = [*PYPROJECT["project"]["dependencies"], *PYPROJECT["build-system"]["requires"]]
    for text in wanted:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in image/requirements.lock"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} ∉ {text}"
