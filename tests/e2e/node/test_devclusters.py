"""Dev clusters' caches on a real node (containerd 2): issue #22's scenarios.

A kind cluster's node pulls through a local pull-through cache, usually
plain HTTP, and reaches it by an address that is not loopback. Here the
caches listen on the node's bridge address (the host side of the Pods'
network, where the node's own registries listen too): containerd treats loopback
registries specially (it falls back to HTTP and skips verification for them),
so only a non-loopback address shows that the runtime does what the exported
``hosts.toml`` says, and nothing else.

* a plain-HTTP cache without a login: Pods rewritten to it pull over HTTP,
  with only the hosts.toml `mirrorgate export containerd` writes for it;
* an HTTPS cache with a login and a private-CA certificate: the ``ca`` comes
  from the export, the login from mirrorgate (`credentials add
  --from-docker-config`, then the pull secret it attaches);
* scenario 1 of the node suite on containerd 2 with the deprecated
  ``registry.configs.*.auth``: what that node-wide login does there;
* two mirrors for one source (issue #32): with the first stopped, Pods are
  served from the second, with the second's login only.

`containerd` in a registry's access log is the node; `Go-http-client` in the
upstream's is a cache filling itself.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.commands import MIRRORGATE
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness import nodepods
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.fixtures_secrets import (
    register_for_suite,
    suite_namespace,
)
from tests.e2e.harness.incluster import Release
from tests.e2e.harness.kube import create_namespace, create_pod, namespace_name
from tests.e2e.harness.node import GATEWAY, Node
from tests.e2e.harness.nodepods import Workload, by_node, manifest_statuses, push_workload
from tests.e2e.harness.noderuntime import deprecated_registry_auth
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import DevCache, start_dev_cache

# The dev mirrorgate is confined by the release's mirrorgate-writes (`node_installed`).
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.installed, pytest.mark.image]

CACHE_FILLING = "Go-http-client"
LOGIN = "dev-cache"
# The bridge's own address, made by the node before anything else (node.py).
NODE_ADDRESS = GATEWAY


@dataclass
class Dev:
    """The two caches, the mirrorgate that rewrites to them, a namespace it serves."""

    node: Node
    plain: DevCache
    tls: DevCache
    first: DevCache
    """The first mirror of the failover rule (plain HTTP, anonymous); its test stops it."""
    server: mg.Mirrorgate
    api: k8s.ApiClient
    namespace: str
    policy_file: Path

    def export(self, out: Path) -> tuple[dict[str, str], str]:
        """`mirrorgate export containerd` of the policy: files written, and stderr."""
        done = subprocess.run(
            [
                *MIRRORGATE,
                "export",
                "containerd",
                "--policy",
                str(self.policy_file),
                "--out",
                str(out),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode in (0, 1), done.stderr  # 1: rules it cannot express, named
        return {
            str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("hosts.toml"))
        }, done.stderr

    def pod(self, workload: Workload, hint: str) -> tuple[str, str]:
        """A Pod of the upstream ``workload``; returns its name and the image admitted."""
        name = f"{hint}-{secrets.token_hex(3)}"
        created, _ = create_pod(
            self.api,
            self.namespace,
            nodepods.pod(name, [nodepods.container("app", workload.image)]),
        )
        return name, str(created["spec"]["containers"][0]["image"])


def dev_policy(upstream: str, plain: DevCache, tls: DevCache, first: DevCache) -> str:
    """Two paths of the upstream, each through one cache (a cache proxies the whole
    upstream at its root, so ``upstream/P/x`` is ``cache/P/x``), and a third through two
    caches in order: ``first``, then the login cache. Probes are frequent, so that a
    stopped cache is seen down within seconds (and patient: the test machine is shared)."""
    return (
        f"mirrors:\n"
        f"  - source: {upstream}/plain\n"
        f"    mirror: http://{plain.host}/plain\n"
        f"  - source: {upstream}/tls\n"
        f"    mirror: https://{tls.host}/tls\n"
        f"    caFile: {tls.ca_path}\n"
        f"    credential: {LOGIN}\n"
        f"  - source: {upstream}/failover\n"
        f"    mirror:\n"
        f"      - http://{first.host}/failover\n"
        f"      - url: https://{tls.host}/failover\n"
        f"        caFile: {tls.ca_path}\n"
        f"        credential: {LOGIN}\n"
        f"credentials:\n  {LOGIN}: {{namespaces: ['*']}}\n"
        f"health: {{interval: 1s, timeout: 900ms, failureThreshold: 2}}\n"
    )


def _docker_config(path: Path, cache: DevCache) -> Path:
    """What `docker login HOST` writes."""
    assert cache.username is not None
    assert cache.password is not None
    auth = base64.b64encode(f"{cache.username}:{cache.password}".encode()).decode()
    path.write_text(json.dumps({"auths": {cache.host: {"auth": auth}}}))
    path.chmod(0o600)
    return path


def _mirrorgate_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MIRRORGATE, *args], cwd=REPO_ROOT, capture_output=True, text=True, input=stdin, timeout=60
    )


@pytest.fixture(scope="module")
def dev(
    node_cluster: Node,
    node_installed: Release,
    kustomize: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Dev]:
    """A dev cluster's mirrorgate beside the session's release: a process of this module
    with the file store, in a namespace of its own (its Lease and key there, confined
    there by the release's ValidatingAdmissionPolicy), registered for this module's
    namespace only. The release leaves that namespace's Pods alone: it has no grant.

    ``node_installed`` is asked for so that the release, and the mirrorgate-writes it
    installs, exist even when this module runs alone."""
    node, stack = node_cluster, node_cluster.registry
    workdir = tmp_path_factory.mktemp("dev-caches")
    with contextlib.ExitStack() as stop:
        plain = start_dev_cache(
            stack, workdir / "plain", address=NODE_ADDRESS, tls=False, login=False
        )
        stop.callback(plain.process.stop)
        tls = start_dev_cache(stack, workdir / "tls", address=NODE_ADDRESS, tls=True, login=True)
        stop.callback(tls.process.stop)
        first = start_dev_cache(
            stack, workdir / "first", address=NODE_ADDRESS, tls=False, login=False
        )
        stop.callback(first.process.stop)
        policy_file = workdir / "policy.yaml"
        policy_file.write_text(dev_policy(stack.upstream_host, plain, tls, first))
        # This module's mirrorgate serves its file beside the policy objects of the cluster,
        # and a file yields whole to a ClusterMirrorPolicy it conflicts with (the release's
        # has the same upstream and sets health too): the release's policy is emptied while
        # the module runs, and given back after.
        stop.enter_context(
            node_installed.policy_spec_replaced({"exclude": {"namespaces": [mg.NAMESPACE]}})
        )
        # The login, from what `docker login` wrote, into mirrorgate's file store.
        key, store = workdir / "store.key", workdir / "store.json"
        assert _mirrorgate_cli("credentials", "generate-key", "--out", str(key)).returncode == 0
        added = _mirrorgate_cli(
            "credentials",
            "add",
            LOGIN,
            "--registry",
            tls.host,
            "--from-docker-config",
            str(_docker_config(workdir / "config.json", tls)),
            "--store",
            str(store),
            "--key-file",
            str(key),
        )
        assert added.returncode == 0, added.stderr
        assert tls.password is not None
        assert tls.password not in added.stdout + added.stderr
        suite = f"dev-{secrets.token_hex(4)}"
        with node.control_plane.api_client() as api:
            own = create_namespace(api, f"mg-dev-{secrets.token_hex(3)}")
            user, groups = mg.installed_in(api, own)
            server = mg.start_mirrorgate(
                workdir / "mirrorgate",
                node.control_plane,
                policy=policy_file.read_text(),
                user=user,
                groups=groups,
                args=[
                    "--store",
                    "file",
                    "--store-file",
                    str(store),
                    "--key-file",
                    str(key),
                    "--namespace",
                    own,
                ],
                redact=[tls.password],
                health_probes=True,
            )
            stop.callback(server.stop)
            name = f"mirrorgate-e2e-{suite}"
            configuration = mg.webhook_configuration(kustomize)
            register_for_suite(api, configuration, server, name=name, suite=suite)
            stop.callback(mg.unregister, api, name)
            namespace = suite_namespace(api, "dev", suite)
            yield Dev(
                node=node,
                plain=plain,
                tls=tls,
                first=first,
                server=server,
                api=api,
                namespace=namespace,
                policy_file=policy_file,
            )


@contextlib.contextmanager
def installed_hosts(node: Node, files: dict[str, str], only: str) -> Iterator[None]:
    """The exported ``only/hosts.toml`` in the node's certs.d, removed afterwards."""
    node.write_hosts_toml(only, files[f"{only}/hosts.toml"])
    try:
        yield
    finally:
        shutil.rmtree(node.hosts_dir / only)


def wait_rewritten(dev: Dev, workload: Workload, hint: str, mirror: str) -> str:
    """A Pod admitted with its image on ``mirror`` (once mirrorgate probed it up)."""
    names: list[str] = []

    def rewritten() -> str | None:
        name, image = dev.pod(workload, hint)
        names.append(name)
        return None if image.startswith(f"{mirror}/") else f"admitted as {image}"

    wait_until(rewritten, timeout=60, what=f"a Pod rewritten to {mirror}", interval=1)
    return names[-1]


def refused_then_run(
    dev: Dev, files: dict[str, str], cache: DevCache, path: str, refusal: str
) -> tuple[Workload, dict[str, Any]]:
    """A Pod rewritten to the cache fails to pull without the exported hosts.toml (with
    ``refusal`` in the kubelet's message); with it, a new one runs. Returns that one."""
    mirror = f"{cache.host}/{path}"
    before = push_workload(dev.node.registry, f"{path}/before")
    name = wait_rewritten(dev, before, "before", mirror)
    message = nodepods.wait_pull_failure(dev.api, dev.namespace, name, "app")
    assert refusal in message, message
    workload = push_workload(dev.node.registry, f"{path}/app")
    with installed_hosts(dev.node, files, cache.host):
        name = wait_rewritten(dev, workload, "app", mirror)
        stored = nodepods.wait_running(dev.api, dev.namespace, name)
        assert nodepods.log(dev.api, dev.namespace, name).strip() == workload.greeting
    return workload, stored


def test_plain_http_cache_pulls_with_only_the_exported_hosts_toml(dev: Dev, tmp_path: Path) -> None:
    stack, cache = dev.node.registry, dev.plain
    files, stderr = dev.export(tmp_path / "certs.d")
    exported = files[f"{cache.host}/hosts.toml"]
    assert f'server = "http://{cache.host}"' in exported
    # Sources with a repository path have no hosts.toml of their own: said, not written.
    assert f"{stack.upstream_host}/plain" in stderr
    assert f"{stack.upstream_host}/hosts.toml" not in files

    # Without it, containerd speaks HTTPS to the cache, which answers in plain HTTP.
    workload, _ = refused_then_run(
        dev, files, cache, "plain", "server gave HTTP response to HTTPS client"
    )
    pulls = by_node(cache.access_log(), workload)
    assert manifest_statuses(pulls) == {200}  # over HTTP, anonymously
    assert any("/blobs/" in a.path and a.status == 200 for a in pulls)
    filling = by_node(stack.access_log("upstream"), workload, agent=CACHE_FILLING)
    assert 200 in manifest_statuses(filling)
    assert by_node(stack.access_log("upstream"), workload) == []  # the node never went there


def test_https_cache_with_a_private_ca_and_a_login_from_mirrorgate(
    dev: Dev, tmp_path: Path
) -> None:
    stack, cache = dev.node.registry, dev.tls
    files, _ = dev.export(tmp_path / "certs.d")
    assert f'ca = "{cache.ca_path}"' in files[f"{cache.host}/hosts.toml"]
    assert "password" not in files[f"{cache.host}/hosts.toml"].lower()

    # Without the CA, the node cannot verify the cache's certificate.
    workload, stored = refused_then_run(
        dev, files, cache, "tls", "certificate signed by unknown authority"
    )
    assert stored["spec"]["imagePullSecrets"] == [{"name": f"mirrorgate-{LOGIN}"}]
    pulls = by_node(cache.access_log(), workload)
    assert manifest_statuses(pulls) == {401, 200}  # challenged, then the attached login
    assert by_node(stack.access_log("upstream"), workload) == []


def _rewritten_or_say_why(dev: Dev, workload: Workload, hint: str, mirror: str) -> str:
    """:func:`wait_rewritten`, its failure with what mirrorgate's probes logged."""
    try:
        return wait_rewritten(dev, workload, hint, mirror)
    except TimeoutError as error:
        probes = [line for line in dev.server.logs().splitlines() if "mirror" in line]
        raise AssertionError(f"{error}; the probes said: {probes[-20:]}") from None


def test_two_mirrors_for_one_source_the_first_stopped_serves_from_the_second(
    dev: Dev, tmp_path: Path
) -> None:
    """Both up, a Pod goes to the first; stopped, the next Pods go to the second, which the
    node pulls from with the second's login, the only pull secret attached."""
    stack, first, second = dev.node.registry, dev.first, dev.tls
    files, _ = dev.export(tmp_path / "certs.d")
    with (
        installed_hosts(dev.node, files, first.host),
        installed_hosts(dev.node, files, second.host),
    ):
        before = push_workload(stack, "failover/before")
        name = _rewritten_or_say_why(dev, before, "first", f"{first.host}/failover")
        nodepods.wait_running(dev.api, dev.namespace, name)
        assert manifest_statuses(by_node(first.access_log(), before)) == {200}
        first.process.stop()
        workload = push_workload(stack, "failover/app")
        name = _rewritten_or_say_why(dev, workload, "second", f"{second.host}/failover")
        stored = nodepods.wait_running(dev.api, dev.namespace, name)
        assert nodepods.log(dev.api, dev.namespace, name).strip() == workload.greeting
    assert stored["spec"]["containers"][0]["image"].startswith(f"{second.host}/failover/")
    assert stored["spec"]["imagePullSecrets"] == [{"name": f"mirrorgate-{LOGIN}"}]
    assert manifest_statuses(by_node(second.access_log(), workload)) == {401, 200}
    assert by_node(first.access_log(), workload) == []  # stopped before that Pod
    assert by_node(stack.access_log("upstream"), workload) == []  # never the original


def test_1_on_containerd_2_the_deprecated_registry_auth_is_a_node_wide_login(
    node_cluster: Node, dev: Dev, tmp_path: Path
) -> None:
    """Scenario 1 again, with the mirror's login in containerd's own config.

    The upstream's hosts.toml sends pulls to the authenticated mirror, and the
    Pod has no credential for it (scenario 1: the pull fails). With the
    deprecated ``registry.configs."MIRROR".auth``, containerd 2 warns, leaves its
    transfer service for the old local pull, and logs in to the mirror for every
    Pod of every namespace: what mirrorgate's per-namespace grants replace, and
    what containerd v2.7 removes.
    """
    node, stack = node_cluster, node_cluster.registry
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        f"mirrors:\n  - source: {stack.upstream_host}\n"
        f"    mirror: {stack.host}\n    caFile: {stack.ca_path}\n"
    )
    out = tmp_path / "certs.d"
    assert (
        _mirrorgate_cli(
            "export", "containerd", "--policy", str(policy_file), "--out", str(out)
        ).returncode
        == 0
    )
    exported = (out / stack.upstream_host / "hosts.toml").read_text()
    workload, other = push_workload(stack, "dev/seeds"), push_workload(stack, "dev/seeds-auth")
    node.write_hosts_toml(stack.upstream_host, exported)
    try:
        with node.control_plane.api_client() as api:
            namespace = create_namespace(api, namespace_name("seeds2"))  # no mirrorgate
            create_pod(
                api, namespace, nodepods.pod("app", [nodepods.container("app", workload.image)])
            )
            message = nodepods.wait_pull_failure(api, namespace, "app", "app")
            assert nodepods.NO_CREDENTIAL in message, message
            assert manifest_statuses(by_node(stack.access_log("mirror"), workload)) == {401}
            with node.containerd_config_added(
                deprecated_registry_auth(stack.host, stack.username, stack.password),
                "containerd.auth.log",
            ) as log:
                create_pod(
                    api, namespace, nodepods.pod("auth", [nodepods.container("app", other.image)])
                )
                nodepods.wait_running(api, namespace, "auth")
                text = log.read_text()
    finally:
        node.write_hosts_toml(stack.upstream_host, node.default_hosts_toml(stack.upstream_host))
    assert (
        "Found 'Registry.Configs' in CRI config which is incompatible with transfer service" in text
    )
    assert "Falling back to local image pull mode" in text
    assert "`configs` is deprecated, please use `config_path` instead" in text
    assert stack.password not in text
    mirror = by_node(stack.access_log("mirror"), other)
    assert 200 in manifest_statuses(mirror)  # the node's own login, no Pod secret at all
    assert by_node(stack.access_log("upstream"), other) == []
