"""The kubelet credential endpoint (issue 31, item 2): a login only for the kubelet of the
Pod's node, for a granted mirror in an enforced namespace; every refusal counted by reason,
and the token in no log, repr or exception. The API server's TokenReview is faked here (a
recording client); tests/e2e/api/test_kubelet_credentials.py asks a real one."""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from mirrorgate.certs.authority import CertificateAuthority
from mirrorgate.webhook.credentials import kubestore, refresher
from mirrorgate.webhook.credentials.store import Credential, rfc3339
from mirrorgate.webhook.edge.fairqueue import FairQueue
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.kubeletcreds import endpoint, tokens
from mirrorgate.webhook.policyfile import parse_policy

NOW = 1_800_000_000.0
PASSWORD = "the-central-password"
POLICY = b"""\
mirrors:
  - source: docker.io
    mirror: harbor.corp.example/dockerhub-proxy
    credential: harbor-pull
  - source: ghcr.io
    mirror: harbor.corp.example/ghcr
    credential: ghcr-pull
  - source: quay.io
    mirror: open.corp.example/quay
exclude:
  namespaces: [excluded]
credentials:
  harbor-pull: {namespaces: ["team-*", excluded], delivery: kubelet}
  ghcr-pull: {namespaces: [other], delivery: kubelet}
"""
PULL_SECRET_POLICY = POLICY.replace(b", delivery: kubelet}", b"}")
"""The same credentials delivered as pull secrets (the default): none for the kubelet."""
IMAGE = "harbor.corp.example/dockerhub-proxy/library/nginx:1.27"


def jwt(exp: float, marker: str = "a") -> str:
    """A token shaped as the API server's (only its exp claim is read here)."""
    payload = base64.urlsafe_b64encode(orjson.dumps({"exp": int(exp), "m": marker})).rstrip(b"=")
    return f"eyJhbGciOiJFUzI1NiJ9.{payload.decode()}.c2lnbmF0dXJl"


TOKEN = jwt(NOW + 3600)


AUTHORITY = CertificateAuthority.generate(common_name="kubelet client CA")


def certificate_pem(common_name: str, organization: str = "system:nodes") -> str:
    """A client certificate as the cluster's client CA issues it."""
    issued = AUTHORITY.issue_client(common_name=common_name, organizations=[organization])
    return issued.cert_pem.decode()


NODE_A = certificate_pem("system:node:node-a")


def review_status(
    *,
    namespace: str = "team-a",
    node: str | None = "node-a",
    pod: bool = True,
    authenticated: bool = True,
) -> dict[str, Any]:
    extra: dict[str, list[str]] = {}
    if pod:
        extra[tokens.POD_NAME] = ["web-0"]
        extra[tokens.POD_UID] = ["6f2c-uid"]
    if node is not None:
        extra[tokens.NODE_NAME] = [node]
    if not authenticated:
        return {"authenticated": False, "error": "token has expired"}
    return {
        "authenticated": True,
        "audiences": ["mirrorgate"],
        "user": {"username": f"system:serviceaccount:{namespace}:web", "extra": extra},
    }


class ReviewingApi:
    """The API server's TokenReview, scripted: the status it answers, and what was asked."""

    def __init__(self, status: Mapping[str, Any]) -> None:
        self.status, self.bodies = dict(status), list[Any]()

    def create(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        assert path == tokens.TOKEN_REVIEWS_PATH
        self.bodies.append(body)
        return {"status": self.status}


class Namespaces:
    def __init__(self, enforced: set[str]) -> None:
        self.enforced_names = enforced

    def enforced(self, namespace: str) -> bool:
        return namespace in self.enforced_names

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        return {}


class Store:
    def __init__(self, logins: Mapping[str, Credential]) -> None:
        self.logins = logins

    def snapshot(self) -> Mapping[str, Credential]:
        return self.logins

    def problem(self) -> str | None:
        return None

    def subscribe(self, callback: Any) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def login(expires: datetime.datetime | None = None) -> Credential:
    return Credential("harbor-pull", "harbor.corp.example", "robot", PASSWORD, expires=expires)


class Fixture:
    def __init__(
        self,
        status: Mapping[str, Any] | None = None,
        *,
        enforced: frozenset[str] = frozenset({"team-a", "other", "excluded"}),
        store: Mapping[str, Credential] | None = None,
        policy_text: bytes = POLICY,
    ) -> None:
        self.api = ReviewingApi(status or review_status())
        self.clock = Clock()
        self.metrics = Metrics()
        mirror_policy = parse_policy(policy_text, source="policy.yaml")
        self.reviewer = tokens.TokenReviewer(
            self.api,  # type: ignore[arg-type]  # the part of kube.Kube it uses
            audience="mirrorgate",
            clock=self.clock,
        )
        self.endpoint = endpoint.CredentialEndpoint(
            reviewer=self.reviewer,
            namespaces=Namespaces(set(enforced)),
            mirror_policy=lambda namespace: mirror_policy,
            store=Store({"harbor-pull": login()} if store is None else store),
            metrics=self.metrics,
            cache_duration=300.0,
            clock=self.clock,
        )

    def call(
        self,
        body: Any = None,
        *,
        peer: str | None = NODE_A,
        image: str = IMAGE,
        token: str = TOKEN,
        path: str = endpoint.PATH,
    ) -> tuple[int, dict[str, Any]]:
        if body is None:
            body = {
                "apiVersion": endpoint.API_VERSION,
                "kind": "CredentialProviderRequest",
                "image": image,
                "serviceAccountToken": token,
            }
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return asyncio.run(self._call(raw, peer, path))

    async def _call(self, raw: bytes, peer: str | None, path: str) -> tuple[int, dict[str, Any]]:
        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": path,
            "headers": [],
            "extensions": {"tls": {"client_cert_chain": [peer] if peer else []}},
        }
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": raw, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.endpoint(scope, receive, send)  # type: ignore[arg-type]
        return sent[0]["status"], orjson.loads(sent[1]["body"])

    def refusals(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "mirrorgate_kubelet_credential_refusals_total", {"reason": reason}
        )
        assert value is not None, f"no series for reason {reason}"
        return value


def test_the_kubelet_of_the_pods_node_gets_the_login_keyed_by_the_image() -> None:
    fixture = Fixture()
    status, answer = fixture.call()
    assert status == 200
    assert answer == {
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderResponse",
        "cacheKeyType": "Image",
        "cacheDuration": "300s",
        "auth": {
            "harbor.corp.example/dockerhub-proxy/library/nginx": {
                "username": "robot",
                "password": PASSWORD,
            }
        },
    }
    (asked,) = fixture.api.bodies
    assert asked["spec"] == {"token": TOKEN, "audiences": ["mirrorgate"]}
    assert (
        fixture.metrics.registry.get_sample_value("mirrorgate_kubelet_credential_logins_total") == 1
    )


@pytest.mark.parametrize(
    ("fixture_args", "call_args", "reason", "status", "says"),
    [
        ({}, {"peer": None}, "not-a-node", 403, "no client certificate"),
        ({}, {"peer": certificate_pem("alice", "tenants")}, "not-a-node", 403, "not a kubelet's"),
        (
            {},
            {"peer": certificate_pem("system:node:node-a", "tenants")},
            "not-a-node",
            403,
            "not a kubelet's",
        ),
        (
            {},
            {"peer": certificate_pem("system:node:node-b")},
            "wrong-node",
            403,
            "bound to node 'node-a', the caller is node 'node-b'",
        ),
        ({"status": review_status(node=None)}, {}, "wrong-node", 403, "names no node"),
        ({"status": review_status(pod=False)}, {}, "not-pod-bound", 403, "not bound to a Pod"),
        (
            {"status": review_status(authenticated=False)},
            {},
            "token-invalid",
            403,
            "token has expired",
        ),
        ({"enforced": frozenset()}, {}, "not-enforced", 403, "mirrorgate.io/mode=enforce"),
        (
            {"status": review_status(namespace="excluded")},
            {},
            "not-enforced",
            403,
            "policy excludes it",
        ),
        (
            {"status": review_status(namespace="other")},
            {},
            "not-granted",
            403,
            "'harbor-pull' of mirrors[0] is not granted to namespace 'other'",
        ),
        ({}, {"image": "docker.io/library/nginx:1.27"}, "not-on-mirror", 403, "under no mirror"),
        ({}, {"image": "open.corp.example/quay/x:1"}, "no-credential", 403, "has no credential"),
        (
            {"policy_text": PULL_SECRET_POLICY},
            {},
            "not-kubelet-delivery",
            403,
            "credential 'harbor-pull' has delivery pullSecret, not kubelet",
        ),
        ({"store": {}}, {}, "no-login", 503, "no current login for credential 'harbor-pull'"),
        ({}, {"body": b"{"}, "bad-request", 400, "not JSON"),
        ({}, {"body": {"apiVersion": "v1"}}, "bad-request", 400, "not a credentialprovider"),
        ({}, {"token": ""}, "bad-request", 400, "serviceAccountToken: a non-empty string"),
        ({}, {"body": b" " * (64 * 1024 + 1)}, "bad-request", 413, "exceeds the 65536-byte limit"),
    ],
)
def test_every_refusal_says_why_and_is_counted_by_reason(
    fixture_args: dict[str, Any],
    call_args: dict[str, Any],
    reason: str,
    status: int,
    says: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fixture = Fixture(**fixture_args)
    before = {r: fixture.refusals(r) for r in endpoint.REASONS}
    with caplog.at_level(logging.WARNING):
        got, answer = fixture.call(**call_args)
    assert (got, answer["reason"]) == (status, reason)
    assert says in answer["error"]
    assert PASSWORD not in str(answer)
    after = {r: fixture.refusals(r) for r in endpoint.REASONS}
    assert {r: after[r] - before[r] for r in after if after[r] != before[r]} == {reason: 1}
    logged = [r for r in caplog.records if r.getMessage() == "kubelet credential refused"]
    assert len(logged) == 1
    assert TOKEN not in repr(logged[0].__dict__)
    assert PASSWORD not in repr(logged[0].__dict__)


@pytest.mark.parametrize(
    "delivery", ["", ", delivery: pullSecret"], ids=["default", "switched-back"]
)
def test_a_pull_secret_credential_granted_to_the_namespace_is_not_served_to_the_kubelet(
    delivery: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A credential granted to the Pod's namespace but delivered as a pull secret (never
    opted in, or switched back from kubelet) gives the kubelet nothing: a 403 with its own
    reason, counted and logged without the token or the password, while a kubelet
    credential of the same policy is still served."""
    policy_text = POLICY.replace(
        b'harbor-pull: {namespaces: ["team-*", excluded], delivery: kubelet}',
        b'harbor-pull: {namespaces: ["team-*", excluded]' + delivery.encode() + b"}",
    )
    policy_text = policy_text.replace(
        b"ghcr-pull: {namespaces: [other]", b"ghcr-pull: {namespaces: [team-b]"
    )
    assert policy_text.count(b"delivery: kubelet") == 1  # ghcr-pull only
    ghcr = Credential("ghcr-pull", "harbor.corp.example", "ghcr-robot", "ghcr-password")
    fixture = Fixture(
        review_status(namespace="team-b"),
        enforced=frozenset({"team-b"}),
        store={"harbor-pull": login(), "ghcr-pull": ghcr},
        policy_text=policy_text,
    )
    assert fixture.refusals("not-kubelet-delivery") == 0  # there from the start
    with caplog.at_level(logging.WARNING):
        status, answer = fixture.call()
    assert (status, answer["reason"]) == (403, "not-kubelet-delivery")
    assert "'harbor-pull' has delivery pullSecret, not kubelet" in answer["error"]
    assert "auth" not in answer
    assert PASSWORD not in str(answer)
    assert fixture.refusals("not-kubelet-delivery") == 1
    (logged,) = [r for r in caplog.records if r.getMessage() == "kubelet credential refused"]
    assert TOKEN not in repr(logged.__dict__)
    assert PASSWORD not in repr(logged.__dict__)
    # The kubelet credential granted to the same namespace is served as before.
    status, answer = fixture.call(image="harbor.corp.example/ghcr/org/app:1")
    assert status == 200
    assert answer["auth"] == {
        "harbor.corp.example/ghcr/org/app": {"username": "ghcr-robot", "password": "ghcr-password"}
    }
    assert fixture.refusals("not-kubelet-delivery") == 1
    assert (
        fixture.metrics.registry.get_sample_value("mirrorgate_kubelet_credential_logins_total") == 1
    )


def test_a_verdict_is_kept_until_the_token_expires_and_no_longer() -> None:
    fixture = Fixture()
    short = jwt(NOW + 60, "short")
    assert fixture.call(token=short)[0] == 200
    assert fixture.call(token=short)[0] == 200
    assert len(fixture.api.bodies) == 1  # the second answered from the kept verdict
    fixture.clock.now = NOW + 61  # past the token's exp: asked again
    assert fixture.call(token=short)[0] == 200
    assert len(fixture.api.bodies) == 2
    # A token valid for hours is still asked again after VERDICT_TTL_MAX.
    assert fixture.call()[0] == 200
    fixture.clock.now += tokens.VERDICT_TTL_MAX + 1
    assert fixture.call()[0] == 200
    assert len(fixture.api.bodies) == 4


def test_a_refused_token_is_not_reviewed_again_for_a_while() -> None:
    fixture = Fixture(review_status(authenticated=False))
    for _ in range(3):
        assert fixture.call()[1]["reason"] == "token-invalid"
    assert len(fixture.api.bodies) == 1
    fixture.clock.now += tokens.REFUSAL_TTL + 1
    assert fixture.call()[1]["reason"] == "token-invalid"
    assert len(fixture.api.bodies) == 2


def test_a_short_lived_login_is_kept_by_the_kubelet_no_longer_than_it_lasts() -> None:
    expires = datetime.datetime.fromtimestamp(NOW + 90, datetime.UTC)
    fixture = Fixture(store={"harbor-pull": login(expires)})
    assert fixture.call()[1]["cacheDuration"] == "90s"


PROVIDER_POLICY = b"""\
mirrors:
  - source: docker.io
    mirror: 123456789012.dkr.ecr.eu-west-1.amazonaws.com/dockerhub
    credential: ecr
credentials:
  ecr: {namespaces: [team-a], provider: ecr-credential-provider, delivery: kubelet}
"""
ECR_IMAGE = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/dockerhub/library/nginx:1.27"


def provider_login(password: str, *, issued: float, expires: float) -> Credential:
    """A plugin's login as every replica reads it: the Secret the leader's refresher
    publishes (its labels and issued/expires annotations), read back by the Kubernetes
    store."""
    issued_at = datetime.datetime.fromtimestamp(issued, datetime.UTC)
    expires_at = datetime.datetime.fromtimestamp(expires, datetime.UTC)
    registry = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    login = Credential("ecr", registry, "AWS", password, expires=expires_at, issued=issued_at)
    secret = kubestore.secret_from_credential(
        login,
        "mirrorgate",
        "ecr",
        labels={
            refresher.PROVIDER_LABEL: "ecr-credential-provider",
            kubestore.CREDENTIAL_LABEL: kubestore.CREDENTIAL_LABEL_VALUE,
        },
        annotations={
            refresher.ISSUED_ANNOTATION: rfc3339(issued_at),
            kubestore.EXPIRES_ANNOTATION: rfc3339(expires_at),
        },
    )
    return kubestore.credential_from_secret(secret, "mirrorgate", "ecr")


def test_a_provider_login_is_served_while_current_and_refused_once_expired() -> None:
    """A credential a provider plugin issues (`provider:`), delivered by the kubelet: the
    kubelet gets the plugin's current login, kept no longer than it lasts; the renewed one
    as soon as the store holds it; and, the login expired and not renewed (the plugin
    failing), a 503 no-login refusal, not the stale password."""
    logins = {"ecr": provider_login("first-token", issued=NOW - 60, expires=NOW + 600)}
    fixture = Fixture(store=logins, policy_text=PROVIDER_POLICY)
    status, answer = fixture.call(image=ECR_IMAGE)
    assert status == 200
    assert answer["auth"] == {
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/dockerhub/library/nginx": {
            "username": "AWS",
            "password": "first-token",
        }
    }
    assert answer["cacheDuration"] == "300s"  # --kubelet-cache-duration, within the login's life
    # The leader renewed it (at 80 % of its life): the next answer is the new login,
    # cached no longer than the new one lasts.
    fixture.clock.now = NOW + 480
    logins["ecr"] = provider_login("second-token", issued=NOW + 480, expires=NOW + 600 + 120)
    status, answer = fixture.call(image=ECR_IMAGE)
    assert status == 200
    (served,) = answer["auth"].values()
    assert served["password"] == "second-token"
    assert answer["cacheDuration"] == "240s"
    # No renewal since: at its expiry the login is refused, and counted as such.
    fixture.clock.now = NOW + 720
    status, answer = fixture.call(image=ECR_IMAGE)
    assert (status, answer["reason"]) == (503, "no-login")
    assert "no current login for credential 'ecr'" in answer["error"]
    assert "second-token" not in str(answer)
    assert fixture.refusals("no-login") == 1
    assert (
        fixture.metrics.registry.get_sample_value("mirrorgate_kubelet_credential_logins_total") == 2
    )


def test_the_token_is_in_no_repr_and_no_exception() -> None:
    fixture = Fixture(review_status(authenticated=False))
    assert TOKEN not in repr(fixture.reviewer)
    with pytest.raises(tokens.Refusal) as refused:
        asyncio.run(fixture.reviewer.verdict(TOKEN, caller="node-a"))
    assert TOKEN not in str(refused.value)
    assert TOKEN not in repr(refused.value)
    assert TOKEN not in repr(fixture.reviewer.__dict__)  # kept by its digest only


def test_reviews_of_one_token_in_flight_are_shared() -> None:
    fixture = Fixture()

    async def main() -> None:
        await asyncio.gather(*(fixture.reviewer.verdict(TOKEN, caller="n") for _ in range(5)))

    asyncio.run(main())
    assert len(fixture.api.bodies) == 1


def test_a_queue_with_slots_runs_that_many_turns_at_once() -> None:
    async def main() -> int:
        queue = FairQueue(per_caller=8, total=8, what="reviews", slots=3)
        running, most, gate = 0, 0, asyncio.Event()

        async def one(caller: str) -> None:
            nonlocal running, most
            async with queue.turn(caller):
                running += 1
                most = max(most, running)
                await gate.wait()
                running -= 1

        tasks = [asyncio.create_task(one(f"c{i % 2}")) for i in range(6)]
        for _ in range(10):
            await asyncio.sleep(0)
        assert running == 3
        gate.set()
        await asyncio.gather(*tasks)
        assert queue.places == 0
        return most

    assert asyncio.run(main()) == 3


def test_other_paths_and_methods_are_refused_plainly() -> None:
    status, answer = Fixture().call(path="/mutate")
    assert status == 404
    assert "POST /kubelet-credentials" in answer["error"]


def test_serve_says_what_the_kubelet_port_needs() -> None:
    from mirrorgate.webhook.commands.serve import kubelet
    from mirrorgate.webhook.commands.serve.settings import Settings
    from mirrorgate.webhook.errors import ConfigError

    settings = Settings(policy="p.yaml", kubelet_port=8444)
    with pytest.raises(ConfigError, match="--kubelet-port needs a cluster"):
        kubelet.client_ca(settings, None)
    assert kubelet.client_ca(Settings(policy="p.yaml"), None) is None
    with pytest.raises(ConfigError, match="--kubelet-port needs a cluster and a credential store"):
        kubelet.endpoint(
            settings,
            None,
            store=None,
            namespaces=None,
            mirror_policy=lambda namespace: parse_policy(POLICY, source="p"),
            metrics=Metrics(),
        )


def test_the_client_ca_comes_from_the_api_servers_configmap(tmp_path: Path) -> None:
    from mirrorgate.webhook.errors import ConfigError
    from mirrorgate.webhook.kubeletcreds import clientca

    class Api:
        def __init__(self, data: dict[str, str]) -> None:
            self.data, self.paths = data, list[str]()

        def get(self, path: str, **_: Any) -> dict[str, Any]:
            self.paths.append(path)
            return {"data": self.data}

    pem = AUTHORITY.cert_pem.decode()
    api = Api({"client-ca-file": pem})
    written = clientca.cluster_client_ca(api, tmp_path)  # type: ignore[arg-type]
    assert api.paths == [
        "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
    ]
    assert Path(written).read_text() == pem
    with pytest.raises(ConfigError, match="holds no client-ca-file: pass --kubelet-client-ca"):
        clientca.cluster_client_ca(Api({}), tmp_path)  # type: ignore[arg-type]
