"""Session fixtures for the real-component e2e suite: kube-apiserver + etcd, registries.

Fixtures (all need `@pytest.mark.e2e` on the test):
  control_plane   session  ControlPlane: .url .kubeconfig .ca_pem .ca_path .api_client()
  registry        session  RegistryStack: .host .username .password .ca_path .digest
                           .upstream_image .mirror_image .pull(image, dockerconfigjson)
  own_registry    module   another RegistryStack, for tests that stop and restart its mirror
  make_namespace  function make_namespace(labels=None) -> name; `namespace` is an alias
  kustomize       session  Path of the pinned kustomize binary
  promtool        session  Path of the pinned promtool binary
  helm            session  Path of the pinned helm binary
  own_control_plane module a control plane of the test module's own (for installs that
                           need the cluster-scoped names the session's mirrorgate holds)
  installed       session  Installed: mirrorgate serving `control_plane`, registered

Node fixtures (need `@pytest.mark.node`, which implies `e2e`; started only when used):
  node_cluster    session  Node: a separate cluster with a real kubelet, containerd,
                           controller-manager and scheduler (see tests/e2e/node.py)
  node_installed  session  Release: mirrorgate installed on the node cluster from its
                           image with `helm install` (tests/e2e/incluster.py), with the
                           policy of `node_policy` (granted namespaces: `granted-*`);
                           needs `@pytest.mark.image` too

A missing binary skips these tests loudly, or fails them when MIRRORGATE_REQUIRE_E2E=1
or CI is set (as `make test` and CI do), naming the command that provides it.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import pytest
from kubernetes import client as k8s

from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import MissingBinaryError, built_binary
from tests.e2e.harness.controlplane import ControlPlane, start_control_plane
from tests.e2e.harness.kube import create_namespace, namespace_name
from tests.e2e.harness.node import Node, start_node
from tests.e2e.harness.registry import RegistryStack, start_registry_stack
from tests.environment import skips_forbidden

if TYPE_CHECKING:
    from tests.e2e.harness.incluster import Release

MakeNamespace = Callable[..., str]
_T = TypeVar("_T")

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
_TIMINGS = pytest.StashKey[dict[str, float]]()
_FIGURES = pytest.StashKey[dict[str, str]]()
_SKIPS = pytest.StashKey[list[str]]()


def _missing(config: pytest.Config, exc: MissingBinaryError) -> NoReturn:
    if skips_forbidden():
        pytest.fail(
            f"e2e binary missing: {exc} (MIRRORGATE_REQUIRE_E2E=1 or CI is set, so this "
            "is a failure, not a skip)",
            pytrace=False,
        )
    reason = f"E2E NOT RUN: {exc}. Set MIRRORGATE_REQUIRE_E2E=1 to turn this skip into a failure."
    config.stash.setdefault(_SKIPS, [])
    if reason not in config.stash[_SKIPS]:
        config.stash[_SKIPS].append(reason)
    pytest.skip(reason)


def _start(config: pytest.Config, start: Callable[[Path], _T], workdir: Path) -> _T:
    try:
        return start(workdir)
    except MissingBinaryError as exc:
        missing = exc
    # Outside the except block, so the report is not "during handling of ..." noise.
    _missing(config, missing)


class _Component(Protocol):
    timings: dict[str, float]

    def stop(self) -> None: ...


_C = TypeVar("_C", bound=_Component)


@contextlib.contextmanager
def _running(
    config: pytest.Config,
    start: Callable[[Path], _C],
    workdir: Path,
    timings_prefix: str | None = None,
) -> Iterator[_C]:
    """Start a component (a missing binary fails or skips, see above), record its
    start-up timings under `timings_prefix` if given, and stop it afterwards."""
    component = _start(config, start, workdir)
    if timings_prefix is not None:
        config.stash.setdefault(_TIMINGS, {}).update(
            {f"{timings_prefix}{k}": v for k, v in component.timings.items()}
        )
    try:
        yield component
    finally:
        component.stop()


def _uses_fixture(item: pytest.Item, fixtures: frozenset[str]) -> bool:
    if _HERE not in item.path.parents:
        return False  # these fixtures exist only under tests/e2e/
    callspec = getattr(item, "callspec", None)
    parametrized = set(callspec.params) if callspec is not None else set()
    # A parametrize argument shadows a fixture of the same name (e.g. `namespace`).
    return bool(fixtures.intersection(getattr(item, "fixturenames", ())) - parametrized)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `node` must imply `e2e` by then
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse e2e (node) fixtures without the `e2e` (`node`) marker, and the node's Helm
    release without `installed` and `image`, so -m works.

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


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A real etcd + kube-apiserver (RBAC, default admission plugins) for the session."""
    with _running(
        request.config,
        start_control_plane,
        tmp_path_factory.mktemp("controlplane"),
        timings_prefix="",
    ) as plane:
        yield plane


@pytest.fixture(scope="session")
def registry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RegistryStack]:
    """Token-auth upstream + TLS/htpasswd pull-through mirror, upstream seeded."""
    with _running(
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
    with _running(
        request.config, start_registry_stack, tmp_path_factory.mktemp("own-registry")
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def own_control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A second etcd + kube-apiserver, for one test module only."""
    with _running(
        request.config, start_control_plane, tmp_path_factory.mktemp("own-plane")
    ) as plane:
        yield plane


def _built(request: pytest.FixtureRequest, name: str) -> Path:
    try:
        return built_binary(name)
    except MissingBinaryError as exc:
        missing = exc
    _missing(request.config, missing)


@pytest.fixture(scope="session")
def kustomize(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned kustomize binary built by tests/controlplane/build.sh."""
    return _built(request, "kustomize")


@pytest.fixture(scope="session")
def promtool(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned promtool binary built by tests/controlplane/build.sh."""
    return _built(request, "promtool")


@pytest.fixture(scope="session")
def e2e_figures(request: pytest.FixtureRequest) -> dict[str, str]:
    """Figures a test measured, printed in the run's summary ("e2e figures")."""
    return request.config.stash.setdefault(_FIGURES, {})


@pytest.fixture(scope="session")
def helm(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned helm binary built by tests/controlplane/build.sh."""
    return _built(request, "helm")


@pytest.fixture(scope="session")
def actionlint(request: pytest.FixtureRequest) -> Path:
    """Path of the pinned actionlint binary built by tests/controlplane/build.sh."""
    return _built(request, "actionlint")


@pytest.fixture
def make_namespace(
    control_plane: ControlPlane, request: pytest.FixtureRequest
) -> Generator[MakeNamespace, None, None]:
    """Factory: make_namespace(labels=None) -> name of a new namespace with `default` SA.

    Namespaces are never deleted: with no namespace controller they would stay
    Terminating forever, and unique names keep tests independent anyway.
    """
    with control_plane.api_client() as api:

        def make(labels: Mapping[str, str] | None = None) -> str:
            return create_namespace(api, namespace_name(request.node.name), labels)

        yield make


@pytest.fixture
def namespace(make_namespace: MakeNamespace) -> MakeNamespace:
    """Alias of `make_namespace`."""
    return make_namespace


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
    timings = config.stash.get(_TIMINGS, {})
    if timings:
        terminalreporter.section("e2e start-up timings")
        for key, seconds in sorted(timings.items()):
            terminalreporter.line(f"{key:32} {seconds:7.3f} s")
    figures = config.stash.get(_FIGURES, {})
    if figures:
        terminalreporter.section("e2e figures")
        for key, value in figures.items():
            terminalreporter.line(f"{key}: {value}")
    for reason in config.stash.get(_SKIPS, []):
        terminalreporter.section("E2E SKIPPED", yellow=True, bold=True)
        terminalreporter.line(reason, yellow=True, bold=True)


CREDENTIAL = "e2e-mirror"
RECONCILE_INTERVAL = 5.0
"""The session server's --reconcile-interval (seconds)."""
DOCKERHUB_MIRROR = "mirror.e2e.example/dockerhub"


def e2e_policy(registry: RegistryStack, *, extra: str = "") -> str:
    """The suite's policy: the test upstream goes to the authenticated mirror."""
    return (
        f"mirrors:\n"
        f"  - source: {registry.upstream_host}\n"
        f"    mirror: {registry.host}\n"
        f"    credential: {CREDENTIAL}\n"
        f"  - source: docker.io\n"
        f"    mirror: {DOCKERHUB_MIRROR}\n"
        f"credentials:\n"
        f"  {CREDENTIAL}: {{namespaces: ['*']}}\n{extra}"
    )


def central_credential(
    api: k8s.ApiClient,
    registry: RegistryStack,
    *,
    name: str = CREDENTIAL,
    password: str | None = None,
    host: str | None = None,
) -> None:
    """What `kubectl create secret docker-registry NAME ... -n mirrorgate` makes (or updates).

    ``host`` is the `--docker-server` (default: the registry's mirror).
    """
    payload = json.dumps(registry.dockerconfigjson(password=password, host=host)).encode()
    body = k8s.V1Secret(
        metadata=k8s.V1ObjectMeta(name=name, namespace=mg.NAMESPACE),
        type="kubernetes.io/dockerconfigjson",
        data={".dockerconfigjson": base64.b64encode(payload).decode()},
    )
    core = k8s.CoreV1Api(api)
    try:
        core.create_namespaced_secret(mg.NAMESPACE, body)
    except k8s.ApiException as error:
        if error.status != 409:
            raise
        core.replace_namespaced_secret(name, mg.NAMESPACE, body)


@dataclass
class Installed:
    """mirrorgate running against the control plane, registered through the base manifests."""

    server: mg.Mirrorgate
    configuration: dict[str, Any]
    registry: RegistryStack
    control_plane: ControlPlane


def pod(
    installed: Installed, *, name: str = "web", labels: dict[str, str] | None = None
) -> k8s.V1Pod:
    """A Pod with an image on the test upstream (needs the credential) and a Docker Hub one."""
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels),
        spec=k8s.V1PodSpec(
            init_containers=[k8s.V1Container(name="init", image="busybox:1.36")],
            containers=[
                k8s.V1Container(name="app", image=installed.registry.upstream_image),
                k8s.V1Container(name="sidecar", image="docker.io/library/nginx:1.27"),
            ],
        ),
    )


@contextlib.contextmanager
def install_mirrorgate(
    control_plane: ControlPlane,
    registry: RegistryStack,
    kustomize: Path,
    workdir: Path,
    policy: str,
) -> Iterator[Installed]:
    """mirrorgate with the kubernetes credential store and the RBAC of manifests/base."""
    with control_plane.api_client() as api:
        mg.install_base(api, kustomize)
        central_credential(api, registry)
        # A short reconcile interval: a deleted copy is re-asserted within it.
        server = mg.start_mirrorgate(
            workdir,
            control_plane,
            policy=policy,
            args=["--store", "kubernetes", "--reconcile-interval", str(RECONCILE_INTERVAL)],
            redact=[registry.password],
        )
        configuration = mg.webhook_configuration(kustomize)
        mg.register(api, configuration, server, excluded_labels=mg.OWN_WEBHOOK_LABELS)
        try:
            yield Installed(
                server=server,
                configuration=configuration,
                registry=registry,
                control_plane=control_plane,
            )
        finally:
            mg.unregister(api, "mirrorgate")
            server.stop()


@pytest.fixture(scope="session")
def installed(
    control_plane: ControlPlane,
    registry: RegistryStack,
    kustomize: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installed]:
    """The session's mirrorgate: kubernetes credential store, RBAC of manifests/base."""
    with install_mirrorgate(
        control_plane,
        registry,
        kustomize,
        tmp_path_factory.mktemp("mirrorgate"),
        e2e_policy(registry),
    ) as found:
        yield found


GRANTED_PREFIX = "granted-"


def node_policy(registry: RegistryStack) -> str:
    """The node cluster's policy: the mirror's credential only for `granted-*` namespaces."""
    return (
        f"mirrors:\n"
        f"  - source: {registry.upstream_host}\n"
        f"    mirror: {registry.host}\n"
        f"    credential: {CREDENTIAL}\n"
        f"credentials:\n"
        f"  {CREDENTIAL}: {{namespaces: ['{GRANTED_PREFIX}*']}}\n"
    )


@pytest.fixture(scope="session")
def node_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    """A one-node cluster of its own (kubelet, containerd, controllers, registries on its
    bridge), under the machine lock.

    Its teardown fails the session if the host is left changed (sysctls,
    iptables chains, cgroups, mounts, network namespaces, fixed paths).
    """
    with _running(request.config, start_node, tmp_path_factory.mktemp("node")) as node:
        request.config.stash.setdefault(_TIMINGS, {}).update(
            {
                **{f"node_{k}": v for k, v in node.control_plane.timings.items()},
                **{f"node_{k}": v for k, v in node.timings.items()},
            }
        )
        # Printed as "node runtime: containerd vX.Y.Z" under "e2e figures".
        request.config.stash.setdefault(_FIGURES, {})["node runtime"] = (
            f"containerd {node.runtime.version}"
        )
        yield node


@pytest.fixture(scope="session")
def node_installed(
    node_cluster: Node, helm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    """mirrorgate installed on the node cluster from its image by `helm install` of its chart
    (tests/e2e/incluster.py): the policy of `node_policy`, probes on, enforce."""
    from tests.e2e.harness.incluster import installed_release  # it imports this module's helpers

    with installed_release(node_cluster, helm, tmp_path_factory.mktemp("node-release")) as found:
        yield found
