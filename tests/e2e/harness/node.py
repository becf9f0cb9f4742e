"""A real Kubernetes node for the e2e suite: containerd + runc + CNI, kubelet, and the
controllers that turn a Deployment into running Pods.

    etcd + kube-apiserver (controlplane.py, with flags to reach the kubelet;
                          Node,RBAC authorization and NodeRestriction)
      kube-controller-manager, kube-scheduler        (pinned by build.sh)
      kubelet  --CRI-->  containerd 2 --> runc        (containerd built by build.sh,
                                                       see noderuntime.py; Debian's runc)
                         CNI bridge + host-local      (Debian's containernetworking-plugins)

The cluster is its own, separate from the `control_plane` fixture's: there
Pods must stay Pending and namespaces are never finalised, and the other
tests rely on that. The node is called `localhost`: the kubelet refuses a
loopback node IP, so the API server reaches it by the Hostname address,
which resolves to 127.0.0.1, where the kubelet listens. Pods get addresses on
a bridge in network namespaces this node's runtime creates; the API server
reaches them there (pods/proxy).

The node has registries of its own (token server, upstream, authenticated
mirror: registry.py) on the CNI bridge's address, 10.244.0.1, which the node
makes before anything else: containerd and the kubelet on the host reach them
there, and so do Pods, so mirrorgate installed in the cluster probes the very
mirror address the node pulls from. Their CA is private, as a company's is.

The sandbox (pause) image is built by the suite, pushed to the node's
upstream and pre-pulled into containerd with `ctr` and the upstream's
credentials before the kubelet starts: the kubelet's pull secrets never apply
to the sandbox image, and the upstream serves nothing anonymously.

Settings that matter are written into the configuration files with the reason
beside each (`containerd.toml` from noderuntime.py, `kubelet.yaml` in the
node's directory); what
the node changes on the host is recorded before it starts and undone after it
stops (`nodehost.py`), under a machine-wide lock.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import ssl
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client as k8s

from mirrorgate.certs.authority import CertificateAuthority
from tests.e2e.harness import kube
from tests.e2e.harness.binaries import MissingBinaryError, built_binary, kubernetes_minor
from tests.e2e.harness.controlplane import ControlPlane, start_control_plane
from tests.e2e.harness.nodehost import (
    BRIDGE,
    HostState,
    kill_and_reap,
    machine_lock,
    recover_unfinished,
)
from tests.e2e.harness.noderuntime import CNI_BIN_DIR, ContainerdRuntime, containerd_runtime
from tests.e2e.harness.procs import ManagedProcess, free_port, http_ok, stop_all, wait_until
from tests.e2e.harness.registry import RegistryStack, start_registry_stack
from tests.e2e.harness.testimages import PAUSE_REPOSITORY, PAUSE_TAG, pause_image, push_upstream

NODE_NAME = "localhost"
NODE_USER = f"system:node:{NODE_NAME}"
NODES_GROUP = "system:nodes"
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
"""Who the API server is when it calls the kubelet (logs, pods/proxy)."""
POD_SUBNET = "10.244.0.0/24"
# The CNI bridge's own address (isGateway): the subnet's first, in the host's namespace.
GATEWAY = POD_SUBNET.rsplit(".", 1)[0] + ".1"
NODE_READY_TIMEOUT = 180.0
DRAIN_TIMEOUT = 90.0
# Debian's packages, installed by tests/e2e/deps.sh.
HOST_BINARIES = {"runc": "runc"}


def host_binary(name: str) -> Path:
    for directory in ("/usr/bin", "/usr/sbin", "/bin", "/sbin"):
        candidate = Path(directory) / name
        if os.access(candidate, os.X_OK):
            return candidate
    raise MissingBinaryError(
        name,
        "in /usr/bin or /usr/sbin",
        f"make e2e-deps  (or: apt-get install {HOST_BINARIES[name]})",
    )


def _require_cni() -> None:
    for plugin in ("bridge", "host-local", "loopback"):
        if not os.access(CNI_BIN_DIR / plugin, os.X_OK):
            raise MissingBinaryError(
                f"CNI plugin {plugin}",
                str(CNI_BIN_DIR / plugin),
                "make e2e-deps  (or: apt-get install containernetworking-plugins)",
            )


def cni_config(ipam_dir: Path) -> str:
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "mirrorgate-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    # The bridge gets the subnet's first address, so the host (the API
                    # server) routes to Pods by their own addresses.
                    "isGateway": True,
                    # No NAT: Pods talk to nothing beyond this host.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        # Default /var/lib/cni/networks: keep leases in the suite's directory.
                        "dataDir": str(ipam_dir),
                    },
                }
            ],
        },
        indent=2,
    )


ENSURE_SECRET_PULLED_SINCE = 35
"""KEP-2535 (`KubeletEnsureSecretPulledImages`): beta and on by default from 1.35 (alpha,
off, in 1.33 and 1.34; no such gate before). Below it a node's cached image serves any
Pod that names it with IfNotPresent, credentials or not (docs/install.md)."""
FAIL_CGROUP_V1_SINCE = 31
"""`failCgroupV1` is a KubeletConfiguration field from 1.31."""


def ensures_secret_pulled_images(minor: int) -> bool:
    """Whether a kubelet of this minor re-checks credentials for a cached image by default."""
    return minor >= ENSURE_SECRET_PULLED_SINCE


def _version_settings(minor: int) -> str:
    """The settings that exist only from some minor on: an older kubelet refuses an
    unknown feature gate (and only warns of an unknown field)."""
    settings = ""
    if minor >= FAIL_CGROUP_V1_SINCE:
        settings += (
            "# This VM has cgroup v1 (hybrid layout), deprecated in 1.37: "
            "true would refuse to start.\nfailCgroupV1: false\n"
        )
    if ensures_secret_pulled_images(minor):
        # KEP-2535: an image the kubelet pulled with a Secret is reused by another Pod
        # (IfNotPresent) only if that Pod has the same credentials. On by default from
        # 1.35; set explicitly because scenario 7 depends on it. Older minors run with
        # their default (none, or the alpha gate off), as clusters of that minor do.
        settings += (
            "featureGates:\n  KubeletEnsureSecretPulledImages: true\n"
            "imagePullCredentialsVerificationPolicy: NeverVerifyPreloadedImages\n"
        )
    return settings


def kubelet_config(
    workdir: Path, *, socket: Path, port: int, healthz_port: int, client_ca: Path, minor: int
) -> str:
    """The node's KubeletConfiguration for a kubelet of ``minor`` (1.x)."""
    return f"""\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
{_version_settings(minor)}\
# No systemd manages cgroups here; containerd's runc is set to cgroupfs as well.
cgroupDriver: cgroupfs
# The VM may have swap; the test Pods do not care.
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
imageServiceEndpoint: unix://{socket}
# Serve on loopback only, on free ports: the API server reaches the kubelet as
# Hostname "localhost" (it refuses a loopback node IP), other suites run beside us.
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
# The API server calls /containerLogs with a client certificate of the cluster CA.
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: "{client_ca}"}}
authorization:
  mode: Webhook
# With true the kubelet refuses to start here (vm.overcommit_memory, kernel.panic
# and kernel.panic_on_oops differ); with false it sets them, and the suite
# restores them when the node stops.
protectKernelDefaults: false
# Defaults are /var/log/pods and /usr/libexec/kubernetes/...: keep them in our directory.
podLogsDir: "{workdir}/pod-logs"
volumePluginDir: "{workdir}/volume-plugins"
# Other suites share this disk: evict only when it is really full.
evictionHard: {{memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}}
# A changed ConfigMap reaches the Pods that mount it at their next sync: every 5 s
# rather than every minute, so a policy changed by `helm upgrade` is served within
# seconds (the replicas reload it from the file; the chart does not restart them).
syncFrequency: 5s
# The cluster has no DNS (no CoreDNS image can be pulled); Pods use the host's resolv.conf.
resolvConf: /etc/resolv.conf
# The pause image is pre-pulled; nothing else may be garbage collected mid-test.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
"""


@dataclass
class Node:
    """A running single-node cluster; what the `node_cluster` fixture yields.

    `control_plane` is this cluster's own API server; `hosts_dir` is
    containerd's config_path (one `<host>/hosts.toml` per registry).
    """

    control_plane: ControlPlane
    registry: RegistryStack
    workdir: Path
    socket: Path
    hosts_dir: Path
    sandbox_image: str
    host: HostState
    runtime: ContainerdRuntime
    # The kubelet's kubeconfig: its own identity, `system:node:localhost`.
    kubelet_kubeconfig: Path | None = None
    processes: list[ManagedProcess] = field(default_factory=list, repr=False)
    timings: dict[str, float] = field(default_factory=dict)
    _cleanup: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    stopped: bool = False

    def describe(self, lines: int = 30) -> str:
        return "\n\n".join(p.describe_failure(lines) for p in self.processes)

    def ctr(self, *args: str, timeout: float = 120) -> str:
        """`ctr` against this node's containerd, in the CRI's namespace."""
        out = subprocess.run(
            [str(self.runtime.ctr), "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            # Never echo the arguments: a pull carries credentials.
            raise RuntimeError(
                f"ctr {args[0]} {args[1] if len(args) > 1 else ''} failed: "
                f"{out.stderr.strip()[-500:]}"
            )
        return out.stdout

    def default_hosts_toml(self, host: str, ca_path: Path | None = None) -> str:
        """The hosts.toml each of the node's registries has: its address and its CA.

        `ca_path` is the registry's CA if it is not the node's registries' (a
        cache or stack of a test module's own). The `[host]` table repeats the server
        because containerd 1.6 rejects a hosts.toml without one ("invalid
        `host` tree") and falls back to defaults.
        """
        ca = f'ca = "{ca_path or self.registry.ca_path}"'
        return (
            f'server = "https://{host}"\n{ca}\n\n'
            f'[host."https://{host}"]\n'
            f'  capabilities = ["pull", "resolve"]\n  {ca}\n'
        )

    @contextlib.contextmanager
    def containerd_config_added(self, extra: str, log_name: str) -> Iterator[Path]:
        """containerd restarted with ``extra`` in its config, then with its own again.

        The kubelet reconnects to the socket by itself; running Pods keep
        running (their shims outlive containerd). Yields the log of this run.
        """
        self._restart_containerd(extra, log_name)
        try:
            yield self.workdir / log_name
        finally:
            self._restart_containerd("", "containerd.log.restored")

    def _restart_containerd(self, extra: str, log_name: str) -> None:
        [current] = [p for p in self.processes if p.name == "containerd" and p.exited() is None]
        current.stop()
        self.processes.remove(current)
        self.socket.unlink(missing_ok=True)
        _run_containerd(self, extra, log_name)

    @contextlib.contextmanager
    def kubelet_reconfigured(
        self, settings: Mapping[str, Any], args: Sequence[str], name: str
    ) -> Iterator[Path]:
        """The kubelet restarted with ``settings`` over its KubeletConfiguration and ``args``
        added to its command line, then restarted as it was; yields the log of this run.

        What a node's operator does to change a kubelet's flags: running Pods keep
        running (their containers are containerd's) and stay Ready (a restarted kubelet
        keeps the readiness of the containers that started before it).
        """
        [current] = [p for p in self.processes if p.name == "kubelet" and p.exited() is None]
        original = list(current.argv)
        base = self.workdir / "kubelet.yaml"
        changed = self.workdir / f"kubelet-{name}.yaml"
        changed.write_text(yaml.safe_dump({**yaml.safe_load(base.read_text()), **settings}))
        argv = [f"--config={changed}" if a == f"--config={base}" else a for a in original]
        log = self.workdir / f"kubelet-{name}.log"
        self._restart_kubelet([*argv, *args], log)
        try:
            yield log
        finally:
            self._restart_kubelet(original, self.workdir / f"kubelet-{name}.restored.log")

    def _restart_kubelet(self, argv: list[str], log: Path) -> None:
        """Stop the kubelet by its PID, start ``argv``; wait for its /healthz and a renewal
        of the node's Lease by the new process."""
        [current] = [p for p in self.processes if p.name == "kubelet" and p.exited() is None]
        current.stop()
        self.processes.remove(current)
        started = datetime.datetime.now(datetime.UTC)
        kubelet = ManagedProcess("kubelet", argv, log)
        self.processes.append(kubelet)
        config = next(a.removeprefix("--config=") for a in argv if a.startswith("--config="))
        port = yaml.safe_load(Path(config).read_text())["healthzPort"]
        wait_until(
            lambda: http_ok(
                lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2, trust_env=False)
            ),
            timeout=NODE_READY_TIMEOUT,
            what="the restarted kubelet's /healthz",
            alive=kubelet.exited,
        )
        with self.control_plane.api_client() as api:
            leases = k8s.CoordinationV1Api(api)

            def renewed() -> str | None:
                spec = leases.read_namespaced_lease(NODE_NAME, "kube-node-lease").spec
                renew = spec.renew_time if spec else None
                return None if renew and renew >= started else f"Lease renewed {renew}"

            wait_until(
                renewed,
                timeout=NODE_READY_TIMEOUT,
                what="the node's Lease renewed by the restarted kubelet",
                interval=0.25,
                alive=kubelet.exited,
            )

    def kubelet_configz(self) -> dict[str, Any]:
        """The running kubelet's configuration, from its own /configz, asked as the API
        server asks it (`kube-apiserver-kubelet-client`; the API server's node proxy
        refuses this node's loopback address)."""
        [kubelet] = [p for p in self.processes if p.name == "kubelet" and p.exited() is None]
        config = next(
            a.removeprefix("--config=") for a in kubelet.argv if a.startswith("--config=")
        )
        port = yaml.safe_load(Path(config).read_text())["port"]
        pki = self.workdir / "pki"
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the kubelet's self-signed serving certificate
        context.load_cert_chain(pki / "kubelet-client.crt", pki / "kubelet-client.key")
        response = httpx.get(
            f"https://127.0.0.1:{port}/configz", verify=context, timeout=10, trust_env=False
        )
        response.raise_for_status()
        found: dict[str, Any] = response.json()["kubeletconfig"]
        return found

    def write_hosts_toml(self, host: str, text: str) -> None:
        directory = self.hosts_dir / host
        directory.mkdir(parents=True, exist_ok=True)
        temporary = directory / ".hosts.toml.tmp"
        temporary.write_text(text)
        temporary.replace(directory / "hosts.toml")  # containerd re-reads it on every pull

    def stop(self) -> None:
        """Drain, stop every process by PID, undo the host changes, release the lock.

        Raises if the host still differs from before the node started.
        """
        if self.stopped:
            return
        self.stopped = True
        with self._cleanup:
            try:
                self._drain()
            finally:
                try:
                    stop_all(self.processes)
                finally:
                    _kill_leftover_processes(self.socket)
                    self.control_plane.stop()
                    self.registry.stop()  # before its address, on the bridge, goes
                    self.host.restore()
            left = self.host.leftovers()
            if left:
                raise RuntimeError("the node left the host changed: " + "; ".join(left))
            self.host.forget()

    def _drain(self) -> None:
        """Delete every Pod through the API and let the kubelet stop them properly.

        The controllers go first so nothing recreates them; the kubelet then
        stops the containers and sandboxes (tearing down their network) and
        confirms each deletion. What it does not finish, `_kill_leftover_processes` does.
        """
        running = {p.name: p for p in self.processes if p.exited() is None}
        for name in ("kube-controller-manager", "kube-scheduler"):
            if name in running:
                running[name].stop()
        if "kubelet" not in running or "containerd" not in running:
            return  # a start that failed early: nothing to drain
        with self.control_plane.api_client() as api:
            core = k8s.CoreV1Api(api)
            namespaces = {
                pod.metadata.namespace
                for pod in core.list_pod_for_all_namespaces().items
                if pod.metadata
            }
            for namespace in sorted(ns for ns in namespaces if ns):
                core.delete_collection_namespaced_pod(namespace, grace_period_seconds=1)

            def gone() -> str | None:
                left = core.list_pod_for_all_namespaces().items
                return None if not left else f"{len(left)} Pods left"

            # What is still running then is killed below anyway.
            with contextlib.suppress(TimeoutError):
                wait_until(gone, timeout=DRAIN_TIMEOUT, what="every Pod stopped", interval=0.5)
        # The kubelet removes stopped sandboxes lazily; ask containerd for what is left.
        for task in self.ctr("tasks", "list", "--quiet").split():
            with contextlib.suppress(RuntimeError):
                self.ctr("tasks", "kill", "--signal", "SIGKILL", task)


def _kill_leftover_processes(socket: Path) -> None:
    """SIGKILL, by PID, the shims of our containerd and everything in our Pods' cgroups.

    containerd's shims are daemonised (not our children), and a Pod's
    processes outlive a killed shim; both are ours by their address argument
    or their cgroup, so nothing of another program is touched.
    """
    pids: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"containerd-shim" in argv[0] and str(socket).encode() in argv:
                pids.add(int(entry.name))
    for procs in Path("/sys/fs/cgroup").glob("*/kubepods/**/cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(line) for line in procs.read_text().split())
    kill_and_reap(pids)


def _healthz(url: str) -> str | None:
    """None once a component's /healthz answers ok (its serving certificate is self-signed)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        response = httpx.get(url, verify=context, timeout=2, trust_env=False)
    except httpx.HTTPError as error:
        return f"{type(error).__name__}: {error}"
    return None if response.status_code == 200 else f"HTTP {response.status_code}"


def _node_ready(api: k8s.ApiClient) -> str | None:
    try:
        node = k8s.CoreV1Api(api).read_node(NODE_NAME)
    except k8s.ApiException as error:
        return f"node {NODE_NAME}: HTTP {error.status}"
    for condition in (node.status.conditions if node.status else None) or ():
        if condition.type == "Ready":
            return (
                None
                if condition.status == "True"
                else f"Ready={condition.status}: {condition.message}"
            )
    return "no Ready condition yet"


@contextlib.contextmanager
def _stop_on_error(node: Node) -> Iterator[None]:
    try:
        yield
    except BaseException as error:
        detail = node.describe(40)
        try:
            node.stop()
        except Exception as cleanup:  # report the start failure first
            detail += f"\n\nclean-up after the failed start: {cleanup}"
        if isinstance(error, TimeoutError | RuntimeError):
            raise RuntimeError(f"node failed to start: {error}\n\n{detail}") from None
        raise


def _make_bridge() -> None:
    """The CNI bridge with its gateway address, before the first Pod (the bridge plugin
    takes an existing bridge and address as they are), so the node's registries can
    listen there from the start. Removed with the node's other links (nodehost.py)."""
    for command in (
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE],
        ["ip", "link", "set", BRIDGE, "up"],
    ):
        subprocess.run(command, check=True, capture_output=True, timeout=30)


def start_node(workdir: Path) -> Node:
    """Start a one-node cluster (under the machine lock) with registries of its own on
    the bridge; `Node.stop()` undoes it all."""
    binaries = {
        name: built_binary(name)
        for name in ("kubelet", "kube-controller-manager", "kube-scheduler")
    }
    runtime = containerd_runtime()
    host_binary("runc")  # checked for a clear error; containerd runs it from PATH
    _require_cni()

    cleanup = contextlib.ExitStack()
    started = time.monotonic()
    cleanup.enter_context(machine_lock())
    locked = time.monotonic()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        undone = recover_unfinished()
        if undone:
            print(
                "\nnode: a node of an earlier run was killed before it restored the host; "
                "undone now: " + "; ".join(undone),
                flush=True,
            )
        host = HostState.capture(workdir)
        host.journal()
    except BaseException:
        cleanup.close()
        raise
    registry: RegistryStack | None = None
    try:
        _make_bridge()
        phase = time.monotonic()
        registry = start_registry_stack(workdir / "registry", address=GATEWAY)
        registry_ready = time.monotonic() - phase
        sandbox_image = push_upstream(registry, PAUSE_REPOSITORY, PAUSE_TAG, pause_image())
        plane = _start_node_control_plane(workdir)
    except BaseException:
        with cleanup:
            if registry is not None:
                registry.stop()
            host.restore()
            host.forget()
        raise
    containerd_dir = workdir / "containerd"
    node = Node(
        control_plane=plane,
        registry=registry,
        workdir=workdir,
        socket=containerd_dir / "containerd.sock",
        hosts_dir=containerd_dir / "certs.d",
        sandbox_image=sandbox_image,
        host=host,
        runtime=runtime,
        _cleanup=cleanup,
    )
    node.timings["node_lock_wait_s"] = locked - started
    node.timings["registries_ready_s"] = registry_ready
    with _stop_on_error(node):
        _start_containerd(node)
        phase = time.monotonic()
        node.ctr(
            "images",
            "pull",
            "--hosts-dir",
            str(node.hosts_dir),
            "--user",
            f"{registry.upstream_username}:{registry.upstream_password}",
            sandbox_image,
        )
        node.timings["sandbox_prepull_s"] = time.monotonic() - phase
        phase = time.monotonic()
        kubelet = _start_kubelet(node, binaries["kubelet"])
        for name in ("kube-controller-manager", "kube-scheduler"):
            _start_controller(node, name, binaries[name])
        with plane.api_client() as api:
            wait_until(
                lambda: _node_ready(api),
                timeout=NODE_READY_TIMEOUT,
                what=f"node {NODE_NAME} Ready",
                interval=0.25,
                alive=kubelet.exited,
            )
        node.timings["kubelet_node_ready_s"] = time.monotonic() - phase
        node.timings["node_ready_s"] = time.monotonic() - locked
    return node


def _start_node_control_plane(workdir: Path) -> ControlPlane:
    """etcd + kube-apiserver, with what the API server needs to call the kubelet."""
    ca = CertificateAuthority.generate(common_name="mirrorgate e2e node cluster CA")
    # No group: RBAC grants it the kubelet API alone (`_authorise_kubelet_client`), as
    # kubeadm's clusters do, not cluster-admin through system:masters.
    kubelet_client = ca.issue_client(common_name=KUBELET_CLIENT_USER)
    pki = workdir / "pki"
    pki.mkdir()
    (pki / "kubelet-client.crt").write_bytes(kubelet_client.cert_pem)
    (pki / "kubelet-client.key").write_bytes(kubelet_client.key_pem)
    (pki / "kubelet-client.key").chmod(0o600)
    # As a production cluster: kubelets are authorised by the Node authorizer,
    # and NodeRestriction keeps each to its own Node and the Pods bound to it.
    plane = start_control_plane(
        workdir / "controlplane",
        ca=ca,
        authorization_modes=("Node", "RBAC"),
        apiserver_args=[
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            # The node's Hostname address ("localhost"), not its InternalIP: the
            # kubelet refuses a loopback node IP, and nothing else is a target.
            "--kubelet-preferred-address-types=Hostname",
            # Webhook Services resolve to their endpoints' Pod addresses (no kube-proxy).
            "--enable-aggregator-routing=true",
        ],
    )
    try:
        with plane.api_client() as api:
            _authorise_kubelet_client(api)
    except BaseException:
        plane.stop()
        raise
    return plane


def _authorise_kubelet_client(api: k8s.ApiClient) -> None:
    """The API server's identity at the kubelet may use the kubelet's API (logs, exec,
    port-forward, proxy), as the bootstrap ClusterRole `system:kubelet-api-admin` says."""
    kube.bind(
        k8s.RbacAuthorizationV1Api(api),
        "kube-apiserver-kubelet-api-admin",
        ("ClusterRole", "system:kubelet-api-admin"),
        kube.user_subject(KUBELET_CLIENT_USER),
    )


def _start_containerd(node: Node) -> None:
    """The CNI configuration, a hosts.toml per registry of the node, then containerd itself."""
    registry, containerd_dir = node.registry, node.socket.parent
    cni_dir = node.workdir / "cni"
    (cni_dir / "net.d").mkdir(parents=True)
    (cni_dir / "net.d" / "10-mirrorgate-e2e.conflist").write_text(cni_config(cni_dir / "ipam"))
    containerd_dir.mkdir()
    for host_name in (registry.upstream_host, registry.host):
        node.write_hosts_toml(host_name, node.default_hosts_toml(host_name))
    phase = time.monotonic()
    _run_containerd(node)
    node.timings["containerd_ready_s"] = time.monotonic() - phase


def _run_containerd(node: Node, extra_config: str = "", log_name: str = "containerd.log") -> None:
    """Write the config (``extra_config`` appended) and start containerd; wait until it answers."""
    containerd_dir = node.socket.parent
    config = containerd_dir / "containerd.toml"
    config.write_text(
        node.runtime.config(
            containerd_dir,
            socket=node.socket,
            sandbox_image=node.sandbox_image,
            hosts_dir=node.hosts_dir,
            cni_conf_dir=node.workdir / "cni" / "net.d",
            extra=extra_config,
        )
    )
    runtime = ManagedProcess(
        "containerd",
        [str(node.runtime.containerd), "--config", str(config)],
        node.workdir / log_name,
        env=node.runtime.environment(),
    )
    node.processes.append(runtime)
    wait_until(
        lambda: None if node.socket.exists() else "no socket yet",
        timeout=60,
        what="containerd socket",
        alive=runtime.exited,
    )
    wait_until(
        lambda: _ctr_answers(node), timeout=60, what="containerd answers", alive=runtime.exited
    )


def _start_kubelet(node: Node, binary: Path) -> ManagedProcess:
    """The kubelet on its own node identity; it registers the node itself.

    A client certificate of the cluster CA for `system:node:localhost` in
    `system:nodes`, as a kubelet gets from TLS bootstrapping: the Node
    authorizer grants it no more than what the Pods bound to it reference,
    and NodeRestriction lets it change only its own Node and those Pods. No
    RBAC binding adds to that.
    """
    plane = node.control_plane
    kubelet_dir = node.workdir / "kubelet"
    kubelet_dir.mkdir()
    kubelet_yaml = node.workdir / "kubelet.yaml"
    kubelet_yaml.write_text(
        kubelet_config(
            kubelet_dir,
            socket=node.socket,
            port=free_port(),
            healthz_port=free_port(),
            client_ca=plane.ca_path,
            minor=kubernetes_minor(),
        )
    )
    kubeconfig = plane.kubeconfig_for(NODE_USER, [NODES_GROUP])
    node.kubelet_kubeconfig = kubeconfig
    kubelet = ManagedProcess(
        "kubelet",
        [
            str(binary),
            f"--config={kubelet_yaml}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={kubelet_dir / 'root'}",
            f"--cert-dir={kubelet_dir / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            "--v=2",
        ],
        node.workdir / "kubelet.log",
    )
    node.processes.append(kubelet)
    return kubelet


def _start_controller(node: Node, name: str, binary: Path) -> None:
    """kube-controller-manager or kube-scheduler as cluster admin; waits for its /healthz."""
    plane, port = node.control_plane, free_port()
    admin = plane.kubeconfig
    extra = (
        [
            f"--service-account-private-key-file={plane.workdir / 'sa.key'}",
            # Publishes kube-root-ca.crt, which every Pod's token volume mounts.
            f"--root-ca-file={plane.ca_path}",
        ]
        if name == "kube-controller-manager"
        else []
    )
    proc = ManagedProcess(
        name,
        [
            str(binary),
            f"--kubeconfig={admin}",
            f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}",
            # Their /healthz is all we call; no front-proxy CA to look up.
            "--authentication-skip-lookup=true",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            *extra,
        ],
        node.workdir / f"{name}.log",
    )
    node.processes.append(proc)
    node.timings[f"{name.removeprefix('kube-').replace('-', '_')}_ready_s"] = wait_until(
        lambda: _healthz(f"https://127.0.0.1:{port}/healthz"),
        timeout=NODE_READY_TIMEOUT,
        what=f"{name} /healthz",
        alive=proc.exited,
    )


def _ctr_answers(node: Node) -> str | None:
    try:
        node.ctr("version", timeout=10)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        return str(error)
    return None
