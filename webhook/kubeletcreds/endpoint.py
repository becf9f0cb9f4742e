"""``POST /kubelet-credentials``: a mirror login for the Pod a kubelet is starting, and for
nobody else.

The kubelet's credential-provider plugin (``mirrorgate-credential-provider``)
forwards the kubelet's CredentialProviderRequest: the image and a
service-account token bound to the Pod. A login is answered only when all
of these hold, each refusal counted by its reason
(``mirrorgate_kubelet_credential_refusals_total``) and logged without the token:

1. the caller presented a kubelet's client certificate (``CN=system:node:<node>``,
   ``O=system:nodes``), verified by the handshake against the cluster's
   client CA (``not-a-node``);
2. the API server says the token is valid for mirrorgate's audience
   (``token-invalid``), bound to a Pod (``not-pod-bound``), and that Pod is on
   the caller's node (``wrong-node``): a token a tenant mints for its own
   Pod, sent by anything but that node's kubelet, gets nothing;
3. the Pod's namespace is labelled enforce in mirrorgate's own Namespace
   cache, and the policy does not exclude it (``not-enforced``);
4. the image is under a rule's mirror (``not-on-mirror``) whose credential
   (``no-credential``) the policy grants that namespace (``not-granted``), that
   credential is delivered by the kubelet (``delivery: kubelet``;
   ``not-kubelet-delivery``: a ``pullSecret`` credential's login goes only into
   the granted namespaces' Secrets, never to a kubelet that asks), and the store
   holds a current login for it (``no-login``).

The answer is keyed by the image (``cacheKeyType: Image``): whether a login is
given is decided per image (the rule whose mirror it is under, that rule's
credential and grants), and two rules may share a mirror host with different
credentials, so a per-registry key could hand one repository's verdict to
another. The kubelet keeps it per service account (``tokenAttributes.cacheType:
ServiceAccount``) for ``cacheDuration``, which bounds how long a rotated or
revoked login stays in use on a node.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson
from cryptography import x509
from cryptography.x509.oid import NameOID
from starlette.types import Receive, Scope, Send

from mirrorgate import policy
from mirrorgate.webhook import logs
from mirrorgate.webhook.credentials.store import CredentialStore
from mirrorgate.webhook.edge import app
from mirrorgate.webhook.edge.app import send_json
from mirrorgate.webhook.edge.peercert import TLS_EXTENSION
from mirrorgate.webhook.kubeletcreds.tokens import Refusal, TokenReviewer, Verdict

__all__ = ["API_VERSION", "MAX_BODY_BYTES", "PATH", "REASONS", "CredentialEndpoint"]

PATH = "/kubelet-credentials"
API_VERSION = "credentialprovider.kubelet.k8s.io/v1"
MAX_BODY_BYTES = 64 * 1024
"""A request is an image reference, a token (about a kilobyte) and a few annotations."""
NODE_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
REASONS = (
    "bad-request",
    "not-a-node",
    "token-invalid",
    "not-pod-bound",
    "wrong-node",
    "not-enforced",
    "not-on-mirror",
    "no-credential",
    "not-granted",
    "not-kubelet-delivery",
    "no-login",
    "busy",
    "unavailable",
)
"""Every refusal's reason: the metric's label values, each series there from the start."""
REFUSALS_LOGGED = 20
REFUSAL_LOG_INTERVAL = 60.0
MAX_PEERS = 4096


class Namespaces(Protocol):
    """mirrorgate's own Namespace cache (:class:`~webhook.cluster.optin.NamespaceOptIn`)."""

    def enforced(self, namespace: str) -> bool: ...

    def labels(self, namespace: str) -> Any: ...


class CredentialEndpoint:
    """The ASGI application of the kubelet credential listener (module docstring)."""

    def __init__(
        self,
        *,
        reviewer: TokenReviewer,
        namespaces: Namespaces,
        mirror_policy: Callable[[str], policy.Policy],
        store: CredentialStore,
        metrics: Any,
        cache_duration: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reviewer, self.namespaces, self.policy = reviewer, namespaces, mirror_policy
        self.store, self.metrics, self.cache_duration = store, metrics, cache_duration
        self.clock = clock
        self._nodes: dict[str, str | None] = {}
        """Peer certificate (PEM) → its node name (None: not a node's), parsed once."""
        self._refusals = logs.Sampled(
            "kubelet credential refused", burst=REFUSALS_LOGGED, interval=REFUSAL_LOG_INTERVAL
        )
        for reason in REASONS:
            metrics.kubelet_refusals.labels(reason)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != PATH:
            await send_json(send, {"error": f"not found: this listener serves POST {PATH}"}, 404)
            return
        if scope["method"] != "POST":
            await send_json(send, {"error": f"{PATH} takes POST"}, 405)
            return
        node = image = None
        verdict: Verdict | None = None
        try:
            node = self._node(scope)
            request = _request(await _body(receive))
            image = request["image"]
            verdict = await self.reviewer.verdict(request["serviceAccountToken"], caller=node)
            answer = self._answer(node, verdict, image)
        except Refusal as refusal:
            self.metrics.kubelet_refusals.labels(refusal.reason).inc()
            self._refusals.warning(
                refusal.reason,
                {
                    "reason": refusal.reason,
                    "node": node,
                    "namespace": verdict.namespace if verdict else None,
                    "service_account": verdict.service_account if verdict else None,
                    "pod": verdict.pod if verdict else None,
                    "image": policy.quote(image, limit=200) if image else None,
                    "error": str(refusal),
                },
            )
            await send_json(send, {"error": str(refusal), "reason": refusal.reason}, refusal.status)
            return
        except app.Unreadable:
            return
        self.metrics.kubelet_logins.inc()
        await send_json(send, answer)

    def _node(self, scope: Scope) -> str:
        """The node whose kubelet certificate the handshake verified; Refusal otherwise."""
        chain = ((scope.get("extensions") or {}).get(TLS_EXTENSION) or {}).get("client_cert_chain")
        if not chain:
            raise Refusal("not-a-node", "no client certificate: a kubelet's is required")
        pem = chain[0]
        if pem not in self._nodes:
            if len(self._nodes) >= MAX_PEERS:
                self._nodes.clear()
            self._nodes[pem] = _node_name(pem)
        node = self._nodes[pem]
        if node is None:
            raise Refusal(
                "not-a-node",
                f"the client certificate is not a kubelet's (CN={NODE_PREFIX}<node>, "
                f"O={NODES_GROUP})",
            )
        return node

    def _answer(self, node: str, verdict: Verdict, image: str) -> dict[str, Any]:
        """The CredentialProviderResponse for ``image``, or Refusal saying which check failed."""
        if verdict.pod is None or verdict.pod_uid is None:
            raise Refusal("not-pod-bound", "the token is not bound to a Pod")
        where = f"Pod {verdict.namespace}/{verdict.pod}"
        if verdict.node is None:
            raise Refusal("wrong-node", f"the token of {where} names no node")
        if verdict.node != node:
            raise Refusal(
                "wrong-node",
                f"the token of {where} is bound to node {verdict.node!r}, the caller is "
                f"node {node!r}'s kubelet",
            )
        namespace = verdict.namespace
        mirror_policy = self.policy(namespace)
        excluded = mirror_policy.is_namespace_excluded(namespace)
        if excluded or not self.namespaces.enforced(namespace):
            raise Refusal(
                "not-enforced",
                f"namespace {namespace!r} is not labelled {policy.MODE_LABEL}={policy.ENFORCE} "
                "(or the policy excludes it)",
            )
        resolution = mirror_policy.resolve(image)
        rule, ref = resolution.rule, resolution.reference
        if resolution.outcome != "on-mirror" or rule is None or ref is None:
            raise Refusal(
                "not-on-mirror", f"image {policy.quote(image)} is under no mirror of the policy"
            )
        if not rule.credentials:
            raise Refusal("no-credential", f"{rule.label}'s mirror has no credential")
        # One robot per team: the one credential of the rule granted to the namespace.
        choice = mirror_policy.choose_credential(rule, namespace, self.namespaces.labels(namespace))
        if choice.credential is None:
            raise Refusal("not-granted", choice.refusal or f"no credential of {rule.label}")
        # Only a credential that opted in to the kubelet path is handed out on it: a
        # pullSecret one (the default, or switched back) reaches only its Secret copies.
        grant = mirror_policy.grants.get(choice.credential)
        if grant is None or grant.delivery != "kubelet":
            delivery = grant.delivery if grant is not None else "pullSecret"
            raise Refusal(
                "not-kubelet-delivery",
                f"credential {choice.credential!r} has delivery {delivery}, not kubelet: its "
                "login reaches Pods only as a pull secret",
            )
        now = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC)
        login = self.store.snapshot().get(choice.credential)
        if login is None or login.expired(now):
            raise Refusal(
                "no-login",
                f"the store holds no current login for credential {choice.credential!r}",
                status=503,
            )
        duration = self.cache_duration
        if login.expires is not None:
            duration = min(duration, (login.expires - now).total_seconds())
        return {
            "apiVersion": API_VERSION,
            "kind": "CredentialProviderResponse",
            "cacheKeyType": "Image",
            "cacheDuration": f"{max(int(duration), 0)}s",
            "auth": {ref.name: {"username": login.username, "password": login.password}},
        }


async def _body(receive: Receive) -> bytes:
    try:
        return await app.read_body(receive, MAX_BODY_BYTES)
    except app.BodyTooLarge as error:
        raise Refusal("bad-request", str(error), status=413) from None


def _request(body: bytes) -> dict[str, str]:
    """The image and token of a CredentialProviderRequest; Refusal naming what is wrong."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise Refusal("bad-request", "the body is not JSON", status=400) from None
    if not isinstance(document, dict):
        raise Refusal("bad-request", "the body is not a JSON object", status=400)
    if document.get("apiVersion") != API_VERSION or document.get("kind") != (
        "CredentialProviderRequest"
    ):
        raise Refusal(
            "bad-request", f"the body is not a {API_VERSION} CredentialProviderRequest", status=400
        )
    for field in ("image", "serviceAccountToken"):
        value = document.get(field)
        if not isinstance(value, str) or not value:
            raise Refusal("bad-request", f"{field}: a non-empty string is required", status=400)
    return {"image": document["image"], "serviceAccountToken": document["serviceAccountToken"]}


def _node_name(pem: str) -> str | None:
    """The node of a kubelet's client certificate; None for any other certificate."""
    try:
        subject = x509.load_pem_x509_certificate(pem.encode("ascii")).subject
    except ValueError:
        return None
    names = [str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    groups = {str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)}
    if len(names) != 1 or not names[0].startswith(NODE_PREFIX) or NODES_GROUP not in groups:
        return None
    return names[0].removeprefix(NODE_PREFIX) or None
