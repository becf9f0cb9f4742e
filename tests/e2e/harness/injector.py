"""A second mutating webhook for the reinvocation scenario: it injects a sidecar.

A real HTTPS webhook (Starlette under uvicorn in a thread) that adds one
container to every Pod, so that mirrorgate, called before it, is called
again (``reinvocationPolicy: IfNeeded``) to rewrite what it added.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mirrorgate import certs
from tests.e2e.harness.procs import free_port

SIDECAR_IMAGE = "busybox:1.36"


async def _inject(request: Request) -> JSONResponse:
    review = await request.json()
    pod = review["request"]["object"]
    names = [c["name"] for c in pod["spec"]["containers"]]
    patch = (
        []
        if "injected" in names
        else [
            {
                "op": "add",
                "path": "/spec/containers/-",
                "value": {"name": "injected", "image": SIDECAR_IMAGE},
            }
        ]
    )
    response = {"uid": review["request"]["uid"], "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return JSONResponse(
        {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}
    )


@contextmanager
def running_injector(workdir: Path) -> Iterator[tuple[str, bytes]]:
    """Serve the injector on loopback; yields its URL and CA certificate."""
    authority = certs.CertificateAuthority.generate(common_name="injector-ca")
    leaf = authority.issue_serving(ips=["127.0.0.1"])
    (workdir / "tls.crt").write_bytes(leaf.cert_pem)
    (workdir / "tls.key").write_bytes(leaf.key_pem)
    port = free_port()
    config = uvicorn.Config(
        Starlette(routes=[Route("/inject", _inject, methods=["POST"])]),
        host="127.0.0.1",
        port=port,
        log_config=None,
        ssl_certfile=str(workdir / "tls.crt"),
        ssl_keyfile=str(workdir / "tls.key"),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the injector webhook did not start")
        time.sleep(0.02)
    try:
        yield f"https://127.0.0.1:{port}/inject", authority.cert_pem
    finally:
        server.should_exit = True
        thread.join(timeout=10)
