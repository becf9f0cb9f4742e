"""One run of a credential-provider plugin: a bounded exchange, and nothing left behind.

The plugin gets the request on standard input; its standard output (up to a
limit) and the tail of its standard error (whole lines only, so that no line
starts in the middle of something it echoed) are read until it exits, the
output limit is passed, or the deadline comes. The run ends when the plugin
itself exits, not when its pipes close: a child it left holding them (one
started with ``setsid`` leaves its process group and session) does not make
mirrorgate wait for the deadline.

Then everything the plugin started is killed: its process group (it runs in
a session of its own), and every process still carrying the run's marker in
its environment (``MIRRORGATE_PLUGIN_RUN``, inherited through ``setsid`` and
double forks; only a process that clears its environment escapes, as every
one of them escapes the kubelet). The group is killed before the plugin is
reaped, so its process id cannot have been reused by then; marked processes
are signalled through a pidfd opened before their environment is read, so
the process checked is the process killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

__all__ = ["MARKER", "Finished", "run"]

MARKER = "MIRRORGATE_PLUGIN_RUN"
_KILL_ROUNDS = 8
"""Scans of /proc for marked processes; a fork racing a scan is caught by the next."""


@dataclasses.dataclass(frozen=True)
class Finished:
    stdout: bytes = dataclasses.field(repr=False)
    stderr: bytes = dataclasses.field(repr=False)
    """The tail of standard error, whole lines only."""
    returncode: int
    failure: str | None
    """"timeout" when the deadline passed first, "too much" when stdout went over its limit."""


def run(
    argv: Sequence[str],
    env: Mapping[str, str],
    request: bytes,
    *,
    timeout: float,
    stdout_limit: int,
    stderr_limit: int,
) -> Finished:
    """Run the plugin once; OSError when it cannot start."""
    marker = secrets.token_hex(16)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**env, MARKER: marker},
        start_new_session=True,
    )
    try:
        exited = os.pidfd_open(process.pid)
        try:
            stdout, stderr, failure = _exchange(
                process, exited, request, timeout, stdout_limit, stderr_limit
            )
        finally:
            os.close(exited)
    finally:
        _kill_everything_started(process.pid, marker)
        process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    return Finished(stdout, stderr, process.returncode, failure)


class _Captured:
    """Standard output up to its limit, and the tail of standard error."""

    def __init__(self, stdout_limit: int, stderr_limit: int) -> None:
        self.out, self.err = bytearray(), bytearray()
        self.stdout_limit, self.stderr_limit = stdout_limit, stderr_limit
        self.err_cut = False

    def add(self, buffer: bytearray, chunk: bytes) -> None:
        buffer.extend(chunk)
        if len(self.err) > self.stderr_limit:
            del self.err[: -self.stderr_limit]
            self.err_cut = True

    @property
    def too_much(self) -> bool:
        return len(self.out) > self.stdout_limit

    def stderr(self) -> bytes:
        if not self.err_cut:
            return bytes(self.err)
        # The first line kept may start mid-way (mid-secret, even): drop it.
        cut = self.err.find(b"\n")
        return bytes(self.err[cut + 1 :]) if cut >= 0 else b""


def _exchange(
    process: subprocess.Popen[bytes],
    exited: int,
    request: bytes,
    timeout: float,
    stdout_limit: int,
    stderr_limit: int,
) -> tuple[bytes, bytes, str | None]:
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    with contextlib.suppress(BrokenPipeError):  # a plugin may exit without reading
        process.stdin.write(request)  # a few hundred bytes: the pipe takes them at once
        process.stdin.close()
    captured = _Captured(stdout_limit, stderr_limit)
    failure: str | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, captured.out)
        selector.register(process.stderr, selectors.EVENT_READ, captured.err)
        selector.register(exited, selectors.EVENT_READ, None)
        while failure is None:
            left = deadline - time.monotonic()
            ready = selector.select(left) if left > 0 else []
            if not ready:
                failure = "timeout"
            elif any(key.data is None for key, _ in ready):
                failure = _drain(selector, captured, deadline)
                break
            for key, _ in ready:
                chunk = os.read(key.fd, 1 << 16) if key.data is not None else None
                if chunk == b"":
                    selector.unregister(key.fileobj)
                elif chunk:
                    captured.add(key.data, chunk)
            if captured.too_much:
                failure = "too much"
    return bytes(captured.out[:stdout_limit]), captured.stderr(), failure


def _drain(selector: selectors.BaseSelector, captured: _Captured, deadline: float) -> str | None:
    """The plugin exited: take what it wrote, without waiting for an end a child may hold off."""
    for key in list(selector.get_map().values()):
        if key.data is None:
            continue
        os.set_blocking(key.fd, False)
        while not captured.too_much and time.monotonic() < deadline:
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                break  # all the plugin wrote is taken; the rest would be a child's
            if not chunk:
                break
            captured.add(key.data, chunk)
    return "too much" if captured.too_much else None


def _kill_everything_started(leader: int, marker: str) -> None:
    # The group first, while its leader is unreaped: its id is not reused.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)
    needle = f"{MARKER}={marker}".encode()
    for _ in range(_KILL_ROUNDS):
        if not _kill_marked(needle):
            return


def _kill_marked(needle: bytes) -> int:
    """SIGKILL every live process whose environment holds ``needle``; how many."""
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            pidfd = os.pidfd_open(int(entry.name))
        except OSError:
            continue  # gone, or not ours to see
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                environ = handle.read()  # empty for a zombie: nothing left to kill
            if needle in environ.split(b"\0"):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed += 1
        except OSError:
            pass  # exited meanwhile, or another user's
        finally:
            os.close(pidfd)
    return killed
