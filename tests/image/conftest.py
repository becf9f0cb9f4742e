"""Session fixture: the mirrorgate image, built once per run (podman's layer
cache makes an unchanged rebuild take seconds, so every run checks the
Containerfile as it is now)."""

from __future__ import annotations

import pytest

from tests.image.podman import build


@pytest.fixture(scope="session")
def image() -> str:
    """The image `make image` builds here (the base made from Debian's packages)."""
    return build("build.sh", env={"TAG": "localhost/mirrorgate:under-test"})
