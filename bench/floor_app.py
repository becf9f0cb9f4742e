"""The floor for `make bench`: the least any Python admission webhook on this stack can do.

A Starlette app under the same uvicorn and TLS settings as ``mirrorgate
serve`` (webhook/commands/serve/process.py: the same ``uvicorn.Config`` options, uvloop, and
the very same TLS context, TLS >= 1.2 with the certificate-swapping SNI
callback), but with uvicorn's own TLS server and none of mirrorgate's
connection limits (webhook/edge/connections.py): their cost counts as
mirrorgate's. It
reads and parses the AdmissionReview with the same JSON library and answers
with one fixed JSON Patch operation, echoing the uid. Whatever mirrorgate
costs above this is policy, planning, patch building, logging and metrics;
everything below it (TLS, HTTP parsing, the ASGI hop, JSON decoding) any
implementation on this stack pays too.

    python -m bench.floor_app --tls-cert FILE --tls-key FILE [--host H] [--port P]
"""

from __future__ import annotations

import argparse
import base64
from collections.abc import Sequence

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mirrorgate.webhook import logs
from mirrorgate.webhook.edge import tls

__all__ = ["create_app", "uvicorn_config"]

# One operation, the size of a real single-image rewrite.
PATCH = base64.b64encode(
    orjson.dumps(
        [
            {
                "op": "replace",
                "path": "/spec/containers/0/image",
                "value": "mirror.corp.example/dockerhub/library/nginx:1.25.3",
            }
        ]
    )
).decode("ascii")


async def mutate(request: Request) -> Response:
    document = orjson.loads(await request.body())
    body = {
        "apiVersion": document["apiVersion"],
        "kind": "AdmissionReview",
        "response": {
            "uid": document["request"]["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": PATCH,
        },
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def healthz(request: Request) -> Response:
    return Response("ok\n", media_type="text/plain")


def create_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/mutate", mutate, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


def uvicorn_config(app: Starlette, *, host: str, port: int, cert: str, key: str) -> uvicorn.Config:
    """Mirrors webhook.commands.serve.process.uvicorn_config option for option: keep in step."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=cert,
        ssl_keyfile=key,
        log_config=None,
        access_log=False,
        lifespan="on",
        loop="uvloop",
        http="httptools",
        ws="none",
        timeout_keep_alive=60,
    )
    config.load()
    config.ssl = tls.CertificateReloader(cert, key).base
    return config


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_app")
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8444)
    args = parser.parse_args(argv)
    logs.configure("info")  # as `mirrorgate serve` does: uvicorn's own lines as JSON
    config = uvicorn_config(
        create_app(), host=args.host, port=args.port, cert=args.tls_cert, key=args.tls_key
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
