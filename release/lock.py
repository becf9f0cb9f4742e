"""What image/requirements.lock puts into the image: the one reading of the lock
that the release's SBOM check and the image tests share."""

from __future__ import annotations

from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

__all__ = ["LOCK", "locked_in_image"]

LOCK = Path(__file__).resolve().parents[1] / "image" / "requirements.lock"
# The image's interpreter: CPython 3.11 on Linux (either architecture).
IMAGE_ENVIRONMENT = {
    "sys_platform": "linux",
    "platform_python_implementation": "CPython",
    "implementation_name": "cpython",
    "platform_system": "Linux",
    "os_name": "posix",
    "python_version": "3.11",
}
# The build backend: locked to build mirrorgate, removed by the Containerfile after.
BUILD_ONLY = {"setuptools"}


def locked_in_image(lock: Path = LOCK) -> dict[str, str]:
    """Canonical name → version of every lock entry whose marker holds in the image,
    except the build backend the Containerfile removes after building."""
    locked: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if not line or line[0] in "# " or "==" not in line:
            continue
        requirement, _, marker = line.rstrip(" \\").partition(";")
        name, _, version = requirement.strip().partition("==")
        if marker.strip() and not Marker(marker.strip()).evaluate(IMAGE_ENVIRONMENT):
            continue
        locked[canonicalize_name(name)] = version
    for name in BUILD_ONLY:
        del locked[name]
    return locked
