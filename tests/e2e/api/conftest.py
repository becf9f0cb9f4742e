"""The API server's fixtures (all need `@pytest.mark.e2e` on the test):
control_plane   session  ControlPlane: .url .kubeconfig .ca_pem .ca_path .api_client()
make_namespace  function make_namespace(labels=None) -> name; `namespace` is an alias
own_control_plane module a control plane of the test module's own (for installs that
                         need the cluster-scoped names the session's mirrorgate holds)
installed       session  Installed: mirrorgate serving `control_plane`, registered
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from pathlib import Path

import pytest

from tests.e2e.harness.components import running
from tests.e2e.harness.controlplane import ControlPlane, start_control_plane
from tests.e2e.harness.kube import create_namespace, namespace_name
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.suite import Installed, MakeNamespace, e2e_policy, install_mirrorgate


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A real etcd + kube-apiserver (RBAC, default admission plugins) for the session."""
    with running(
        request.config,
        start_control_plane,
        tmp_path_factory.mktemp("controlplane"),
        timings_prefix="",
    ) as plane:
        yield plane


@pytest.fixture(scope="module")
def own_control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A second etcd + kube-apiserver, for one test module only."""
    with running(
        request.config, start_control_plane, tmp_path_factory.mktemp("own-plane")
    ) as plane:
        yield plane


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
