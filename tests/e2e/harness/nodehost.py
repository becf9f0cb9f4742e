"""What a node changes on the host, and how the suite puts it back.

A kubelet is a host-level program: it rewrites sysctls, adds iptables chains,
creates cgroups, mounts, network namespaces and a few directories at fixed
paths (`../shared/node.md` lists what a probe found). `HostState.capture()`
records all of that before the node starts; `restore()` undoes what changed
and `leftovers()` says what still differs, so the suite can assert that it
left the machine as it found it.

The fixed paths also mean that only one node can run on a machine at a time:
`machine_lock()` takes an exclusive flock under /run/lock for as long as a
node runs, across every process on the machine.

A suite that is killed (SIGKILL, a timeout, the end of a session) never gets
to `restore()`. So the state `capture()` found is also written to a journal
under /run/lock while the node runs, and removed once it has been restored;
the next node, holding the lock, finds a journal left behind and restores the
host to it first (`recover_unfinished()`). Without that, the killed node's
chains and links would count as the host's own from then on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

LOCK_PATH = Path("/run/lock/mirrorgate-e2e-node.lock")
# The host as the running node found it; gone once the node has restored it.
JOURNAL_PATH = Path("/run/lock/mirrorgate-e2e-node.host.json")
# Another suite's node usually runs for a few minutes: wait that long, then fail.
LOCK_TIMEOUT = float(os.environ.get("MIRRORGATE_NODE_LOCK_TIMEOUT", "900"))

# Set by the kubelet (vm.*, kernel.*: setupKernelTunables with
# protectKernelDefaults false) and by the bridge CNI plugin (ip_forward).
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
)
# Paths the kubelet, containerd and the CNI plugins use whatever they are told.
FIXED_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/var/lib/cni"),
    Path("/run/containerd"),
    Path("/run/netns"),
    Path("/usr/libexec/kubernetes"),
    Path("/opt/containerd"),
)
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The bridge the suite's CNI configuration names, and the veths of its Pods.
BRIDGE = "mge2e0"
LINK_PREFIXES = (BRIDGE, "veth")
POD_CGROUP = "kubepods"


class NodeLockError(RuntimeError):
    """Another node holds the machine-wide lock for longer than we wait."""


@contextlib.contextmanager
def machine_lock(timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Hold /run/lock/mirrorgate-e2e-node.lock exclusively, or raise NodeLockError.

    flock, not a PID file: the kernel drops the lock when its holder dies, so a
    killed run never leaves the machine locked. The holder's PID is written
    into the file only to name it in the message of whoever waits.
    """
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            if time.monotonic() >= deadline:
                raise NodeLockError(
                    f"another e2e node (pid {holder}) has held {LOCK_PATH} for over "
                    f"{timeout:.0f} s; the kubelet uses fixed host paths, so only one node "
                    "may run per machine. Wait for it, or raise MIRRORGATE_NODE_LOCK_TIMEOUT."
                )
            if not announced:
                print(
                    f"\nwaiting for {LOCK_PATH}: another e2e node (pid {holder}) is running",
                    flush=True,
                )
                announced = True
            time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def recover_unfinished() -> list[str]:
    """Restore the host a node of a killed run left changed; what it undid, or [].

    Call holding `machine_lock()`, before `HostState.capture()`: the lock
    proves that the node which wrote the journal is gone. Processes it left
    running (their command lines name its work directory) are killed first.
    """
    if not JOURNAL_PATH.exists():
        return []
    try:
        earlier = HostState.from_journal(JOURNAL_PATH.read_text())
    except (OSError, ValueError, KeyError, TypeError) as error:
        JOURNAL_PATH.unlink(missing_ok=True)
        return [f"an unreadable journal ({error}), removed"]
    killed = _kill_processes_naming(earlier.workdir)
    # Containers outlive their killed shims (a Pod's pause, say) and name no directory
    # of the node: they are found by the Pod cgroups they keep from being removed.
    killed += _kill_processes_in([top for top in _cgroups() if top not in earlier.cgroups])
    undone = [*(f"process {pid}" for pid in killed), *earlier.leftovers()]
    earlier.restore()
    left = earlier.leftovers()
    if left:
        raise RuntimeError(
            f"a node of an earlier run left the host changed ({JOURNAL_PATH}) "
            "and restoring it failed: " + "; ".join(left)
        )
    HostState.forget()
    return undone


def _kill_processes_naming(workdir: Path) -> list[int]:
    """SIGKILL every process whose command line names ``workdir``; their PIDs."""
    marker = str(workdir).encode()
    naming = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "cmdline").read_bytes():
                naming.append(int(entry.name))
    return kill_and_reap(naming)  # reaped before their mounts and links go


def _kill_processes_in(cgroups: list[Path]) -> list[int]:
    """SIGKILL every process in ``cgroups`` or below them; their PIDs."""
    pids: set[int] = set()
    for top in cgroups:
        for directory, _subdirs, _files in os.walk(top):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (Path(directory) / "cgroup.procs").read_text().split())
    pids.discard(os.getpid())
    return kill_and_reap(pids)  # reaped before their cgroups go


def kill_and_reap(pids: Iterable[int], *, timeout: float = 30) -> list[int]:
    """SIGKILL ``pids`` and wait until each is gone or a zombie (by then the kernel has
    released its files, mounts and cgroup); the PIDs signalled, sorted."""
    killed: set[int] = set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
    alive = set(killed)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"}
        if alive:
            time.sleep(0.1)
    return sorted(killed)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


def _sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = (Path("/proc/sys") / name).read_text().strip()
    return values


def _chains() -> dict[tuple[str, str], frozenset[str]]:
    chains = {}
    for tool in IPTABLES:
        if shutil.which(tool) is None:
            continue
        for table in TABLES:
            listing = _run(tool, "-w", "5", "-t", table, "-S")
            chains[tool, table] = frozenset(
                line.split()[1] for line in listing.splitlines() if line.startswith("-N ")
            )
    return chains


def _cgroups() -> list[Path]:
    """Every `kubepods` cgroup directory, one per mounted hierarchy."""
    found = []
    for hierarchy in sorted(CGROUP_ROOT.iterdir()):
        candidate = hierarchy / POD_CGROUP
        if candidate.is_dir():
            found.append(candidate)
    return found


def _netns() -> frozenset[str]:
    """Network namespaces the CRI made for Pod sandboxes (named cni-<uuid>)."""
    directory = Path("/run/netns")
    if not directory.is_dir():
        return frozenset()
    return frozenset(p.name for p in directory.iterdir() if p.name.startswith("cni-"))


def _mounts_under(prefixes: tuple[Path, ...]) -> list[str]:
    """Mount points under any of `prefixes`, deepest first (the order to unmount)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces and the like octal-escaped.
        point = line.split()[4].encode().decode("unicode_escape")
        if any(point == str(p) or point.startswith(f"{p}/") for p in prefixes):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def _links() -> frozenset[str]:
    """The node's network links: the CNI bridge and the host ends of Pods' veth pairs."""
    return frozenset(
        p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(LINK_PREFIXES)
    )


@dataclass(frozen=True)
class HostState:
    """The parts of the host a node changes, as they were at `capture()`."""

    sysctls: dict[str, str]
    chains: dict[tuple[str, str], frozenset[str]]
    paths: frozenset[Path]
    netns: frozenset[str]
    links: frozenset[str]
    cgroups: tuple[Path, ...]
    workdir: Path
    notes: list[str] = field(default_factory=list)

    @classmethod
    def capture(cls, workdir: Path) -> HostState:
        return cls(
            sysctls=_sysctls(),
            chains=_chains(),
            paths=frozenset(p for p in FIXED_PATHS if os.path.lexists(p)),
            netns=_netns(),
            links=_links(),
            cgroups=tuple(_cgroups()),
            workdir=workdir,
        )

    def journal(self) -> None:
        """Write this state where the next node finds it should this run die unrestored."""
        record = {
            "sysctls": self.sysctls,
            "workdir": str(self.workdir),
            "chains": [
                [tool, table, sorted(chains)] for (tool, table), chains in self.chains.items()
            ],
            "paths": sorted(map(str, self.paths)),
            "netns": sorted(self.netns),
            "links": sorted(self.links),
            "cgroups": [str(c) for c in self.cgroups],
        }
        partial = JOURNAL_PATH.with_suffix(".partial")
        partial.write_text(json.dumps(record))
        partial.replace(JOURNAL_PATH)

    @staticmethod
    def forget() -> None:
        """The host is restored: nothing for the next node to undo."""
        JOURNAL_PATH.unlink(missing_ok=True)

    @classmethod
    def from_journal(cls, text: str) -> HostState:
        record = json.loads(text)
        return cls(
            sysctls=dict(record["sysctls"]),
            chains={(tool, table): frozenset(chains) for tool, table, chains in record["chains"]},
            paths=frozenset(map(Path, record["paths"])),
            netns=frozenset(record["netns"]),
            links=frozenset(record["links"]),
            cgroups=tuple(map(Path, record["cgroups"])),
            workdir=Path(record["workdir"]),
        )

    def _created_paths(self) -> list[Path]:
        return [p for p in FIXED_PATHS if p not in self.paths and os.path.lexists(p)]

    def restore(self) -> None:
        """Undo every change since `capture()`; call once every node process is gone.

        Each step runs even if an earlier one failed; the first error is raised at the end.
        """
        errors: list[BaseException] = []
        for step in (
            self._unmount,
            self._remove_netns,
            self._remove_links,
            self._remove_chains,
            self._remove_cgroups,
            self._remove_paths,
            self._restore_sysctls,
        ):
            try:
                step()
            except Exception as error:  # keep undoing the rest
                errors.append(error)
        if errors:
            raise errors[0]

    def leftovers(self) -> list[str]:
        """What still differs from `capture()`: empty when the host is as it was."""
        left = [
            f"sysctl {name} is {value}, was {self.sysctls[name]}"
            for name, value in _sysctls().items()
            if name in self.sysctls and value != self.sysctls[name]
        ]
        for key, chains in _chains().items():
            left += [
                f"{key[0]} -t {key[1]} chain {c}"
                for c in sorted(chains - self.chains.get(key, frozenset()))
            ]
        left += [f"path {p}" for p in self._created_paths()]
        left += [f"network namespace {n}" for n in sorted(_netns() - self.netns)]
        left += [f"network link {n}" for n in sorted(_links() - self.links)]
        left += [f"cgroup {c}" for c in _cgroups() if c not in self.cgroups]
        left += [f"mount {m}" for m in _mounts_under((self.workdir, *self._created_paths()))]
        return left

    def _unmount(self) -> None:
        # Lazy (MNT_DETACH): a mount still busy is detached now and freed when idle.
        for point in _mounts_under((self.workdir, *self._created_paths())):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True, timeout=30)

    def _remove_netns(self) -> None:
        for name in sorted(_netns() - self.netns):
            subprocess.run(
                ["ip", "netns", "delete", name], check=False, capture_output=True, timeout=30
            )

    def _remove_links(self) -> None:
        for name in sorted(_links() - self.links):
            subprocess.run(
                ["ip", "link", "delete", name], check=False, capture_output=True, timeout=30
            )

    def _remove_chains(self) -> None:
        for (tool, table), chains in _chains().items():
            new = chains - self.chains.get((tool, table), frozenset())
            if not new:
                continue
            # First the rules that jump to the new chains (from any chain), then the chains.
            for line in _run(tool, "-w", "5", "-t", table, "-S").splitlines():
                words = line.split()
                target = words[words.index("-j") + 1] if "-j" in words[:-1] else None
                if words[0] == "-A" and target in new and words[1] not in new:
                    _run(tool, "-w", "5", "-t", table, "-D", *words[1:])
            for chain in sorted(new):
                _run(tool, "-w", "5", "-t", table, "-F", chain)
            for chain in sorted(new):
                _run(tool, "-w", "5", "-t", table, "-X", chain)

    def _remove_cgroups(self) -> None:
        for top in _cgroups():
            if top in self.cgroups:
                continue
            # rmdir bottom-up: a cgroup directory goes only once it has no children.
            for directory, _subdirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(directory)

    def _remove_paths(self) -> None:
        for path in self._created_paths():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    def _restore_sysctls(self) -> None:
        for name, value in self.sysctls.items():
            current = (Path("/proc/sys") / name).read_text().strip()
            if current != value:
                (Path("/proc/sys") / name).write_text(value)
