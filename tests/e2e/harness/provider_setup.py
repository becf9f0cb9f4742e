"""A mirrorgate of its own with two project robots' provider plugins, on the real API.

Shared by api/test_credential_providers (the API server) and node/test_credentials
(the node); see api/test_credential_providers for the scenario.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import (
    pod_dict,
    read_secret,
    register_for_suite,
    secret_config,
    suite_namespace,
)
from tests.e2e.harness.kube import create_namespace
from tests.e2e.harness.plugins import plugin_host
from tests.e2e.harness.procs import ManagedProcess, wait_until
from tests.e2e.harness.providers import RobotIssuer, start_issuer
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.suite import DOCKERHUB_MIRROR, Installed

TTL = 15
"""Seconds a minted robot password lives (and the responses' cacheDuration)."""
TEAMS = ("team-a", "team-b")
REPOSITORY, TAG = "hello", "1.0"


def source(team: str) -> str:
    return f"{team}.e2e.example"


@dataclass
class Setup:
    installed: Installed
    server: mg.Mirrorgate
    own_namespace: str
    namespace: str
    issuer: RobotIssuer
    fault_files: dict[str, Path]
    policy: str
    robots: dict[str, str]
    """The robot of each project (its username at the registry)."""
    plugin_host: ManagedProcess | None = None
    """The plugin host the plugins run in, if not in serve."""

    @property
    def registry(self) -> RegistryStack:
        return self.installed.registry

    def mirrored(self, team: str) -> str:
        return f"{self.registry.upstream_host}/{team}/{REPOSITORY}:{TAG}"


def _policy(registry: RegistryStack, on_error: str) -> str:
    up = registry.upstream_host
    return json.dumps(
        {
            "onCredentialError": on_error,
            "mirrors": [
                *({"source": source(t), "mirror": f"{up}/{t}", "credential": t} for t in TEAMS),
                {"source": "docker.io", "mirror": DOCKERHUB_MIRROR},
            ],
            "credentials": {
                t: {"namespaces": ["*"], "registry": f"{up}/{t}", "provider": f"{t}-provider"}
                for t in TEAMS
            },
        },
        indent=2,
    )


@contextlib.contextmanager
def provider_setup(
    installed: Installed,
    workdir: Path,
    *,
    host_env: Mapping[str, str] | None = None,
    plugin_args: Sequence[str] = (),
) -> Iterator[Setup]:
    """A mirrorgate of its own for `installed`'s cluster, with two project robots' plugins:
    run by serve itself, or, with `host_env`, by a `mirrorgate plugin-host` of their own
    with `host_env` added to its environment (`Setup.plugin_host`). `plugin_args` are
    given to every run of the plugin."""
    registry, plane = installed.registry, installed.control_plane
    assert registry.token_server is not None
    issuer = start_issuer(workdir, server=registry.token_server, ca_path=registry.ca_path)
    fault_files = {}
    providers = []
    robots = {t: f"robot-{t}-{secrets.token_hex(2)}" for t in TEAMS}  # one set per setup
    for team in TEAMS:
        issuer.add_robot(robots[team], team)
        fault_files[team] = workdir / f"{team}.fault"
        providers.append(
            issuer.provider(
                f"{team}-provider",
                robots[team],
                match_images=[registry.upstream_host],
                default_cache_duration="1h",  # the response's cacheDuration wins
                args=[
                    "--ttl",
                    str(TTL),
                    "--cache-duration",
                    f"{TTL}s",
                    "--fault-file",
                    str(fault_files[team]),
                    *plugin_args,
                ],
            )
        )
    config = issuer.write_config(workdir / "credential-providers.json", *providers)
    suite = f"prov-{secrets.token_hex(3)}"
    policy = _policy(registry, "skip")
    configuration = f"mirrorgate-e2e-{suite}"
    with contextlib.ExitStack() as stack, plane.api_client() as api:
        runs_plugins = ["--credential-provider-bin-dir", str(issuer.bin_dir)]
        host = None
        if host_env is not None:
            host, socket_path = stack.enter_context(
                plugin_host(workdir, config, issuer.bin_dir, env=host_env, timeout=2)
            )
            runs_plugins = ["--credential-provider-socket", str(socket_path)]
        own = create_namespace(api, f"mg-providers-{secrets.token_hex(3)}")
        user, groups = mg.installed_in(api, own)
        server = mg.start_mirrorgate(
            workdir / "mirrorgate",
            plane,
            policy=policy,
            user=user,
            groups=groups,
            args=[
                "--store",
                "kubernetes",
                "--namespace",
                own,
                "--reconcile-interval",
                "5",
                "--credential-provider-config",
                str(config),
                *runs_plugins,
                "--credential-provider-timeout",
                "2",
            ],
        )
        try:
            register_for_suite(
                api, installed.configuration, server, name=configuration, suite=suite
            )
            namespace = suite_namespace(api, "providers", suite)
            yield Setup(
                installed=installed,
                server=server,
                own_namespace=own,
                namespace=namespace,
                issuer=issuer,
                fault_files=fault_files,
                policy=policy,
                robots=robots,
                plugin_host=host,
            )
        finally:
            mg.unregister(api, configuration)
            server.stop()


def published_login(api: k8s.ApiClient, home: str, team: str) -> dict[str, Any] | None:
    """The login mirrorgate published for ``team`` in its namespace ``home``, if any."""
    return read_secret(api, home, team)


def password_of(secret: Mapping[str, Any]) -> str:
    [entry] = secret_config(secret)["auths"].values()
    return str(entry["password"])


def create_pod(
    api: k8s.ApiClient, namespace: str, images: list[str]
) -> tuple[dict[str, Any], list[str]]:
    name = f"p-{secrets.token_hex(3)}"
    body = pod_dict(name, images[0], extra_images=images[1:])
    return kube.create_pod(api, namespace, body)


def wait_published(
    api: k8s.ApiClient, home: str, team: str, not_password: str | None = None
) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def ready() -> str | None:
        secret = published_login(api, home, team)
        if secret is None:
            return f"no published login for {team}"
        if not_password is not None and password_of(secret) == not_password:
            return f"{team}: not refreshed yet"
        found[:] = [secret]
        return None

    wait_until(ready, timeout=3 * TTL, what=f"a published login for {team}", interval=0.25)
    return found[0]
