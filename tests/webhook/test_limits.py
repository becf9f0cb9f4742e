"""The real HTTPS server under abuse: header floods, slow and idle clients, too many connections.

Real sockets against the real server on loopback, with short timeouts so
that every case takes well under a second of waiting. Each asserts what the
server did (the answer, the closed socket, the metric naming the reason) and
that an ordinary admission is still answered afterwards. Before issue 10
every one of these connections stayed open, and every flood was accepted.
Before issue 19 a client that pipelined requests and never read the answers
pinned its connection for good, and enough of them locked everyone out.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson
import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair
from mirrorgate.webhook.edge.connections import Connection, ConnectionTable, State
from mirrorgate.webhook.edge.limits import Limits
from mirrorgate.webhook.edge.protocol import MAX_CHUNKS, LimitedHttpProtocol
from tests.webhook import policies, serving
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.reviews import PROM_IMAGE, PROM_MIRRORED, apply, patch_ops, pod, review
from tests.webhook.scrape import samples

LIMITS = Limits(
    max_connections=20,
    max_header_bytes=8 * 1024,
    max_headers=40,
    header_timeout=0.6,
    body_timeout=0.6,
    idle_timeout=0.6,
    max_buffered_bytes=1 << 20,
    write_timeout=0.6,
)
GRACE = 5.0
"""Longest wait for the server to act on a limit (timeouts are swept a few times a second)."""
_T = TypeVar("_T")


@pytest.fixture(scope="module")
def limited(
    tmp_path_factory: pytest.TempPathFactory, serving_pair: KeyPair
) -> Iterator[serving.Running]:
    with serving.serve(
        tmp_path_factory.mktemp("limited"),
        pair=serving_pair,
        policy=policies.POLICY,
        secrets=RecordingPullSecrets(stale=False),
        limits=LIMITS,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def patient(
    tmp_path_factory: pytest.TempPathFactory, serving_pair: KeyPair
) -> Iterator[serving.Running]:
    """The same limits with long timeouts: only the connection and byte limits act."""
    slow = dataclasses.replace(
        LIMITS, header_timeout=60, body_timeout=60, idle_timeout=60, write_timeout=60
    )
    with serving.serve(
        tmp_path_factory.mktemp("patient"),
        pair=serving_pair,
        policy=policies.POLICY,
        secrets=RecordingPullSecrets(stale=False),
        limits=slow,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def crowded(
    tmp_path_factory: pytest.TempPathFactory, serving_pair: KeyPair
) -> Iterator[serving.Running]:
    """Long timeouts, room for 4 connections (the limit is reached with few pinned), and
    heads of any size (a read of pipelined requests was once taken for one head)."""
    slow = dataclasses.replace(
        LIMITS,
        header_timeout=60,
        body_timeout=60,
        idle_timeout=60,
        write_timeout=60,
        max_connections=4,
        max_header_bytes=1 << 20,
    )
    with serving.serve(
        tmp_path_factory.mktemp("crowded"),
        pair=serving_pair,
        policy=policies.POLICY,
        secrets=RecordingPullSecrets(stale=False),
        limits=slow,
    ) as running:
        yield running


OUTPUT_BUDGET = 256 * 1024


@pytest.fixture(scope="module")
def frugal(
    tmp_path_factory: pytest.TempPathFactory, serving_pair: KeyPair
) -> Iterator[serving.Running]:
    """Long timeouts and a small output budget: only the budget closes unread answers."""
    slow = dataclasses.replace(
        LIMITS,
        header_timeout=60,
        body_timeout=60,
        idle_timeout=60,
        write_timeout=60,
        max_unsent_bytes=OUTPUT_BUDGET,
    )
    with serving.serve(
        tmp_path_factory.mktemp("frugal"),
        pair=serving_pair,
        policy=policies.POLICY,
        secrets=RecordingPullSecrets(stale=False),
        limits=slow,
    ) as running:
        yield running


@pytest.fixture
def context(ca: CertificateAuthority) -> ssl.SSLContext:
    return serving.client_context(ca.cert_pem)


def dropped(running: serving.Running) -> dict[str, float]:
    """mirrorgate_connections_dropped_total by reason, read from /metrics."""
    payload, _ = running.server.runtime.metrics.render()
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in samples(payload.decode()).items()
        if name == "mirrorgate_connections_dropped_total"
    }


def on_loop(running: serving.Running, read: Callable[[ConnectionTable], _T]) -> _T:
    """``read(table)``, run on the server's event loop: the table and its connections change
    there, and are read only there (never sampled from this thread while the loop runs)."""
    table = running.server.connections
    assert table is not None
    result: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def call() -> None:
        try:
            result.set_result(read(table))
        except BaseException as error:  # handed to the test thread, re-raised there
            result.set_exception(error)

    running.uvicorn.servers[0].get_loop().call_soon_threadsafe(call)
    return result.result(GRACE)


def protocols(table: ConnectionTable) -> list[LimitedHttpProtocol]:
    """The open connections (to be called on the loop, by :func:`on_loop`)."""
    return [cast("LimitedHttpProtocol", connection) for connection in table.open]


def open_connections(running: serving.Running) -> int:
    return on_loop(running, lambda table: len(table.open))


def tls(running: serving.Running, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", running.port), timeout=GRACE)
    return context.wrap_socket(raw, server_hostname="localhost")


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (fails if it stays open past GRACE)."""
    sock.settimeout(GRACE)
    data = b""
    with contextlib.suppress(ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def closes_within_grace(sock: socket.socket) -> float:
    started = time.monotonic()
    read_until_closed(sock)
    return time.monotonic() - started


def admission_works(running: serving.Running, context: ssl.SSLContext) -> None:
    obj = pod(PROM_IMAGE)
    body = orjson.dumps(review(obj))
    with tls(running, context) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        head, answer = serving.read_response(sock)
    assert head.startswith(b"HTTP/1.1 200")
    patched = apply(obj, patch_ops(orjson.loads(answer)["response"]))
    assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED


def test_fifty_thousand_headers_are_refused(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    before = dropped(limited).get("header-limit", 0)
    with tls(limited, context) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        with contextlib.suppress(OSError):  # the server may close while we still send
            sock.sendall(b"X-A: b\r\n" * 50_000 + b"\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert dropped(limited)["header-limit"] > before
    admission_works(limited, context)


def test_forty_one_small_headers_are_refused_by_count(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    with tls(limited, context) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 40 + b"\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert answer.endswith(b"more than 40 header fields")


def test_a_megabyte_content_type_is_refused(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    with tls(limited, context) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(
                b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                + b"a" * (1 << 20)
                + b"\r\n\r\n"
            )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"request head exceeds the 8192-byte limit" in answer


def test_a_head_of_exactly_the_limit_is_served(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: "
    # Counted: the URL and each header's name and value (here /healthz, host x, x-pad ...).
    pad = LIMITS.max_header_bytes - len("/healthz") - len("hostx") - len("x-pad")
    with tls(limited, context) as sock:
        sock.sendall(head + b"p" * pad + b"\r\n\r\n")
        status, body = serving.read_response(sock)
    assert status.startswith(b"HTTP/1.1 200")
    assert body == b"ok\n"


def test_a_client_that_never_speaks_is_closed(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """After its handshake, nothing: closed at the header timeout."""
    before = dropped(limited).get("header-timeout", 0)
    with tls(limited, context) as sock:
        assert closes_within_grace(sock) < GRACE
    assert dropped(limited)["header-timeout"] > before


def test_a_client_that_never_starts_tls_is_closed(limited: serving.Running) -> None:
    def counted() -> float:
        page = dropped(limited)
        return page.get("handshake-failed", 0) + page.get("header-timeout", 0)

    before = counted()
    with socket.create_connection(("127.0.0.1", limited.port), timeout=GRACE) as raw:
        assert closes_within_grace(raw) < GRACE
    serving.wait_for(lambda: counted() > before or None, what="the drop to be counted")


def test_a_head_sent_a_byte_at_a_time_is_closed(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """Slowloris: every byte in time for any per-read timeout, the head never done."""
    with tls(limited, context) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        started = time.monotonic()
        with contextlib.suppress(OSError):
            while time.monotonic() - started < GRACE:
                sock.sendall(b"X")
                time.sleep(0.05)
        answer = read_until_closed(sock)
    assert answer == b""
    assert time.monotonic() - started < GRACE


def test_a_body_that_stalls_is_closed(limited: serving.Running, context: ssl.SSLContext) -> None:
    before = dropped(limited).get("body-timeout", 0)
    with tls(limited, context) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"apiVersion":'
        )
        assert closes_within_grace(sock) < GRACE
    assert dropped(limited)["body-timeout"] > before
    admission_works(limited, context)


def test_an_idle_keep_alive_connection_is_closed(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    with tls(limited, context) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _ = serving.read_response(sock)
        assert status.startswith(b"HTTP/1.1 200")
        assert closes_within_grace(sock) < GRACE


def test_idle_clients_never_lock_out_a_new_connection(
    patient: serving.Running, context: ssl.SSLContext
) -> None:
    """Twice the connection limit held idle: each newcomer takes the oldest one's place."""
    before = dropped(patient).get("evicted", 0)
    idle = [tls(patient, context) for _ in range(2 * LIMITS.max_connections)]
    try:
        assert open_connections(patient) <= LIMITS.max_connections
        admission_works(patient, context)
        assert dropped(patient)["evicted"] - before >= LIMITS.max_connections
    finally:
        for sock in idle:
            sock.close()


def test_stalled_bodies_over_the_budget_make_room_for_a_new_request(
    patient: serving.Running, context: ssl.SSLContext
) -> None:
    """Bodies that stop short hold bytes; past the budget the oldest readers are closed."""
    before = dropped(patient).get("body-budget", 0)
    chunk = b"x" * (LIMITS.max_buffered_bytes // 3)
    stalled = []
    try:
        for _ in range(5):
            sock = tls(patient, context)
            sock.sendall(
                b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 4000000\r\n\r\n" + chunk
            )
            stalled.append(sock)
        admission_works(patient, context)
        serving.wait_for(
            lambda: dropped(patient).get("body-budget", 0) > before or None,
            what="the body budget to close a stalled reader",
        )
        assert on_loop(patient, lambda table: table.buffered) <= LIMITS.max_buffered_bytes
    finally:
        for sock in stalled:
            sock.close()


def admission_request(obj: dict[str, Any]) -> bytes:
    body = orjson.dumps(review(obj))
    return (
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def padded(obj: dict[str, Any], size: int) -> dict[str, Any]:
    """``obj`` with an annotation that makes its review about ``size`` bytes longer."""
    obj["metadata"]["annotations"] = {"padding": "x" * size}
    return obj


@contextlib.contextmanager
def pipelining_unread(
    running: serving.Running, context: ssl.SSLContext, request: bytes, count: int
) -> Iterator[ssl.SSLSocket]:
    """A connection that pipelines ``count`` copies of ``request`` and reads no answer (its
    receive buffer small, as in :func:`never_reading`); sent from a thread of its own, since
    the server stops reading it a few requests ahead of the answer it waits to send."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(60)
    raw.connect(("127.0.0.1", running.port))
    sock = context.wrap_socket(raw, server_hostname="localhost")

    def send() -> None:
        with contextlib.suppress(OSError):  # closed by the server, or by the test
            sock.sendall(request * count)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield sock
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        sender.join(GRACE)


def test_bodies_held_for_unread_answers_never_crowd_out_a_client_that_reads(
    patient: serving.Running, context: ssl.SSLContext
) -> None:
    """Issue 29, 1: a client that pipelines reviews and never reads its answers holds their
    bodies; past the body budget it is closed, not the client that reads.

    Each round an attacker pipelines reviews of 100 KB (1,000 containers,
    so that each answer's patch is larger still) and reads nothing; once
    the server waits on it, nine of its bodies are held (900 KB of the
    1 MiB budget). A victim then sends a 300 KB review and reads the answer.
    Before, the victim's body read was what the budget closed, every round.
    """
    attack = admission_request(padded(pod(*[PROM_IMAGE] * 1000), 36_000))
    obj = padded(pod(PROM_IMAGE), LIMITS.max_buffered_bytes * 3 // 10)
    request = admission_request(obj)
    before = dropped(patient).get("body-budget", 0)
    refused = []

    def holding(table: ConnectionTable) -> bool:
        return any(
            len(connection.pipeline) >= LIMITS.max_pipelined - 1
            for connection in protocols(table)
            if connection in table.stalled
        )

    for round_ in range(3):
        with pipelining_unread(patient, context, attack, 60):
            serving.wait_for(
                lambda: on_loop(patient, holding) or None,
                what="the attacker's requests to be held parsed, its answers unread",
                timeout=30,
            )
            # Counted, each body until its own answer (once, an answer freed them all).
            assert on_loop(patient, lambda table: table.buffered) >= 8 * len(attack)
            try:
                with tls(patient, context) as victim:
                    victim.sendall(request)
                    head, answer = serving.read_response(victim)
                assert head.startswith(b"HTTP/1.1 200"), head
                patched = apply(obj, patch_ops(orjson.loads(answer)["response"]))
                assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED
            except (OSError, AssertionError) as error:
                refused.append(f"round {round_ + 1}: {error!r}")
    assert not refused, f"the victim was refused: {refused}"
    assert dropped(patient)["body-budget"] - before == 3  # the three attackers
    assert on_loop(patient, lambda table: table.buffered) <= LIMITS.max_buffered_bytes


def test_a_client_that_does_not_read_gets_no_more_of_its_pipeline_started(
    patient: serving.Running, context: ssl.SSLContext
) -> None:
    """Issue 29, 1: the next pipelined request of a client that does not read the answer
    before it is not started until that answer drains: its reviews cannot hold the review
    worker or the loop ahead of clients that read. Before, one more was decoded and
    planned for every stall, its answer left waiting to be sent.

    Counted on the loop, where the table and the counts change: once the attacker's next
    request is held for the drain and three victims have been answered, the server has
    decided exactly the attacker's answered requests and the victims'.
    """
    attack = admission_request(padded(pod(*[PROM_IMAGE] * 1000), 36_000))
    request = admission_request(pod(PROM_IMAGE))
    counts = patient.server.runtime.metrics.counts

    def decided(_: ConnectionTable) -> int:
        return sum(counts.admissions.values())

    def held(table: ConnectionTable) -> list[int]:
        return [
            connection.answered
            for connection in protocols(table)
            if connection in table.stalled and connection.after_drain is not None
        ]

    start = on_loop(patient, decided)
    with pipelining_unread(patient, context, attack, 20):
        serving.wait_for(
            lambda: on_loop(patient, held) or None,
            what="the attacker's next request held until its unread answer drains",
            timeout=30,
        )
        for _ in range(3):
            with tls(patient, context) as victim:
                victim.sendall(request)
                head, _ = serving.read_response(victim)
            assert head.startswith(b"HTTP/1.1 200"), head
        (answered,) = on_loop(patient, held)
        assert on_loop(patient, decided) - start == answered + 3


def test_a_client_hello_split_in_two_is_served(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """The first bytes reach the TLS layer however they are cut (the acceptor keeps none)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    hello = outgoing.read()
    with socket.create_connection(("127.0.0.1", limited.port), timeout=GRACE) as raw:
        raw.sendall(hello[:7])
        time.sleep(0.1)
        raw.sendall(hello[7:])
        while True:
            try:
                client.do_handshake()
                break
            except ssl.SSLWantReadError:
                if data := outgoing.read():
                    raw.sendall(data)
                received = raw.recv(65536)
                assert received, "closed during the handshake"
                incoming.write(received)
        raw.sendall(outgoing.read())
        client.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        raw.sendall(outgoing.read())
        answer = b""
        while b"ok\n" not in answer:
            try:
                answer += client.read(65536)
            except ssl.SSLWantReadError:
                incoming.write(raw.recv(65536))
    assert answer.startswith(b"HTTP/1.1 200")


def test_limits_must_be_positive(tmp_path: Path, serving_pair: KeyPair) -> None:
    from mirrorgate.webhook import errors
    from mirrorgate.webhook.commands.serve import process, settings, wiring

    cert, key = serving.write_pair(tmp_path, serving_pair)
    (tmp_path / "policy.yaml").write_text(policies.POLICY)
    built = wiring.build(
        settings.Settings(
            policy=str(tmp_path / "policy.yaml"),
            tls_cert=str(cert),
            tls_key=str(key),
            limits=Limits(max_connections=0, idle_timeout=-1),
        )
    )
    with pytest.raises(
        errors.ConfigError,
        match="--max-connections must be positive, got 0; --idle-timeout must be positive, got -1",
    ):
        process.uvicorn_config(built)


GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
"""34 bytes."""
METRICS = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def never_reading(
    running: serving.Running, context: ssl.SSLContext, requests: int = 1000
) -> ssl.SSLSocket:
    """A connection that pipelines ``requests`` GET /metrics and reads none of the answers.

    Its receive buffer is small, so that the kernel takes few answers before
    the server's own buffers fill (on loopback it would take megabytes).
    """
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(GRACE)
    raw.connect(("127.0.0.1", running.port))
    sock = context.wrap_socket(raw, server_hostname="localhost")
    sock.sendall(METRICS * requests)
    return sock


def pinned_down(running: serving.Running, count: int) -> Callable[[], bool | None]:
    """A probe: ``count`` connections open, each with an answer due that its client does not
    read.

    Answers flow until the kernel's and the server's buffers are full; then
    the transport pauses writing (the table holds the connection as
    stalled) and the server waits on the client.
    """

    def pinned(table: ConnectionTable) -> bool:
        return len(table.open) == count and all(
            connection.state is State.BUSY and connection in table.stalled
            for connection in table.open
        )

    return lambda: on_loop(running, pinned) or None


def test_clients_that_never_read_cannot_lock_out_a_new_one(
    crowded: serving.Running, context: ssl.SSLContext
) -> None:
    """Issue 19, 1: every connection pinned by answers its client never reads."""
    limit = crowded.server.settings.limits.max_connections
    before = dropped(crowded).get("evicted", 0)
    with contextlib.ExitStack() as pinned:
        for _ in range(limit):
            pinned.enter_context(never_reading(crowded, context, 3000))
        serving.wait_for(
            pinned_down(crowded, limit), what="every connection to be pinned", timeout=30
        )
        started = time.monotonic()
        admission_works(crowded, context)
        assert time.monotonic() - started < 1.0
        assert dropped(crowded)["evicted"] > before


def test_a_client_that_never_reads_is_closed_at_the_write_timeout(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """Timed from when the server sees it stop reading: filling the buffers before that
    takes as long as rendering the answers does on a loaded machine."""
    before = dropped(limited).get("write-timeout", 0)

    def closed() -> bool:
        return dropped(limited).get("write-timeout", 0) > before

    with never_reading(limited, context):
        serving.wait_for(
            lambda: closed() or on_loop(limited, lambda table: bool(table.stalled)) or None,
            what="the client to be seen not reading",
            timeout=30,
        )
        serving.wait_for(
            lambda: closed() or None,
            what="the write timeout to close the connection",
            timeout=GRACE,
        )
    admission_works(limited, context)


def test_unread_answers_over_the_output_budget_close_the_first_to_stop_reading(
    frugal: serving.Running, context: ssl.SSLContext
) -> None:
    before = dropped(frugal).get("output-budget", 0)

    def stopped_reading(more_than: int) -> bool | None:
        """Whether more than ``more_than`` clients were seen to stop reading (still held as
        stalled, or closed for it)."""
        stalled = on_loop(frugal, lambda table: len(table.stalled))
        return stalled + dropped(frugal).get("output-budget", 0) - before > more_than or None

    with contextlib.ExitStack() as stack:
        pinned = []
        # Eight clients, each holding more than 64 KB unsent once it stops reading: the
        # first seen to stop before the next six connect, the last once they all have.
        for group in ([0], range(1, 7), [7]):
            for _ in group:
                pinned.append(stack.enter_context(never_reading(frugal, context)))
            serving.wait_for(
                functools.partial(stopped_reading, len(pinned) - 1),
                what=f"{len(pinned)} clients to be seen not reading",
                timeout=30,
            )
        serving.wait_for(
            lambda: dropped(frugal).get("output-budget", 0) > before or None,
            what="the output budget to close a connection",
            timeout=30,
        )
        assert on_loop(frugal, lambda table: table.unsent) <= OUTPUT_BUDGET
        # The first to stop reading went first; the last is still open.
        ports = on_loop(
            frugal,
            lambda table: {
                connection.client[1] for connection in protocols(table) if connection.client
            },
        )
        assert pinned[0].getsockname()[1] not in ports
        assert pinned[-1].getsockname()[1] in ports
        admission_works(frugal, context)


def test_pipelined_requests_are_parsed_only_a_few_ahead_of_the_answer(
    crowded: serving.Running, context: ssl.SSLContext
) -> None:
    """1,000 pipelined requests, no answer read: at most max_pipelined wait parsed.

    Read once the server waits on the client: nothing is answered, and so
    nothing leaves the queue, from then on; the bound is enforced as the
    queue fills, so it is at its deepest then.
    """
    with never_reading(crowded, context):
        serving.wait_for(pinned_down(crowded, 1), what="the connection to be pinned")
        (depth,) = on_loop(
            crowded, lambda table: [len(connection.pipeline) for connection in protocols(table)]
        )
    assert 0 < depth <= LIMITS.max_pipelined


def test_a_stray_crlf_does_not_keep_an_idle_connection_open(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """Issue 19, 7: the parser skips CRLF between requests; the idle timer must not stop."""
    with tls(limited, context) as sock:
        sock.sendall(GET)
        status, _ = serving.read_response(sock)
        assert status.startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        sock.settimeout(LIMITS.idle_timeout / 3)
        closed = False
        while not closed and time.monotonic() - answered < GRACE:
            try:
                sock.sendall(b"\r\n")
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                closed = True
    assert closed, "a CRLF every 0.2 s kept an idle connection open"


def test_a_flood_of_new_connections_does_not_evict_a_keep_alive_client(
    patient: serving.Running, context: ssl.SSLContext
) -> None:
    """Issue 19, 7: newcomers over the limit replace their own kind, not the client in use.

    Between each of its requests, twice the limit of new connections arrive:
    half never speak, half make one request and idle.
    """
    with contextlib.ExitStack() as flood, tls(patient, context) as client:
        for _ in range(2):  # a client in use, as the API server's are
            client.sendall(GET)
            serving.read_response(client)
        for round_ in range(12):
            for i in range(2 * LIMITS.max_connections):
                sock = flood.enter_context(tls(patient, context))
                if i % 2:
                    sock.sendall(GET)
                    serving.read_response(sock)
            try:
                client.sendall(GET)
                status, _ = serving.read_response(client)
            except (OSError, AssertionError) as error:
                raise AssertionError(
                    f"request {round_ + 1} of 12 found its connection closed: {error!r}"
                ) from None
            assert status.startswith(b"HTTP/1.1 200")


def _statuses(stream: bytearray) -> list[bytes]:
    """The status lines of the complete answers at the front of ``stream``, taken out of it
    (each answer with a Content-Length; what follows the last complete one stays)."""
    statuses: list[bytes] = []
    while (end := stream.find(b"\r\n\r\n")) >= 0:
        head = bytes(stream[:end])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        if len(stream) < end + 4 + length:
            break
        statuses.append(head.split(b"\r\n", 1)[0])
        del stream[: end + 4 + length]
    return statuses


def pipeline_and_read(sock: ssl.SSLSocket, payload: bytes, count: int) -> list[bytes]:
    """Send ``payload`` while reading the ``count`` answers it asks for, on this one thread:
    the status line of each, in order.

    One thread, because an SSL socket may not be read and written from two at once (a
    sender thread beside the reader once ended the read with a spurious EOF), and the
    answers are read as one stream, because a read may hold several of them."""
    sock.setblocking(False)
    stream, sent = bytearray(), 0
    statuses: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(statuses) < count:
        assert time.monotonic() < deadline, f"{len(statuses)} of {count} answers in 60 s"
        moved = False
        if sent < len(payload):
            with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLWantWriteError):
                sent += sock.send(payload[sent : sent + 16384])
                moved = True
        try:
            while chunk := sock.recv(65536):  # until the TLS record buffer is empty
                stream += chunk
                moved = True
            raise AssertionError(f"closed after {len(statuses)} of {count} answers")
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        statuses += _statuses(stream)
        if not moved:
            select.select([sock], [sock] if sent < len(payload) else [], [], 0.05)
    assert not stream, f"bytes after the last answer: {bytes(stream[:200])!r}"
    return statuses


def test_five_thousand_pipelined_gets_are_all_answered(
    patient: serving.Running, context: ssl.SSLContext
) -> None:
    """Issue 19, 7: a read of many small requests is not counted as one request's head.

    The same head limit, with long timeouts: with 0.6 s, a client kept from the CPU that
    long on a loaded machine is, rightly, one that does not read, and is closed."""
    count = 5000
    before = dropped(patient)
    with tls(patient, context) as sock:
        try:
            statuses = pipeline_and_read(sock, GET * count, count)
        except AssertionError as error:
            raise AssertionError(f"{error}; dropped since: {dropped(patient)} ({before})") from None
    assert statuses == [b"HTTP/1.1 200 OK"] * count


def test_pipelined_requests_are_answered_in_order(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """Queued requests start in turn (deferred a few per loop turn), each after the one before."""
    with tls(limited, context) as sock:
        sock.sendall((GET + b"GET /missing HTTP/1.1\r\nHost: x\r\n\r\n") * 20)
        statuses = [serving.read_response(sock)[0][9:12] for _ in range(40)]
    assert statuses == [b"200", b"404"] * 20


def test_a_closed_connection_is_freed_without_waiting_for_a_garbage_collection(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """A connection, its TLS buffers with it, is freed the moment it closes.

    A reference cycle through it (once: its flow control held the
    connection) kept every closed connection until the next full collection,
    and a flood after many idle connections then grew the heap instead of
    reusing theirs (docs/development.md, "The HTTP edge").
    """
    before = on_loop(limited, lambda table: set(table.open))
    gc.disable()  # process-wide: nothing is freed here but by reference counting
    try:
        with tls(limited, context) as sock:
            sock.sendall(GET)
            assert serving.read_response(sock)[0].startswith(b"HTTP/1.1 200")

            def new(table: ConnectionTable) -> weakref.ref[object]:
                (connection,) = set(table.open) - before
                return weakref.ref(connection)  # no strong reference leaves the loop

            freed = on_loop(limited, new)
        serving.wait_for(
            lambda: freed() is None or None,
            what="the closed connection to be freed (held by a cycle or a table)",
            timeout=GRACE,
        )
    finally:
        gc.enable()


@contextlib.contextmanager
def counting_pieces(running: serving.Running) -> Iterator[list[int]]:
    """The sizes of the body pieces the table is told of, while the context lasts."""
    pieces: list[int] = []

    def count(table: ConnectionTable) -> Callable[[], None]:
        hold = table.hold

        def counted(connection: Connection, size: int) -> None:
            pieces.append(size)
            hold(connection, size)

        table.hold = counted  # type: ignore[method-assign]
        return lambda: delattr(table, "hold")

    restore = on_loop(running, count)
    try:
        yield pieces
    finally:
        on_loop(running, lambda table: restore())


def test_a_body_is_parsed_whole_however_many_line_feeds_it_holds(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """Issue 29, 3: line feeds bound the request heads parsed at once, so only heads' count.

    A pretty-printed review of 64 KB holds thousands of line feeds. Each
    read of its body goes to the parser (and to the body budget) in one
    piece, not in pieces of a few lines each; its line feeds are not
    searched for heads. Counted: the pieces the table is told of.
    """
    obj = pod(PROM_IMAGE)
    obj["metadata"]["annotations"] = {f"note-{i}": "x" * 8 for i in range(2000)}
    body = orjson.dumps(review(obj), option=orjson.OPT_INDENT_2)
    assert body.count(b"\n") > 2000
    with counting_pieces(limited) as pieces, tls(limited, context) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        head, answer = serving.read_response(sock)
    assert head.startswith(b"HTTP/1.1 200")
    patched = apply(obj, patch_ops(orjson.loads(answer)["response"]))
    assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED
    assert sum(pieces) == len(body)
    # At most two pieces per read (the first holds the head), and a read holds at least
    # one TLS record of up to 16 KiB.
    assert len(pieces) <= 2 * (len(body) // (16 * 1024) + 1), f"{len(pieces)} pieces"


def chunked(body: bytes, size: int) -> bytes:
    """``body`` in chunks of ``size`` bytes, and the last chunk."""
    return (
        b"".join(
            b"%x\r\n%s\r\n" % (len(part), part)
            for part in (body[i : i + size] for i in range(0, len(body), size))
        )
        + b"0\r\n\r\n"
    )


CHUNKED_HEAD = (
    b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


@pytest.mark.parametrize("size", [1000, 8], ids=["1000-byte chunks", "8-byte chunks"])
def test_a_chunked_body_full_of_line_feeds_is_parsed_in_few_pieces(
    limited: serving.Running, context: ssl.SSLContext, size: int
) -> None:
    """Issue 29, 3: a chunked body's length is not known ahead, but it can end only at a
    CRLF CRLF: its line feeds are not searched as a head's would be. Each read goes to the
    parser (and to the body budget) in one piece, however many line feeds and chunks it
    holds, and the request is answered as any other; the GET behind it too."""
    obj = pod(PROM_IMAGE)
    obj["metadata"]["annotations"] = {f"note-{i}": "x" * 8 for i in range(500)}
    body = orjson.dumps(review(obj), option=orjson.OPT_INDENT_2)
    assert body.count(b"\n") > 500
    wire = chunked(body, size)
    with counting_pieces(limited) as pieces, tls(limited, context) as sock:
        sock.sendall(CHUNKED_HEAD + wire + GET)
        head, answer = serving.read_response(sock)
        assert serving.read_response(sock)[0].startswith(b"HTTP/1.1 200")  # the GET after it
    assert head.startswith(b"HTTP/1.1 200")
    patched = apply(obj, patch_ops(orjson.loads(answer)["response"]))
    assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED
    assert sum(pieces) == len(body)
    # At most two pieces per read (the first holds the head), and a read holds at least
    # one TLS record of up to 16 KiB.
    assert len(pieces) <= 2 * (len(wire) // (16 * 1024) + 1), f"{len(pieces)} pieces"


def test_requests_pipelined_behind_a_chunked_body_are_parsed_only_a_few_ahead(
    crowded: serving.Running, context: ssl.SSLContext
) -> None:
    """The bound holds behind a chunked body, its end cut between two reads or not."""
    body = orjson.dumps(review(pod(PROM_IMAGE)))
    wire = CHUNKED_HEAD + chunked(body, 100)
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(GRACE)
    raw.connect(("127.0.0.1", crowded.port))
    with context.wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(wire[:-1])
        sock.sendall(wire[-1:] + METRICS * 1000)
        serving.wait_for(pinned_down(crowded, 1), what="the connection to be pinned", timeout=30)
        (depth,) = on_loop(
            crowded, lambda table: [len(connection.pipeline) for connection in protocols(table)]
        )
    assert 0 < depth <= LIMITS.max_pipelined


def test_a_body_in_more_chunks_than_the_bound_is_refused(
    limited: serving.Running, context: ssl.SSLContext
) -> None:
    """Issue 29, 3: each chunk costs the loop a callback; a megabyte in 1-byte chunks held it
    for seconds. Past MAX_CHUNKS the request is refused, naming the bound, and closed."""
    before = dropped(limited).get("bad-request", 0)
    body = b" " * (MAX_CHUNKS + 1)
    with tls(limited, context) as sock:
        sock.sendall(CHUNKED_HEAD + chunked(body, 1))
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400")
    assert answer.endswith(
        f"request body sent in more than {MAX_CHUNKS:,} chunks; send it in larger chunks, "
        "or with a Content-Length".encode()
    )
    assert dropped(limited)["bad-request"] == before + 1
    admission_works(limited, context)
