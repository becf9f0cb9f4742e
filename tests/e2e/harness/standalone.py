"""`mirrorgate serve` on its own (no cluster), as a real process, and a client for it.

For the health tests: the server probes a real registry on loopback, and the
tests read what it concluded from /mutate, /metrics, /readyz and its log.
"""

from __future__ import annotations

import dataclasses
import json
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from mirrorgate import certs
from mirrorgate.webhook.credentials import filestore
from mirrorgate.webhook.credentials.store import Credential
from tests.commands import MIRRORGATE
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.procs import ManagedProcess, free_port, http_ok, wait_until
from tests.webhook import reviews, scrape


@dataclasses.dataclass
class Standalone:
    url: str
    process: ManagedProcess
    client: httpx.Client
    policy_path: Path

    def stop(self) -> None:
        self.client.close()
        self.process.stop()

    def __enter__(self) -> Standalone:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def admit(self, *images: str, namespace: str = "default") -> dict[str, Any]:
        """The AdmissionResponse of /mutate for a Pod with ``images``."""
        body = reviews.review(reviews.pod(*images), namespace=namespace)
        answer = self.client.post(
            "/mutate", content=orjson.dumps(body), headers={"content-type": "application/json"}
        )
        assert answer.status_code == 200, answer.text
        response: dict[str, Any] = answer.json()["response"]
        return response

    def images_after(self, *images: str) -> tuple[list[str], list[str]]:
        """The Pod's images once admitted, and the warnings."""
        response = self.admit(*images)
        obj = reviews.apply(reviews.pod(*images), reviews.patch_ops(response))
        return [c["image"] for c in obj["spec"]["containers"]], response.get("warnings", [])

    def metrics(self) -> scrape.Samples:
        return scrape.samples(self.client.get("/metrics").text)

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, frozenset(labels.items())))

    def readyz(self) -> tuple[int, dict[str, Any]]:
        response = self.client.get("/readyz")
        body: dict[str, Any] = response.json()
        return response.status_code, body

    def log(self) -> list[dict[str, Any]]:
        """Every JSON log line so far."""
        self.process.log_tail(1)  # flushes our side of the file
        lines = []
        for line in self.process.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines

    def log_messages(self, message: str) -> list[dict[str, Any]]:
        return [entry for entry in self.log() if entry.get("msg") == message]


def write_store(directory: Path, credentials: Sequence[Credential]) -> list[str]:
    """An encrypted file store holding ``credentials``; the serve flags that read it."""
    key = filestore.generate_key()
    key_file = directory / "store.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    store = directory / "store.json"
    filestore.write_store(
        str(store),
        filestore.load_key(key_file=str(key_file), environ={}),
        filestore.StoreContents(credentials={}).replaced({c.name: c for c in credentials}),
    )
    return ["--store", "file", "--store-file", str(store), "--key-file", str(key_file)]


def serve_argv(
    workdir: Path, policy: str | None, *, tls_secret: str | None = None
) -> tuple[list[str], int, Path]:
    """`mirrorgate serve` on a free loopback port, reloading every 0.2 s, with ``policy``
    written under ``workdir``: its argv, port and policy file. ``policy`` None: no
    ``--policy`` (in a cluster, the policy objects alone).

    Its certificates are generated under ``workdir``/tls, or with ``tls_secret`` it
    manages its own there.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    if tls_secret is None:
        certs.generate_bundle(
            service="mirrorgate",
            namespace="mirrorgate",
            out=workdir / "tls",
            dns=["localhost"],
            ips=["127.0.0.1"],
        )
        tls_args = [
            "--tls-cert",
            str(workdir / "tls" / certs.TLS_CERT),
            "--tls-key",
            str(workdir / "tls" / certs.TLS_KEY),
        ]
    else:
        tls_args = ["--tls-secret", tls_secret, "--tls-dir", str(workdir / "tls")]
    policy_path = workdir / "policy.yaml"
    if policy is not None:
        policy_path.write_text(policy)
    port = free_port()
    argv = [
        *MIRRORGATE,
        "serve",
        *(["--policy", str(policy_path)] if policy is not None else []),
        *tls_args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--reload-interval",
        "0.2",
    ]
    return argv, port, policy_path


def start_standalone(
    workdir: Path,
    *,
    policy: str,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    redact: Sequence[str] = (),
) -> Standalone:
    """`mirrorgate serve` with generated certificates on a free loopback port, until ready."""
    serve, port, policy_path = serve_argv(workdir, policy)
    argv = [*serve, *args]
    # The server's own environment only: SSL_CERT_FILE is what these tests vary.
    process = ManagedProcess(
        "mirrorgate", argv, workdir / "mirrorgate.log", env=env, cwd=REPO_ROOT, redact=redact
    )
    client = httpx.Client(
        base_url=f"https://127.0.0.1:{port}",
        timeout=10,
        trust_env=False,
        verify=ssl.create_default_context(cafile=str(workdir / "tls" / certs.CA_CERT)),
    )
    server = Standalone(
        url=f"https://127.0.0.1:{port}", process=process, client=client, policy_path=policy_path
    )

    try:
        wait_until(
            lambda: http_ok(lambda: client.get("/healthz")),
            timeout=30,
            what="mirrorgate serve",
            alive=process.exited,
        )
    except BaseException:
        server.stop()
        raise
    return server
