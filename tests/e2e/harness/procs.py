"""Child processes for the end-to-end harness: started with logs in files, always reaped."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO

import httpx

# prctl(PR_SET_PDEATHSIG): the kernel kills the child if pytest itself dies (SIGKILL
# from a CI timeout), so an etcd or kube-apiserver never outlives its run. SIGKILL, not
# SIGTERM: etcd and kube-apiserver terminated together wait on each other's open
# watch streams and were seen still alive seconds later; their data is throwaway.
# The signal follows the *thread* that started the child: start children from the
# thread that lives as long as they should (pytest's main thread, for fixtures).
_PR_SET_PDEATHSIG = 1
try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (AttributeError, OSError):  # not Linux: the finally-teardown still applies
    _prctl = None


def _die_with_parent() -> None:
    # Runs in the forked child before exec: no allocation-heavy work here.
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_ok(get: Callable[[], httpx.Response]) -> str | None:
    """A `wait_until` check: None once `get` answers 200, else the status or the error."""
    try:
        response = get()
    except httpx.HTTPError as error:
        return type(error).__name__
    return None if response.status_code == 200 else f"{response.status_code} {response.text}"


def wait_until(
    check: Callable[[], str | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    alive: Callable[[], str | None] = lambda: None,
) -> float:
    """Poll `check` until it returns None (ready) or the deadline passes.

    `check` returns a short reason while not ready; `alive` returns a reason when
    waiting is pointless (the process already exited). Returns the seconds waited.
    """
    start = time.monotonic()
    deadline = start + timeout
    while True:
        dead = alive()
        if dead is not None:
            raise RuntimeError(f"{what}: {dead}")
        reason = check()
        if reason is None:
            return time.monotonic() - start
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:.0f} s (last: {reason})")
        time.sleep(interval)


class ManagedProcess:
    """One long-running child with stdout+stderr in a log file; `stop()` always reaps it."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        redact: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        # Secrets that must never reach a failure message, even if a child logs them.
        self._redact = [s for s in redact if s]
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                # Own session: a Ctrl-C aimed at pytest does not kill the children
                # before the fixtures' finally blocks get to stop them in order.
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except BaseException:
            self._log.close()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def exited(self) -> str | None:
        """A reason string if the process has already exited, else None."""
        code = self._proc.poll()
        return None if code is None else f"{self.name} exited with status {code}"

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the log, with known secrets replaced by ***."""
        if not self._log.closed:
            self._log.flush()
        try:
            data = self.log_path.read_bytes()[-64 * 1024 :]
        except OSError as exc:
            return f"<no log: {exc}>"
        text = "\n".join(data.decode(errors="replace").splitlines()[-lines:])
        for secret in self._redact:
            text = text.replace(secret, "***")
        return text

    def log_text(self) -> str:
        """The whole log so far, with known secrets replaced by ***."""
        if not self._log.closed:
            self._log.flush()
        text = self.log_path.read_text(errors="replace")
        for secret in self._redact:
            text = text.replace(secret, "***")
        return text

    def describe_failure(self, lines: int = 40) -> str:
        """A block for failure messages: what happened plus the log tail."""
        state = self.exited() or f"{self.name} still running (pid {self.pid})"
        return f"{state}; last {lines} lines of {self.log_path}:\n{self.log_tail(lines)}"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to `timeout`, then SIGKILL; always waits so no zombie is left."""
        try:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        finally:
            self._log.close()


def stop_all(procs: list[ManagedProcess]) -> None:
    """Stop in reverse start order (dependents first) and reap every one, even on errors."""
    errors: list[BaseException] = []
    for proc in reversed(procs):
        try:
            proc.stop()
        except BaseException as exc:  # keep going: one failure must not leak the rest
            errors.append(exc)
    procs.clear()
    if errors:
        raise errors[0]
