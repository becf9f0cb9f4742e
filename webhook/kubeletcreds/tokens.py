"""Service-account tokens, verified by the API server (TokenReview), verdicts kept a while.

The kubelet sends the token of the Pod it is starting; only the API server
can say whether it is valid, for mirrorgate's audience, and which Pod (and
node) it is bound to. Every TokenReview costs the API server a signature
check and a lookup of the bound Pod, so verdicts are kept, keyed by the
token's SHA-256 (the token itself is never held): a valid one until the
token expires and at most :data:`VERDICT_TTL_MAX`, a refusal for
:data:`REFUSAL_TTL` (a kubelet retrying a bad token does not reach the API
server each time). Reviews of one token in flight are shared, and the reviews
of all callers run at most :data:`REVIEW_SLOTS` at a time, their turns taken
in rotation by caller (:class:`~webhook.edge.fairqueue.FairQueue`): one
node's flood of fresh tokens waits behind itself.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.edge import fairqueue

__all__ = [
    "NODE_NAME",
    "POD_NAME",
    "POD_UID",
    "REFUSAL_TTL",
    "REVIEW_SLOTS",
    "VERDICT_TTL_MAX",
    "Refusal",
    "TokenReviewer",
    "Verdict",
]

TOKEN_REVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"  # noqa: S105  # a path
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
NODE_NAME = "authentication.kubernetes.io/node-name"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

VERDICT_TTL_MAX = 300.0
"""Seconds a valid token's verdict is kept at most: a deleted Pod's token stops working
within this, even if it expires later."""
REFUSAL_TTL = 10.0
MAX_VERDICTS = 8192
"""Verdicts kept at once (about 300 bytes each); the oldest make room."""
REVIEW_SLOTS = 4
"""TokenReviews in flight at once, all callers together."""
REVIEWS_PER_CALLER = 16
"""TokenReviews one caller (a node) may have waiting or in flight."""
MAX_REVIEWS = 128
REVIEW_TIMEOUT = 5.0


class Refusal(Exception):
    """No login: ``reason`` (the metric's label) and a message for the caller and the log,
    which names what was wrong and never holds the token."""

    def __init__(self, reason: str, message: str, *, status: int = 403) -> None:
        super().__init__(message)
        self.reason, self.status = reason, status


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What the API server says a valid token is: whose it is, and what it is bound to."""

    namespace: str
    service_account: str
    pod: str | None
    pod_uid: str | None
    node: str | None
    """The node the bound Pod was on when the token was issued (its ``node-name`` claim)."""
    expires: float
    """Until when (the clock's time) this verdict may be used."""


def token_key(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT, read without checking its signature: only to bound how long
    a verdict the API server gave is kept. None when the token carries none."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    expiry = claims.get("exp") if isinstance(claims, dict) else None
    return float(expiry) if isinstance(expiry, int | float) else None


def _extra(user: Mapping[str, Any], key: str) -> str | None:
    values = (user.get("extra") or {}).get(key)
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return None


def verdict_of(status: Mapping[str, Any], *, audience: str, expires: float) -> Verdict:
    """The verdict in a TokenReview's status; Refusal when it authenticates no service
    account for ``audience``."""
    if not status.get("authenticated"):
        # The API server's error says why (expired, bad signature, Pod gone): never the token.
        why = str(status.get("error") or "not authenticated")[:200]
        raise Refusal("token-invalid", f"the API server refused the token: {why}")
    if audience not in (status.get("audiences") or [audience]):
        raise Refusal("token-invalid", f"the token is not for audience {audience!r}")
    user = status.get("user") or {}
    username = str(user.get("username") or "")
    namespace, _, account = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    if not username.startswith(SERVICE_ACCOUNT_PREFIX) or not namespace or not account:
        raise Refusal("token-invalid", "the token is not a service account's")
    return Verdict(
        namespace=namespace,
        service_account=account,
        pod=_extra(user, POD_NAME),
        pod_uid=_extra(user, POD_UID),
        node=_extra(user, NODE_NAME),
        expires=expires,
    )


class TokenReviewer:
    """Verdicts on tokens for one audience, from the API server, kept (module docstring)."""

    def __init__(
        self,
        client: kube.Kube,
        *,
        audience: str,
        clock: Callable[[], float] = time.time,
        observe: Callable[[str], None] = lambda result: None,
    ) -> None:
        self.client, self.audience, self.clock, self.observe = client, audience, clock, observe
        self._verdicts: dict[str, Verdict | Refusal] = {}
        self._until: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Future[Verdict]] = {}
        self.queue = fairqueue.FairQueue(
            per_caller=REVIEWS_PER_CALLER,
            total=MAX_REVIEWS,
            what="token reviews",
            slots=REVIEW_SLOTS,
        )

    def __repr__(self) -> str:
        return f"TokenReviewer(audience={self.audience!r}, verdicts={len(self._verdicts)})"

    async def verdict(self, token: str, *, caller: str) -> Verdict:
        """The token's verdict; raises Refusal (token-invalid, busy or unavailable)."""
        key = token_key(token)
        kept = self._verdicts.get(key)
        if kept is not None and self._until[key] > self.clock():
            self.observe("cached")
            if isinstance(kept, Verdict):
                return kept
            raise Refusal(kept.reason, str(kept), status=kept.status)
        shared = self._inflight.get(key)
        if shared is None:
            # One review per token in flight, whoever asks; it runs to its end (bounded by
            # REVIEW_TIMEOUT) even if its first asker leaves.
            shared = asyncio.ensure_future(self._review(token, key, caller))
            self._inflight[key] = shared
            shared.add_done_callback(functools.partial(self._done, key))
        return await asyncio.shield(shared)

    def _done(self, key: str, task: asyncio.Future[Verdict]) -> None:
        del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved, also when every asker has left

    async def _review(self, token: str, key: str, caller: str) -> Verdict:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        try:
            async with self.queue.turn(caller):
                answer = await asyncio.to_thread(
                    self.client.create, TOKEN_REVIEWS_PATH, body, timeout=REVIEW_TIMEOUT
                )
        except fairqueue.Full as full:
            self.observe("busy")
            raise Refusal("busy", f"{full}; try again", status=429) from None
        except kube.KubeError as error:
            self.observe("failed")
            # KubeError names the method and path, never the body.
            raise Refusal(
                "unavailable", f"the token could not be reviewed: {error}", status=503
            ) from None
        now = self.clock()
        expiry = token_expiry(token)
        until = min(now + VERDICT_TTL_MAX, expiry if expiry is not None else now + REFUSAL_TTL)
        try:
            verdict = verdict_of(answer.get("status") or {}, audience=self.audience, expires=until)
        except Refusal as refusal:
            self.observe("refused")
            self._keep(key, refusal, now + REFUSAL_TTL, now)
            raise
        self.observe("reviewed")
        self._keep(key, verdict, until, now)
        return verdict

    def _keep(self, key: str, value: Verdict | Refusal, until: float, now: float) -> None:
        if until <= now:
            return
        if len(self._verdicts) >= MAX_VERDICTS:
            for stale in [k for k, t in self._until.items() if t <= now]:
                del self._verdicts[stale], self._until[stale]
            while len(self._verdicts) >= MAX_VERDICTS:
                oldest = next(iter(self._verdicts))
                del self._verdicts[oldest], self._until[oldest]
        self._verdicts[key] = value
        self._until[key] = until
