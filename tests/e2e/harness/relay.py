"""A TCP relay from an address Pods can reach to the API server on loopback.

This machine's API servers listen on 127.0.0.1 only (loopback-only test
traffic), and there is no kube-proxy, so a Pod cannot reach its cluster's API
server. In-cluster tests relay the bridge's gateway address (in the host's
network namespace, made by the node's CNI) to it: bytes only, TLS end to end
between the Pod and the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

# Enough for the replicas' informers, leases and writes; a runaway client
# cannot make the test process hold more.
MAX_CONNECTIONS = 64


class TcpRelay:
    """Listens on (host, a free port) and pipes each connection to target."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.host = host
        self.target = target
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-relay", daemon=True)
        self._connections: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._error: BaseException | None = None

    def start(self) -> TcpRelay:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"relay on {self.host} did not start: {self._error}")
        return self

    def stop(self) -> None:
        """Close the listener and every relayed connection, then the loop."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, self.host, 0)
            )
        except OSError as error:
            self._error = error
            self._ready.set()
            self._loop.close()
            return
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        writers = [writer]
        try:
            if len(self._connections) >= MAX_CONNECTIONS:
                return
            self._connections.add(task)
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            writers.append(up_writer)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass  # the API server went away, or the relay is stopping
        finally:
            self._connections.discard(task)
            for w in writers:
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.write_eof()


@contextlib.contextmanager
def relay(host: str, target: tuple[str, int]) -> Iterator[TcpRelay]:
    started = TcpRelay(host, target).start()
    try:
        yield started
    finally:
        started.stop()
