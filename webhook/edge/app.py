"""The HTTP applications: admission endpoints, liveness, readiness and metrics.

``/mutate`` enforces (unless the server runs ``--audit-only``), ``/audit``
always only reports. One MutatingWebhookConfiguration holds a webhook for
each, selected by the namespace label ``mirrorgate.io/mode``, so the mode is
picked without any lookup on the request path: the label is the one switch,
and ``--audit-only`` a cluster-wide "report only" override.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from mirrorgate import policy
from mirrorgate.policy import HEALTHY, Health
from mirrorgate.webhook import admission, logs, policyreview, review
from mirrorgate.webhook.admissioncache import AdmissionCache
from mirrorgate.webhook.edge import fairqueue, gone, monitoring, offload
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.logs import logger
from mirrorgate.webhook.policyfile import LoadedPolicy

__all__ = [
    "AUDIT_ONLY",
    "BY_NAMESPACE_LABEL",
    "MAX_BODY_BYTES",
    "REFUSALS_LOGGED",
    "REFUSAL_LOG_INTERVAL",
    "BodyTooLarge",
    "Runtime",
    "Unreadable",
    "create_app",
    "read_body",
    "send_json",
]

AUDIT_ONLY = "audit-only"
BY_NAMESPACE_LABEL = "namespace-label"
"""The effective mode /readyz and mirrorgate_policy_info show: every endpoint only reports
(--audit-only), or each namespace's mirrorgate.io/mode label decides."""

# The API server accepts request bodies up to 3 MiB (its
# DefaultMaxRequestSizeBytes) and etcd stores objects up to 1.5 MiB; an
# UPDATE review carries object and oldObject plus the envelope. 7 MiB is
# what controller-runtime allows for the same reason.
MAX_BODY_BYTES = 7 * 1024 * 1024


@dataclasses.dataclass
class Runtime:
    """What the endpoints read: swapped atomically by the reloaders, never locked."""

    policy: LoadedPolicy
    secrets: admission.PullSecrets
    metrics: Metrics = dataclasses.field(default_factory=Metrics)
    readiness: dict[str, Callable[[], str | None]] = dataclasses.field(default_factory=dict)
    """Named checks: each returns None when ready, else why not."""
    advisories: list[Callable[[], Mapping[str, str]]] = dataclasses.field(default_factory=list)
    """Problems /readyz lists without turning unready: the webhook fails open on them."""
    health: Health = HEALTHY
    """The mirrors and credentials the background probes found unhealthy; replaced whole."""

    policy_refused: str | None = None
    """Why the newest policy was refused and what is served instead; /readyz lists it."""
    audit_only: bool = False
    """Every endpoint only reports (the audit overlay's safe first install)."""
    max_containers: int = admission.MAX_CONTAINERS
    """Containers of one Pod that admission plans (`serve --max-containers`)."""
    screener: offload.Screener | None = None
    """The worker that screens large reviews off the event loop; None: all on the loop."""
    on_policy_change: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    admission_cache: AdmissionCache = dataclasses.field(default_factory=AdmissionCache)
    """What admission keeps between requests, for the policies in force."""
    policy_objects: policyreview.Stored = policyreview.alone
    """The policy objects a new one is judged beside (in a cluster, the informers')."""

    @property
    def mode(self) -> str:
        return AUDIT_ONLY if self.audit_only else BY_NAMESPACE_LABEL

    def __post_init__(self) -> None:
        self.admission_cache.retain(self.policy.composition.policies)

    def set_policy(self, loaded: LoadedPolicy) -> None:
        self.policy = loaded
        self.admission_cache.retain(loaded.composition.policies)
        self.metrics.set_policy(loaded.version, self.mode)
        for callback in self.on_policy_change:
            callback()


def _content_type_ok(value: str) -> bool:
    if value == "application/json":  # what the API server sends: skip the parsing
        return True
    return value.split(";", 1)[0].strip().lower() == "application/json"


class Unreadable(Exception):
    """The client went away before the whole body arrived."""


class BodyTooLarge(Exception):
    """The body went past the endpoint's limit (``str()`` says which)."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The request body, read to its end; BodyTooLarge past ``limit`` bytes, Unreadable when
    the client leaves first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Unreadable
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the {limit}-byte limit")
        if not message.get("more_body", False):
            return b"".join((*chunks, chunk)) if chunks else chunk
        chunks.append(chunk)


class AdmissionEndpoint:
    """``POST /mutate`` or ``/audit`` as a plain ASGI app, called by :class:`_Application`.

    It runs for every Pod, so it skips what a Starlette endpoint builds per
    call (a Request, a header mapping, a body stream, a Response): it reads
    the two headers it needs from the raw list, the body from ``receive``,
    and sends one JSON payload.
    """

    def __init__(self, runtime: Runtime, *, endpoint: str, forced_audit: bool) -> None:
        self.runtime, self.endpoint, self.forced_audit = runtime, endpoint, forced_audit

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        content_type, declared = "", None
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"content-length":
                declared = value
        if not _content_type_ok(content_type):
            shown = policy.quote(content_type, limit=64) if content_type else "'missing'"
            raise review.BadReview(f"Content-Type is {shown}; expected application/json")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise review.BadReview(
                f"request body of {declared.decode()} bytes exceeds the {MAX_BODY_BYTES}-byte limit"
            )
        try:
            return await read_body(receive, MAX_BODY_BYTES)
        except BodyTooLarge as error:
            raise review.BadReview(str(error)) from None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        runtime, endpoint = self.runtime, self.endpoint
        loaded = runtime.policy
        mode = policy.AUDIT if self.forced_audit or runtime.audit_only else policy.ENFORCE
        rev: review.Review | None = None
        try:
            body = await self._body(scope, receive)
            screened = None
            if runtime.screener is not None and offload.for_the_worker(body):
                screened = await runtime.screener.screen(
                    body,
                    mode=mode,
                    max_containers=runtime.max_containers,
                    caller=_caller(scope),
                    left=gone.event(scope),
                )
            if screened is None or isinstance(screened, review.Review):
                # Decoded once: by the worker (which hands back what planning reads), or here.
                rev = review.decode(body) if screened is None else screened
                uid, dry_run = rev.uid, bool(rev.request.get("dryRun", False))
                decision = await admission.admit(
                    rev,
                    mirror_policy=loaded.policy_for,
                    mode=mode,
                    secrets=runtime.secrets,
                    health=runtime.health,
                    max_containers=runtime.max_containers,
                    cache=runtime.admission_cache,
                )
            else:
                uid, dry_run, decision = screened
        except review.BadReview as error:
            runtime.metrics.errors.labels(endpoint, "bad-request").inc()
            logger.warning(
                "bad admission request",
                extra={"fields": {"endpoint": endpoint, "uid": error.uid, "error": str(error)}},
            )
            await send_json(send, error.review(), status=400)
            return
        except (Unreadable, gone.ClientGone):
            return  # nobody is left to answer
        except Exception:
            runtime.metrics.errors.labels(endpoint, "internal").inc()
            if rev is None:
                logger.exception(
                    "admission request unreadable", extra={"fields": {"endpoint": endpoint}}
                )
                await send_json(send, {"error": "the request body could not be read"}, status=400)
                return
            # A bug of ours never reaches the caller as a traceback or a 500. In an
            # enforce namespace the Pod is refused, so that a covered image is never
            # admitted as written (the invariant, docs/security.md); an audit review
            # changes nothing either way, so there it is admitted unchanged.
            logger.exception(
                "admission failed",
                extra={"fields": {"endpoint": endpoint, "uid": rev.uid, "mode": mode}},
            )
            decision = _internal_error(rev, mode)
        seconds = time.perf_counter() - started
        runtime.metrics.record(endpoint, decision, seconds)
        logs.admission(
            {
                "uid": uid,
                "namespace": decision.namespace,
                "pod": decision.name,
                "endpoint": endpoint,
                "mode": decision.mode,
                "outcome": decision.outcome,
                "rewrites": decision.rewrites,
                "warnings": decision.warnings,
                "dry_run": dry_run,
                "policy": loaded.version,
                "duration_ms": round(seconds * 1000, 3),
            }
        )
        await send_json(send, decision.body)


REFUSALS_LOGGED = 10
"""Policy refusals logged in full per :data:`REFUSAL_LOG_INTERVAL`, beside the first of each
kind: anyone who reaches the port can cause some fifty a second."""
REFUSAL_LOG_INTERVAL = 60.0


POLICY_REVIEWS_PER_CALLER = 4
"""Policy reviews one caller may have waiting or being judged: an API server has one in
flight per write of the policy ConfigMap, and this is as many as the whole queue held
before it was shared out by caller."""
MAX_POLICY_REVIEWS = 8
"""Policy reviews waiting or being judged in all: few enough that the last of them is
answered within the webhook's 5 s timeout when each is the longest policy a review may
carry (`python -m bench.policy_queue_bench` measures it)."""


class PolicyEndpoint(AdmissionEndpoint):
    """``POST /validate-policy``: writes of the policy ConfigMap and the policy objects
    (:mod:`webhook.policyreview`).

    Reading a policy holds a core and the GIL wherever it runs in the
    server: a review over :data:`offload.LARGE_POLICY_REVIEW_BYTES` is judged
    in the worker process (:mod:`webhook.edge.offload`), a smaller one on a
    thread. One is judged at a time, the turns taken between callers
    (:class:`~webhook.edge.fairqueue.FairQueue`, by peer address), so one
    caller's flood cannot have another caller's review refused. Past
    :data:`POLICY_REVIEWS_PER_CALLER` of a caller, or :data:`MAX_POLICY_REVIEWS`
    in all, the policy is refused unjudged, saying so: the webhook fails
    closed, and the writer may retry.
    """

    def __init__(self, runtime: Runtime, *, endpoint: str) -> None:
        super().__init__(runtime, endpoint=endpoint, forced_audit=False)
        self.queue = fairqueue.FairQueue(
            per_caller=POLICY_REVIEWS_PER_CALLER, total=MAX_POLICY_REVIEWS, what="policy reviews"
        )
        self._refusals = logs.Sampled(
            "policy refused at admission", burst=REFUSALS_LOGGED, interval=REFUSAL_LOG_INTERVAL
        )

    async def _judged(self, body: bytes, caller: str) -> policyreview.Judged:
        try:
            async with self.queue.turn(caller):
                screener = self.runtime.screener
                if len(body) > offload.LARGE_POLICY_REVIEW_BYTES and screener is not None:
                    with contextlib.suppress(offload.Unavailable):
                        judged = await screener.judge_policy(body)
                        if judged is not None:
                            return judged
                return await asyncio.to_thread(
                    policyreview.judge_body, body, self.runtime.policy_objects
                )
        except (fairqueue.Full, offload.Busy) as error:
            why = str(error) or (
                f"{offload.MAX_QUEUED_POLICY_REVIEWS} policy reviews are already waiting to be "
                "judged"
            )
            return review.denied(
                review.decode(body),
                f"mirrorgate: {why}; this policy was not judged, try again",
                code=429,
            ), None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = self.runtime
        try:
            body = await self._body(scope, receive)
            answer, user = await gone.unless_gone(
                gone.event(scope), self._judged(body, _caller(scope))
            )
        except review.BadReview as error:
            runtime.metrics.errors.labels(self.endpoint, "bad-request").inc()
            await send_json(send, error.review(), status=400)
            return
        except (Unreadable, gone.ClientGone):
            return
        response = answer["response"]
        runtime.metrics.policy_reviews.labels("allowed" if response["allowed"] else "denied").inc()
        if not response["allowed"]:
            message = response["status"]["message"]
            self._refusals.warning(
                policyreview.refusal_kind(message),
                {"uid": response["uid"], "user": user, "error": message},
            )
        await send_json(send, answer)


def _caller(scope: Scope) -> str:
    """Whom a review's turn in a queue belongs to: the peer's address (with ``serve
    --client-ca``, every caller holds the API server's certificate)."""
    peer = scope.get("client")
    return str(peer[0]) if peer else "unknown"


async def send_json(send: Send, body: Any, status: int = 200) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode("latin-1")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def create_app(runtime: Runtime, *, monitoring_apart: bool = False) -> Starlette:
    """The admission listener's application.

    ``monitoring_apart`` (``serve --metrics-port``): /metrics and the detailed
    /readyz are :func:`create_monitoring_app`'s, and this /readyz says only whether
    the replica is ready: whoever reaches the admission port learns no mirror
    error and no credential name.
    """

    async def minimal_readiness(request: Request) -> Response:
        ready = not monitoring.not_ready(runtime)
        return monitoring.json_response({"ready": ready}, status=200 if ready else 503)

    runtime.metrics.set_policy(runtime.policy.version, runtime.mode)
    endpoints = {
        "/mutate": AdmissionEndpoint(runtime, endpoint="mutate", forced_audit=False),
        "/audit": AdmissionEndpoint(runtime, endpoint="audit", forced_audit=True),
        "/validate-policy": PolicyEndpoint(runtime, endpoint="validate-policy"),
    }
    probes = (
        [Route("/readyz", minimal_readiness, methods=["GET"])]
        if monitoring_apart
        else monitoring.routes(runtime)
    )
    return _Application(
        endpoints,
        routes=[
            *(Route(path, endpoint, methods=["POST"]) for path, endpoint in endpoints.items()),
            Route("/healthz", monitoring.liveness, methods=["GET"]),
            *probes,
        ],
    )


class _Application(Starlette):
    """Starlette, with ``POST`` to an admission endpoint called straight from the server.

    Every Pod comes this way: it skips Starlette's two middlewares and the
    router's route matching, which cost more than a small admission's own
    bookkeeping. The endpoints answer their own errors, and any other method
    or path (405, 404, the probes, metrics) takes Starlette's usual way.
    """

    def __init__(
        self, admission_endpoints: dict[str, AdmissionEndpoint], *, routes: list[Route]
    ) -> None:
        super().__init__(routes=routes)
        self.admission_endpoints = admission_endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            endpoint = self.admission_endpoints.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _internal_error(rev: review.Review, mode: policy.Mode) -> admission.Decision:
    """The answer to a review that mirrorgate failed to decide: refused to enforce, admitted
    unchanged to audit, each saying so and naming the review for the log."""
    if mode == policy.ENFORCE:
        message = (
            f"mirrorgate could not decide this Pod (an error of its own, logged with review uid "
            f"{rev.uid}); it was refused rather than admitted with images it "
            "may not have rewritten: try again, and report it if it persists"
        )
        return admission.Decision(review.denied(rev, message, code=503), mode, "denied")
    return admission.Decision(
        review.allowed(
            rev, warnings=["mirrorgate: internal error; the Pod was admitted unchanged (audit)"]
        ),
        mode,
        "allowed",
        warnings=1,
    )
