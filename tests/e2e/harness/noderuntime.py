"""The node's container runtime: containerd 2, built by tests/controlplane/build.sh.

One object knows the binaries (containerd, ctr and the runc shim, side by
side in one cached directory), the version they report, and the
configuration format that version reads (config ``version = 3``: the CRI
plugin split into ``io.containerd.cri.v1.images`` and ``…runtime``; 2.4 reads
it and would write its own newest, 4). The node (tests/e2e/harness/node.py) asks it
for the config file and the environment to start containerd with; the e2e
figures print its version (``node runtime: containerd vX.Y.Z``).

kind, GKE and EKS ship containerd 2.x, which pulls through its transfer
service and honours only ``config_path`` (hosts.toml) and ``headers`` there.
The deprecated ``registry.configs`` switch it back to the old local pull
(``deprecated_registry_auth`` shows it); nothing else here does.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.harness.binaries import built_binary

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
_VERSION_RE = re.compile(r"\bv?(\d+\.\d+\.\d+)\b")


@dataclass(frozen=True)
class ContainerdRuntime:
    """containerd, ctr and containerd-shim-runc-v2 of one version, in one directory."""

    directory: Path
    version: str
    """What ``containerd --version`` reports, as ``vX.Y.Z``."""

    @property
    def containerd(self) -> Path:
        return self.directory / "containerd"

    @property
    def ctr(self) -> Path:
        return self.directory / "ctr"

    def environment(self) -> dict[str, str]:
        """containerd finds its runc shim on PATH (Debian's runc is in /usr/sbin)."""
        return {**os.environ, "PATH": f"{self.directory}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def config(
        self,
        workdir: Path,
        *,
        socket: Path,
        sandbox_image: str,
        hosts_dir: Path,
        cni_conf_dir: Path,
        extra: str = "",
    ) -> str:
        """The node's ``containerd.toml`` (config version 3); ``extra`` is appended as is."""
        images, runtime = (
            'plugins."io.containerd.cri.v1.images"',
            'plugins."io.containerd.cri.v1.runtime"',
        )
        return f"""\
# containerd for the mirrorgate e2e node (containerd {self.version}, config version 3).
version = 3
# Everything containerd keeps under the suite's own directory, so a run
# leaves nothing in /var/lib/containerd or /run/containerd's defaults.
root = "{workdir}/root"
state = "{workdir}/state"

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  # Default /opt/containerd: keep it under the suite's directory too.
  path = "{workdir}/opt"

[{images}]
  snapshotter = "overlayfs"
  [{images}.pinned_images]
    # Built by the suite and pre-pulled with ctr: no public registry is reachable,
    # and the kubelet's pull secrets never apply to the sandbox image.
    sandbox = "{sandbox_image}"
  [{images}.registry]
    # hosts.toml per registry: the loopback registries' CA, and for some
    # scenarios the files `mirrorgate export containerd` writes. Re-read on every
    # pull; with the transfer service, the only registry setting besides headers.
    config_path = "{hosts_dir}"

[{runtime}]
  # Required on this VM: root lacks CAP_SYS_RESOURCE, so runc cannot lower the
  # sandbox's oom_score_adj to -998, and without this every Pod fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        # The kubelet's cgroupDriver is cgroupfs (no systemd here); both must agree.
        SystemdCgroup = false
        # runc's state under the suite's directory, not /run/containerd/runc.
        Root = "{workdir}/runc"
  [{runtime}.cni]
    # Debian's containernetworking-plugins install here, not in /opt/cni/bin.
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{cni_conf_dir}"

[plugins."io.containerd.grpc.v1.cri"]
  # Streaming (exec, attach, port-forward) on loopback only.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
{extra}"""


def deprecated_registry_auth(host: str, username: str, password: str) -> str:
    """``registry.configs."HOST".auth``: the plain-text mirror login containerd is removing.

    Appended to :meth:`ContainerdRuntime.config` by the scenario that shows what
    it does on containerd 2: CRI then leaves the transfer service for the
    local pull (a warning in containerd's log), and sends this login to HOST.
    """
    return (
        f'\n[plugins."io.containerd.cri.v1.images".registry.configs."{host}".auth]\n'
        f'  username = "{username}"\n  password = "{password}"\n'
    )


def containerd_runtime() -> ContainerdRuntime:
    """The built containerd 2 (MissingBinaryError naming the build command otherwise)."""
    binary = built_binary("containerd")
    directory = binary.parent
    for name in ("ctr", "containerd-shim-runc-v2"):
        built_binary(name)
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True, timeout=30
    )
    found = _VERSION_RE.search(out.stdout)
    if found is None:
        raise RuntimeError(f"containerd --version printed no version: {out.stdout.strip()!r}")
    return ContainerdRuntime(directory=directory, version=f"v{found.group(1)}")
