"""What a replica says of itself: liveness, readiness and its metrics.

With ``serve --metrics-port`` these are the metrics listener's application
(:func:`create_app`): /metrics and the detailed /readyz name mirrors,
credentials and why they fail, which whoever reaches the admission port
should not learn. The admission listener then keeps /healthz and a /readyz
that says only ready or not (:func:`webhook.edge.app.create_app`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mirrorgate.webhook.version import VERSION

if TYPE_CHECKING:
    from mirrorgate.webhook.edge.app import Runtime

__all__ = ["create_app", "json_response", "liveness", "not_ready", "routes"]


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def not_ready(runtime: Runtime) -> dict[str, str]:
    """Why this replica is not ready, by check; empty when it is."""
    problems: dict[str, str] = {}
    for name, check in runtime.readiness.items():
        try:
            why = check()
        except Exception as error:  # a broken check means not ready, not a 500
            why = f"check failed: {type(error).__name__}"
        if why is not None:
            problems[name] = why
    return problems


async def liveness(request: Request) -> Response:
    return Response("ok\n", media_type="text/plain")


def routes(runtime: Runtime) -> list[Route]:
    """/metrics and the detailed /readyz: what a replica knows of its mirrors and credentials."""

    async def readiness(request: Request) -> Response:
        problems = not_ready(runtime)
        ready = not problems
        for advisory in runtime.advisories:
            problems.update(advisory())
        if runtime.policy_refused is not None:
            # Not unready: the policy in force keeps serving, and so must this replica.
            problems["policy"] = runtime.policy_refused
        body = {
            "ready": ready,
            "version": VERSION,
            "policy": runtime.policy.version,
            "mode": runtime.mode,
            "problems": problems,
        }
        return json_response(body, status=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        payload, content_type = runtime.metrics.render()
        return Response(payload, media_type=content_type)

    return [
        Route("/readyz", readiness, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def create_app(runtime: Runtime) -> Starlette:
    """The metrics listener's application: /metrics, the detailed /readyz and /healthz."""
    return Starlette(routes=[Route("/healthz", liveness, methods=["GET"]), *routes(runtime)])
