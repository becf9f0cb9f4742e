"""Starting the suite's real components for its fixtures, and what the run's summary shows.

A missing binary skips the test loudly, or fails it when MIRRORGATE_REQUIRE_E2E=1 or CI is
set (as `make test` and CI do), naming the command that provides it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

import pytest

from tests.e2e.harness.binaries import MissingBinaryError, built_binary
from tests.environment import skips_forbidden

_T = TypeVar("_T")

TIMINGS = pytest.StashKey[dict[str, float]]()
FIGURES = pytest.StashKey[dict[str, str]]()
SKIPS = pytest.StashKey[list[str]]()


def skip_or_fail(config: pytest.Config, exc: MissingBinaryError) -> NoReturn:
    if skips_forbidden():
        pytest.fail(
            f"e2e binary missing: {exc} (MIRRORGATE_REQUIRE_E2E=1 or CI is set, so this "
            "is a failure, not a skip)",
            pytrace=False,
        )
    reason = f"E2E NOT RUN: {exc}. Set MIRRORGATE_REQUIRE_E2E=1 to turn this skip into a failure."
    config.stash.setdefault(SKIPS, [])
    if reason not in config.stash[SKIPS]:
        config.stash[SKIPS].append(reason)
    pytest.skip(reason)


def _start(config: pytest.Config, start: Callable[[Path], _T], workdir: Path) -> _T:
    try:
        return start(workdir)
    except MissingBinaryError as exc:
        missing = exc
    # Outside the except block, so the report is not "during handling of ..." noise.
    skip_or_fail(config, missing)


class _Component(Protocol):
    timings: dict[str, float]

    def stop(self) -> None: ...


_C = TypeVar("_C", bound=_Component)


@contextlib.contextmanager
def running(
    config: pytest.Config,
    start: Callable[[Path], _C],
    workdir: Path,
    timings_prefix: str | None = None,
) -> Iterator[_C]:
    """Start a component (a missing binary fails or skips, see above), record its
    start-up timings under `timings_prefix` if given, and stop it afterwards."""
    component = _start(config, start, workdir)
    if timings_prefix is not None:
        config.stash.setdefault(TIMINGS, {}).update(
            {f"{timings_prefix}{k}": v for k, v in component.timings.items()}
        )
    try:
        yield component
    finally:
        component.stop()


def built(request: pytest.FixtureRequest, name: str) -> Path:
    try:
        return built_binary(name)
    except MissingBinaryError as exc:
        missing = exc
    skip_or_fail(request.config, missing)
