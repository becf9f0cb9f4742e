"""The e2e suite's hooks and the fixtures its folders share: registries and pinned binaries.

Fixtures here (all need `@pytest.mark.e2e` on the test; api/conftest.py holds the API
server's, node/conftest.py the node's):
  registry        session  RegistryStack: .host .username .password .ca_path .digest
                           .upstream_image .mirror_image .pull(image, dockerconfigjson)
  own_registry    module   another RegistryStack, for tests that stop and restart its mirror
  kustomize       session  Path of the pinned kustomize binary
  promtool        session  Path of the pinned promtool binary
  helm            session  Path of the pinned helm binary
  actionlint      session  Path of the pinned actionlint binary
  e2e_figures     session  figures a test measured, printed in the run's summary

A missing binary skips these tests loudly, or fails them when MIRRORGATE_REQUIRE_E2E=1
or CI is set (as `make test` and CI do), naming the command that provides it.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness.components import FIGURES, SKIPS, TIMINGS, built, running
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.node import Node
from tests.e2e.harness.registry import RegistryStack, start_registry_stack
from tests.e2e.harness.suite import Installed

_HERE = Path(__file__).resolve().parent
E2E_FIXTURES = frozenset(
    {
        "control_plane",
        "registry",
        "own_registry",
        "make_namespace",
        "namespace",
        "kustomize",
        "promtool",
        "installed",
        "helm",
        "own_control_plane",
    }
)
NODE_FIXTURES = frozenset({"node_cluster", "node_installed"})


def _uses_fixture(item: pytest.Item, fixtures: frozenset[str]) -> bool:
    if _HERE not in item.path.parents:
        return False  # these fixtures exist only under tests/e2e/
    callspec = getattr(item, "callspec", None)
    parametrized = set(callspec.params) if callspec is not None else set()
    # A parametrize argument shadows a fixture of the same name (e.g. `namespace`).
    return bool(fixtures.intersection(getattr(item, "fixturenames", ())) - parametrized)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `node` must imply `e2e` by then
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse e2e (node) fixtures without the `e2e` (`node`) marker, the node's Helm
    release without `installed` and `image`, so -m works, and a node test outside node/.

    `node` implies `e2e`: `-m e2e` runs the node tests too, `-m "not e2e"` none.
    """
    for item in items:
        if item.get_closest_marker("node") is not None and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
    # The node self-test starts a node of its own: first, before any session node runs.
    items.sort(key=lambda item: item.get_closest_marker("node_selftest") is None)
    # The release is mirrorgate's image installed by its chart: `-m installed` (and
    # `-m image`) must select every test that uses it.
    release = frozenset({"node_installed"})
    for fixtures, marker in (
        (E2E_FIXTURES | NODE_FIXTURES, "e2e"),
        (NODE_FIXTURES, "node"),
        (release, "installed"),
        (release, "image"),
    ):
        unmarked = [
            item.nodeid
            for item in items
            if _uses_fixture(item, fixtures) and item.get_closest_marker(marker) is None
        ]
        if unmarked:
            raise pytest.UsageError(
                f"these tests use {marker} fixtures but lack @pytest.mark.{marker}: "
                + ", ".join(unmarked)
            )
    # The folders say what a test needs: node/ holds the node tests, and only it.
    misplaced = [
        item.nodeid
        for item in items
        if _HERE in item.path.parents
        and (item.get_closest_marker("node") is not None) != (_HERE / "node" in item.path.parents)
    ]
    if misplaced:
        raise pytest.UsageError(
            "node-marked tests belong in tests/e2e/node/, and only they: " + ", ".join(misplaced)
        )


@pytest.fixture(scope="session")
def registry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RegistryStack]:
    """Token-auth upstream + TLS/htpasswd pull-through mirror, upstream seeded."""
    with running(
        request.config,
        start_registry_stack,
        tmp_path_factory.mktemp("registry"),
        timings_prefix="registry_",
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def own_registry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RegistryStack]:
    """A registry stack of the test module's own, whose mirror it may stop and restart."""
    with running(
        request.config, start_registry_stack, tmp_path_factory.mktemp("own-registry")
    ) as stack:
        yield stack


@pytest.fixture(scope="session")
def kustomize(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned kustomize binary built by tests/controlplane/build.sh."""
    return built(request, "kustomize")


@pytest.fixture(scope="session")
def kubectl(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned kubectl binary built by tests/controlplane/build.sh."""
    return built(request, "kubectl")


@pytest.fixture(scope="session")
def promtool(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned promtool binary built by tests/controlplane/build.sh."""
    return built(request, "promtool")


@pytest.fixture(scope="session")
def e2e_figures(request: pytest.FixtureRequest) -> dict[str, str]:
    """Figures a test measured, printed in the run's summary ("e2e figures")."""
    return request.config.stash.setdefault(FIGURES, {})


@pytest.fixture(scope="session")
def helm(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned helm binary built by tests/controlplane/build.sh."""
    return built(request, "helm")


@pytest.fixture(scope="session")
def actionlint(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned actionlint binary built by tests/controlplane/build.sh."""
    return built(request, "actionlint")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On failure, attach the control plane's and registries' log tails to the report."""
    report = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name, title in (
            ("control_plane", "control plane"),
            ("registry", "registries"),
            ("node_cluster", "node"),
        ):
            component = funcargs.get(name)
            if isinstance(component, ControlPlane | RegistryStack | Node):
                report.sections.append((f"{title} logs (tail)", component.describe()))
        installed = funcargs.get("installed")
        if isinstance(installed, Installed):
            report.sections.append(
                ("installed: mirrorgate log (tail)", installed.server.process.describe_failure(40))
            )
        release = funcargs.get("node_installed")
        if release is not None:
            report.sections.append(("node_installed: replicas' logs (tail)", release.describe()))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print start-up timings, and repeat any e2e skip so it cannot go unnoticed."""
    config = terminalreporter.config
    timings = config.stash.get(TIMINGS, {})
    if timings:
        terminalreporter.section("e2e start-up timings")
        for key, seconds in sorted(timings.items()):
            terminalreporter.line(f"{key:32} {seconds:7.3f} s")
    figures = config.stash.get(FIGURES, {})
    if figures:
        terminalreporter.section("e2e figures")
        for key, value in figures.items():
            terminalreporter.line(f"{key}: {value}")
    for reason in config.stash.get(SKIPS, []):
        terminalreporter.section("E2E SKIPPED", yellow=True, bold=True)
        terminalreporter.line(reason, yellow=True, bold=True)
