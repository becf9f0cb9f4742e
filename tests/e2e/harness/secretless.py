"""Secretless pulls on the real node (issue 31): what tests/e2e/node/test_secretless.py runs on.

The release of the node suite (`node_installed`) is upgraded as docs/install.md's
"Secretless pulls" says, for the module's duration, and rolled back to its own
revision after:

* **A mirror of its own**: a pull-through cache of the node's upstream on the
  bridge (`start_dev_cache`), with the node registries' certificate (the node and
  `mirrorCA` trust it already) and an htpasswd user of its own, so that its
  login can rotate and no other test pulls from its host. The policy's rule
  `secretless.e2e.example` goes to it, with credential `secretless-robot` of
  `delivery: kubelet`, granted to the namespaces `sl-granted-*` only (never
  `granted-*`, whose namespaces get the suite's `mirrorgate-*` copies).
* **kubeletPlugin**: enabled, with a ClusterIP, a short `cacheDuration`, and a
  `binDir` in the node's own directory (the default, /usr/libexec/kubernetes,
  is a host path the node must leave as it found it). The chart's DaemonSet
  writes the plugin and mirrorgate's CA there, as on any node.
* **The kubelet**, restarted with the entry `helm get notes` prints, as an
  operator would (the kubelet refuses to start with an entry whose binary is
  not there yet, so it can only come after the install), with one argument
  added: `--client-cert`, because this kubelet's `--cert-dir` is not
  /var/lib/kubelet/pki, where the plugin looks by default. Its client
  certificate is the one of its kubeconfig, `system:node:localhost`, written
  as a bootstrapped kubelet keeps it (kubelet-client-current.pem). And
  `imagePullCredentialsVerificationPolicy: AlwaysVerify`. Restored after.
* **The route** to the Service's ClusterIP, which the plugin posts to: there
  is no kube-proxy here (node.py), so the module writes what kube-proxy would
  write, a nat OUTPUT DNAT from the ClusterIP's port 443 to the ready
  endpoints on port `kubelet`, in a chain of its own, plus a host route of
  the ClusterIP onto the bridge, so that nothing would leave the host without
  the rule. Both go when the module ends (the node's host restore would
  remove a chain left behind, nodehost.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.e2e.harness import helm as h
from tests.e2e.harness import kubeletcreds as kc
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.fixtures_secrets import metric
from tests.e2e.harness.incluster import Release, installed_policy, wait_rolled_out
from tests.e2e.harness.node import GATEWAY, Node
from tests.e2e.harness.nodehost import BRIDGE
from tests.e2e.harness.nodepods import Workload, push_workload
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import DevCache, start_dev_cache
from tests.e2e.harness.suite import central_credential

CLUSTER_IP = "10.0.0.53"
"""kubeletPlugin.clusterIP: a free address of the node API server's Service CIDR."""
KUBELET_PORT = 8444
"""The endpoint's container port (`kubelet`), the Service's target."""
SOURCE = "secretless.e2e.example"
CREDENTIAL = "secretless-robot"
GRANTED = "sl-granted-"
"""The prefix of the namespaces the credential is granted to."""
CACHE_DURATION = 20
"""kubeletPlugin.cacheDuration (seconds): the rotation test's bound for a ServiceAccount
that already pulled, short so that the module stays short."""
MIRROR_PATH = "secretless"
"""The rule's path on the mirror; the cache serves the upstream at its root, so the
upstream repository of `SOURCE/x` is `secretless/x`."""
CHAIN = "MGE2E-KUBELET-SVC"
PLUGIN = "mirrorgate-credential-provider"
PLUGIN_SERVICE = "mirrorgate-kubelet-plugin"
DAEMONSET = "mirrorgate-kubelet-plugin"
POD_SECURITY = "pod-security.kubernetes.io/enforce"
VERIFICATION = {"imagePullCredentialsVerificationPolicy": "AlwaysVerify"}


@dataclass
class Secretless:
    """The release with kubeletPlugin on, its mirror, the reconfigured kubelet."""

    release: Release
    mirror: DevCache
    bin_dir: Path
    client_pem: Path
    """The kubelet's own client certificate and key (the plugin presents it)."""
    provider: dict[str, Any]
    """The kubelet's CredentialProviderConfig entry, as it reads it."""
    kubelet_log: Path

    @property
    def node(self) -> Node:
        return self.release.node

    def workload(self, tag: str) -> Workload:
        """A `hello` image of its own on the upstream, under the rule's mirror path."""
        return push_workload(self.node.registry, f"{MIRROR_PATH}/hello", tag)

    def source_image(self, workload: Workload) -> str:
        """What a Pod names: the rule's source."""
        return f"{SOURCE}/hello:{workload.tag}"

    def mirror_image(self, workload: Workload) -> str:
        """What admission writes and the kubelet pulls."""
        return f"{self.mirror.host}/{MIRROR_PATH}/hello:{workload.tag}"

    def manifest_path(self, workload: Workload) -> str:
        return f"/v2/{MIRROR_PATH}/hello/manifests/{workload.tag}"

    def counted(self, name: str, **labels: str) -> float:
        """``name`` summed over both replicas (each answers the kubelet on its own)."""
        return sum(metric(text, name, **labels) for text in self.release.metrics())

    def plugin(self, client_pem: Path, token: str, image: str) -> subprocess.CompletedProcess[str]:
        """The plugin in the node's plugin directory, run as the kubelet runs it (the
        entry's own arguments), but presenting ``client_pem``."""
        args = [a for a in self.provider["args"] if not a.startswith("--client-cert=")]
        return subprocess.run(
            [str(self.bin_dir / PLUGIN), *args, f"--client-cert={client_pem}"],
            input=kc.credential_request(image, token),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={"PATH": "/usr/bin:/bin"},
        )


def secretless_policy(release: Release, mirror: DevCache) -> dict[str, Any]:
    """The release's policy and one rule more: `SOURCE` through the module's mirror, its
    credential delivered by the kubelet to `sl-granted-*`."""
    found = installed_policy(release.registry)
    found["mirrors"].append(
        {
            "source": SOURCE,
            "mirror": f"{mirror.host}/{MIRROR_PATH}",
            "credential": CREDENTIAL,
            "onMirrorDown": "keep",
        }
    )
    found["credentials"][CREDENTIAL] = {"namespaces": [f"{GRANTED}*"], "delivery": "kubelet"}
    return found


def client_pem(kubeconfig: Path, path: Path) -> Path:
    """The client certificate and key of ``kubeconfig`` in one PEM file, as the kubelet
    keeps kubelet-client-current.pem (the plugin's default format)."""
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        base64.b64decode(user["client-certificate-data"])
        + base64.b64decode(user["client-key-data"])
    )
    path.chmod(0o600)
    return path


def _endpoints(api: k8s.ApiClient) -> list[str]:
    """The ready addresses behind the kubelet plugin's Service."""
    slices = (
        k8s.DiscoveryV1Api(api)
        .list_namespaced_endpoint_slice(
            mg.NAMESPACE, label_selector=f"kubernetes.io/service-name={PLUGIN_SERVICE}"
        )
        .items
    )
    return sorted(
        address
        for s in slices
        for e in s.endpoints or []
        if e.conditions and e.conditions.ready
        for address in e.addresses
    )


def _iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", "5", "-t", "nat", *args], check=True, timeout=30)


@contextlib.contextmanager
def service_route(api: k8s.ApiClient) -> Iterator[list[str]]:
    """The host reaches `CLUSTER_IP`:443 at the Service's two ready endpoints, as
    kube-proxy's iptables mode would send it (one of two at random, then the other);
    yields the endpoints. Removed after."""
    found: list[list[str]] = [[]]

    def both() -> str | None:
        found[0] = _endpoints(api)
        return None if len(found[0]) == 2 else f"ready endpoints {found[0]}"

    wait_until(both, timeout=60, what=f"the two endpoints of {PLUGIN_SERVICE}", interval=0.5)
    first, second = found[0]
    match = ["-p", "tcp", "-d", f"{CLUSTER_IP}/32", "--dport", "443"]
    subprocess.run(
        ["ip", "route", "add", f"{CLUSTER_IP}/32", "dev", BRIDGE], check=True, timeout=30
    )
    try:
        _iptables("-N", CHAIN)
        try:
            half = ["-m", "statistic", "--mode", "random", "--probability", "0.5"]
            _iptables(
                "-A",
                CHAIN,
                *match,
                *half,
                "-j",
                "DNAT",
                "--to-destination",
                f"{first}:{KUBELET_PORT}",
            )
            _iptables(
                "-A", CHAIN, *match, "-j", "DNAT", "--to-destination", f"{second}:{KUBELET_PORT}"
            )
            _iptables("-I", "OUTPUT", "-j", CHAIN)
            try:
                yield found[0]
            finally:
                _iptables("-D", "OUTPUT", "-j", CHAIN)
        finally:
            _iptables("-F", CHAIN)
            _iptables("-X", CHAIN)
    finally:
        subprocess.run(["ip", "route", "del", f"{CLUSTER_IP}/32", "dev", BRIDGE], timeout=30)


def wait_plugin_installed(bin_dir: Path, timeout: float = 120) -> None:
    """Until the DaemonSet has written the plugin and mirrorgate's CA into ``bin_dir``."""

    def written() -> str | None:
        missing = [n for n in (PLUGIN, "mirrorgate-ca.crt") if not (bin_dir / n).is_file()]
        return f"missing {missing}" if missing else None

    wait_until(written, timeout=timeout, what=f"the DaemonSet's files in {bin_dir}", interval=0.5)


def _kubelet_values(bin_dir: Path) -> list[str]:
    return h.set_args(
        {
            "kubeletPlugin.enabled": "true",
            "kubeletPlugin.clusterIP": CLUSTER_IP,
            "kubeletPlugin.binDir": str(bin_dir),
            "kubeletPlugin.cacheDuration": str(CACHE_DURATION),
        }
    )


def _allow_host_path(api: k8s.ApiClient, undo: contextlib.ExitStack) -> None:
    """The release's namespace at Pod Security level privileged while the module runs, as
    docs/install.md says for kubeletPlugin.enabled: the DaemonSet writes a host directory,
    which `restricted` (the kustomize Namespace's level, which test_incluster leaves on
    it) and `baseline` refuse. The previous label is put back after."""
    core = k8s.CoreV1Api(api)
    metadata = core.read_namespace(mg.NAMESPACE).metadata
    labels = (metadata.labels if metadata is not None else None) or {}
    previous = labels.get(POD_SECURITY)
    core.patch_namespace(mg.NAMESPACE, {"metadata": {"labels": {POD_SECURITY: "privileged"}}})
    undo.callback(
        core.patch_namespace, mg.NAMESPACE, {"metadata": {"labels": {POD_SECURITY: previous}}}
    )


@contextlib.contextmanager
def secretless_release(release: Release, workdir: Path) -> Iterator[Secretless]:
    """The release upgraded for secretless pulls, the kubelet configured (module
    docstring); all of it undone after, in reverse. A set-up that fails says what the
    replicas logged."""
    with contextlib.ExitStack() as undo:
        try:
            found = _set_up(release, workdir, undo)
        except (TimeoutError, RuntimeError, AssertionError) as error:
            raise RuntimeError(f"{error}\n\nreplicas:\n{release.describe()}") from None
        yield found


def _set_up(release: Release, workdir: Path, undo: contextlib.ExitStack) -> Secretless:
    node = release.node
    assert node.kubelet_kubeconfig is not None
    api = undo.enter_context(node.control_plane.api_client())
    mirror = start_dev_cache(
        node.registry,
        workdir / "mirror",
        address=GATEWAY,
        tls=False,
        login=True,
        stack_certificate=True,
        username="secretless-puller",
    )
    undo.callback(mirror.process.stop)
    node.write_hosts_toml(mirror.host, node.default_hosts_toml(mirror.host))
    undo.callback(shutil.rmtree, node.hosts_dir / mirror.host, ignore_errors=True)
    central_credential(
        api,
        node.registry,
        name=CREDENTIAL,
        host=mirror.host,
        username=mirror.username,
        password=mirror.password,
    )
    undo.callback(k8s.CoreV1Api(api).delete_namespaced_secret, CREDENTIAL, mg.NAMESPACE)
    bin_dir = node.workdir / "credential-provider"
    # The DaemonSet leaves its files on the node when it goes, as on any node.
    undo.callback(shutil.rmtree, bin_dir, ignore_errors=True)
    _allow_host_path(api, undo)
    undo.callback(release.roll_back, release.revision())
    release.upgrade(*_kubelet_values(bin_dir))
    wait_rolled_out(api)
    release.set_policy(secretless_policy(release, mirror))
    # The gauge's label is the rule's mirror as written.
    mirrored = f"{mirror.host}/{MIRROR_PATH}"
    release.wait_gauge("mirrorgate_mirror_up", 1.0, timeout=60, mirror=mirrored)
    wait_plugin_installed(bin_dir)
    undo.enter_context(service_route(api))

    pem = client_pem(
        node.kubelet_kubeconfig, node.workdir / "kubelet" / "pki" / "kubelet-client-current.pem"
    )
    config = h.provider_config(release.run_helm("get", "notes", "mirrorgate").stdout)
    (provider,) = config["providers"]
    provider["args"].append(f"--client-cert={pem}")
    config_file = node.workdir / "credential-provider.yaml"
    config_file.write_text(json.dumps(config, indent=2))
    kubelet_log = undo.enter_context(
        node.kubelet_reconfigured(
            VERIFICATION,
            [
                f"--image-credential-provider-config={config_file}",
                f"--image-credential-provider-bin-dir={bin_dir}",
            ],
            "secretless",
        )
    )
    return Secretless(
        release=release,
        mirror=mirror,
        bin_dir=bin_dir,
        client_pem=pem,
        provider=provider,
        kubelet_log=kubelet_log,
    )
