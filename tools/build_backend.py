"""setuptools, run on a temporary copy of the source tree so that building leaves no trace.

setuptools writes ``build/`` and ``mirrorgate.egg-info/`` next to pyproject.toml
while it builds, so a plain ``pip install .`` of a clone would leave them
behind. Every hook that builds (wheel, sdist, metadata) runs in a copy
instead; editable installs keep setuptools' own hooks, since they must point
at the tree itself.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401 - the editable hooks, unchanged
    build_editable,
    get_requires_for_build_editable,
    prepare_metadata_for_build_editable,
)

_T = TypeVar("_T")
# Nothing a build reads lives in these; .venv alone can be gigabytes.
_NOT_COPIED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "dev-certs",
)


def _in_a_copy(hook: Callable[..., _T]) -> Callable[..., _T]:
    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> _T:
        # Output directories come as paths relative to the tree, or absolute.
        args = tuple(os.path.abspath(a) if isinstance(a, str) else a for a in args)
        kwargs = {
            k: os.path.abspath(v) if k.endswith("directory") and isinstance(v, str) else v
            for k, v in kwargs.items()
        }
        source = os.getcwd()
        with tempfile.TemporaryDirectory(prefix="mirrorgate-build-") as scratch:
            copy = shutil.copytree(source, os.path.join(scratch, "src"), ignore=_NOT_COPIED)
            os.chdir(copy)
            try:
                return hook(*args, **kwargs)
            finally:
                os.chdir(source)

    return run


build_wheel = _in_a_copy(_setuptools.build_wheel)
build_sdist = _in_a_copy(_setuptools.build_sdist)
prepare_metadata_for_build_wheel = _in_a_copy(_setuptools.prepare_metadata_for_build_wheel)
get_requires_for_build_wheel = _in_a_copy(_setuptools.get_requires_for_build_wheel)
get_requires_for_build_sdist = _in_a_copy(_setuptools.get_requires_for_build_sdist)
