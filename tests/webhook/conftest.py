"""Shared fixtures: a CA, policy files, the app in process, and the real HTTPS server."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest

from mirrorgate.certs import CertificateAuthority, KeyPair
from mirrorgate.webhook import logs
from mirrorgate.webhook.edge import offload
from tests.e2e.harness.providers import issuer  # noqa: F401 (the fixture, shared with e2e)
from tests.webhook import policies, serving
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.harness import Harness, make_harness


@pytest.fixture(scope="session")
def ca() -> CertificateAuthority:
    """The CA the webhook's serving certificates are issued from."""
    return CertificateAuthority.generate()


@pytest.fixture(scope="session")
def other_ca() -> CertificateAuthority:
    """An unrelated CA, for negative controls."""
    return CertificateAuthority.generate()


@pytest.fixture(scope="session")
def serving_pair(ca: CertificateAuthority) -> KeyPair:
    """A serving certificate for localhost and 127.0.0.1."""
    return ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """The app on the default test policy, with stale pull secrets that ``ensure`` can create."""
    made = make_harness(tmp_path)
    with made.client:
        yield made


@pytest.fixture
def screener() -> Iterator[offload.Screener]:
    """The worker process that screens large reviews, started and stopped with the test."""
    made = offload.Screener(max_waiting=64)
    made.start()
    yield made
    made.stop()


@pytest.fixture
def workerless(monkeypatch: pytest.MonkeyPatch) -> offload.Screener:
    """A screener that could start no worker process (no /dev/shm, a process limit): a fault
    faked here, as it cannot be caused in a test."""

    def no_process(*args: object, **kwargs: object) -> None:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_process)
    made = offload.Screener(max_waiting=64)
    made.start()
    return made


@pytest.fixture
def log_lines() -> Iterator[StringIO]:
    """Everything the mirrorgate logger writes, formatted as in production (JSON lines)."""
    stream = StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("mirrorgate")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="session")
def https_server(
    tmp_path_factory: pytest.TempPathFactory, serving_pair: KeyPair
) -> Iterator[serving.Running]:
    """The real server on the default policy; tests must not change its files."""
    directory = tmp_path_factory.mktemp("https-server")
    with serving.serve(
        directory,
        pair=serving_pair,
        policy=policies.POLICY,
        secrets=RecordingPullSecrets(stale=False),
    ) as running:
        yield running
