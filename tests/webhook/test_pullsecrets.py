"""The pull-secret provisioner's own rules: fingerprints, opt-in, short causes, the deadline.

The API behaviour itself (claims, uid preconditions, RBAC, healing) is tested
against the real API server in tests/e2e; here a scripted stand-in of the
client shows what the real one cannot be made to do on demand: answer some
calls and never answer others.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from io import StringIO
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.optin import NamespaceOptIn
from mirrorgate.webhook.credentials.fingerprints import Fingerprints
from mirrorgate.webhook.credentials.pullsecrets import PullSecretProvisioner
from mirrorgate.webhook.credentials.reconciler import Reconciler
from mirrorgate.webhook.credentials.records import Records
from mirrorgate.webhook.credentials.store import Credential
from tests.webhook.fakes import Behaviour, ScriptedKube, stored

PASSWORD = "p@ss:w/rd-91c2"
CREDENTIAL = Credential(
    name="harbor-pull", registry="harbor.corp.example", username="robot$pull", password=PASSWORD
)
KEY = bytes(range(32))
NAMESPACE = "shop"
RBAC_TEXT = (
    'secrets is forbidden: User "system:serviceaccount:mirrorgate:mirrorgate" '
    'cannot create resource "secrets" in API group "" in the namespace "shop"'
)


class StaticStore:
    def __init__(self, credentials: Mapping[str, Credential]) -> None:
        self.credentials = dict(credentials)
        self.waiting: str | None = None
        """What the store's problem() says: a store not listed yet."""

    def snapshot(self) -> Mapping[str, Credential]:
        return self.credentials

    def problem(self) -> str | None:
        return self.waiting

    def subscribe(self, callback: Callable[[], Any]) -> None:
        pass


def provisioner(
    client: ScriptedKube,
    *,
    labels: Mapping[str, str] | None = None,
    deadline: float = 2.0,
    squatted: Callable[[str, str, str], Any] | None = None,
) -> PullSecretProvisioner:
    real: Any = client  # the scripted stand-in of kube.Kube
    optin = NamespaceOptIn(real)
    optin.informer.items[("", NAMESPACE)] = {
        "metadata": {
            "name": NAMESPACE,
            "labels": dict(labels if labels is not None else {"mirrorgate.io/mode": "enforce"}),
        }
    }
    return PullSecretProvisioner(
        real,
        StaticStore({CREDENTIAL.name: CREDENTIAL}),
        records=Records(real, "mirrorgate"),
        optin=optin,
        fingerprints=Fingerprints(KEY),
        deadline=deadline,
        squatted=squatted,
    )


def ensure(made: PullSecretProvisioner) -> dict[str, str]:
    return asyncio.run(made.ensure(NAMESPACE, [CREDENTIAL.name]))


# --------------------------------------------------------------------------- fingerprints


def test_fingerprint_is_keyed_not_a_plain_hash() -> None:
    """What is recorded is an HMAC under mirrorgate's key, never sha256 of the login."""
    payload = CREDENTIAL.dockerconfigjson()
    fingerprint = Fingerprints(KEY).of(CREDENTIAL)
    assert fingerprint == hmac.new(KEY, payload, hashlib.sha256).hexdigest()
    assert fingerprint != hashlib.sha256(payload).hexdigest()
    assert Fingerprints(bytes(32)).of(CREDENTIAL) != fingerprint
    assert PASSWORD not in fingerprint
    assert KEY.hex() not in repr(Fingerprints(KEY))


@given(
    a=st.text(min_size=1, max_size=40),
    b=st.text(min_size=1, max_size=40),
    key=st.binary(min_size=32, max_size=32),
)
def test_fingerprints_follow_the_login(a: str, b: str, key: bytes) -> None:
    """Equal logins share a fingerprint; logins that differ in the password never do."""
    fingerprints = Fingerprints(key)
    first = Credential(name="c", registry="r.example", username="u", password=a)
    second = Credential(name="c", registry="r.example", username="u", password=b)
    assert (fingerprints.of(first) == fingerprints.of(second)) == (a == b)
    assert fingerprints.of(first) == Fingerprints(key).of(first)


# --------------------------------------------------------------------------- opt-in


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param({}, id="unlabelled"),
        pytest.param({"mirrorgate.io/mode": "audit"}, id="audit"),
        pytest.param({"mirrorgate.io/mode": "Enforce"}, id="wrong-case"),
    ],
)
def test_no_secret_for_a_namespace_not_opted_in(labels: dict[str, str]) -> None:
    """Whatever the review says, mirrorgate's own cache decides; not one API call is made."""
    client = ScriptedKube({})
    made = provisioner(client, labels=labels, deadline=0.2)
    assert made.missing(NAMESPACE, [CREDENTIAL.name]) == [CREDENTIAL.name]
    assert ensure(made) == {
        CREDENTIAL.name: f"namespace '{NAMESPACE}' is not labelled mirrorgate.io/mode=enforce"
    }
    assert client.calls == []


@pytest.mark.parametrize("namespace", ["never-seen", "x" * 2_000_000])
def test_unknown_namespace_gets_nothing_either(namespace: str, log_lines: StringIO) -> None:
    """Nothing is made, and a forged name is quoted no longer than a namespace name can be."""
    client = ScriptedKube({})
    made = provisioner(client, deadline=0.2)
    failures = asyncio.run(made.ensure(namespace, [CREDENTIAL.name]))
    assert "is not labelled" in failures[CREDENTIAL.name]
    assert len(failures[CREDENTIAL.name]) < 200
    assert len(log_lines.getvalue()) < 1000
    assert client.calls == []


# --------------------------------------------------------------------------- short causes


def claim_then(secret_create: Behaviour) -> dict[tuple[str, str], Behaviour]:
    return {
        ("POST", "configmaps"): stored,
        ("POST", "secrets"): secret_create,
        ("DELETE", "configmaps"): lambda body: {},
    }


@pytest.mark.parametrize(
    ("error", "told"),
    [
        pytest.param(
            kube.Forbidden(403, "Forbidden", RBAC_TEXT),
            "mirrorgate could not create it: forbidden",
            id="forbidden",
        ),
        pytest.param(
            kube.Unavailable(
                0,
                "Unavailable",
                "POST /api/v1/namespaces/shop/secrets: API server unreachable (MaxRetryError)",
            ),
            "mirrorgate could not create it: the Kubernetes API is unavailable",
            id="unavailable",
        ),
        pytest.param(
            kube.KubeError(422, "Invalid", 'Secret "mirrorgate-harbor-pull" is invalid'),
            "mirrorgate could not create it: the Kubernetes API answered 422 Invalid",
            id="invalid",
        ),
    ],
)
def test_the_pod_creator_gets_a_short_cause_and_the_log_the_detail(
    error: kube.KubeError, told: str, log_lines: StringIO
) -> None:
    """Never the API server's text (it names mirrorgate's identity) in what users see."""
    client = ScriptedKube(claim_then(error))
    assert ensure(provisioner(client)) == {CREDENTIAL.name: told}
    logged = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    detail = [e for e in logged if e["msg"] == "pull secret not made"]
    assert [e["error"] for e in detail] == [str(error)]
    assert detail[0]["secret"] == f"{NAMESPACE}/mirrorgate-harbor-pull"
    # The claim was released: its record does not block the next attempt.
    assert ("DELETE", "configmaps") in [(m, r) for m, r, _ in client.calls]


def test_a_secret_there_before_the_claim_is_foreign_and_left_alone() -> None:
    """The Pod's creator is told what to do about it, and the squatting is reported."""
    client = ScriptedKube(claim_then(kube.AlreadyExists(409, "AlreadyExists", "exists")))
    told: list[tuple[str, str, str]] = []
    made = provisioner(client, squatted=lambda *found: told.append(found))
    assert ensure(made) == {
        CREDENTIAL.name: (
            f"Secret {NAMESPACE}/mirrorgate-harbor-pull exists and was not created by mirrorgate; "
            "it is left alone (the name prefix mirrorgate- is reserved: delete or rename that "
            "Secret)"
        )
    }
    assert told == [(NAMESPACE, "mirrorgate-harbor-pull", CREDENTIAL.name)]
    assert [(m, r) for m, r, _ in client.calls] == [
        ("POST", "configmaps"),
        ("POST", "secrets"),
        ("DELETE", "configmaps"),
    ]


# --------------------------------------------------------------------------- the deadline


@pytest.mark.parametrize(
    "script",
    [
        pytest.param({}, id="claim-hangs"),
        pytest.param(
            {("POST", "configmaps"): kube.AlreadyExists(409, "AlreadyExists", "claimed")},
            id="claimed-elsewhere-then-read-hangs",
        ),
        pytest.param({("POST", "configmaps"): stored}, id="secret-create-hangs"),
        pytest.param(
            {("POST", "configmaps"): stored, ("POST", "secrets"): stored}, id="record-update-hangs"
        ),
    ],
)
def test_every_call_carries_the_remaining_deadline(
    script: dict[tuple[str, str], Behaviour],
) -> None:
    """Admission answers at the deadline, and no worker thread runs on after it.

    Each call that never answers is given the time left, so the worker ends
    with the deadline; a call without a timeout would hold the thread for the
    client's own (a minute here) after admission gave up.
    """
    client = ScriptedKube(script, forever=60.0)
    failures = ensure(provisioner(client, deadline=0.3))
    assert failures == {CREDENTIAL.name: "no answer from the Kubernetes API within 0.3s"}
    assert client.wait_idle(timeout=15), client.calls
    assert client.calls
    for method, resource, timeout in client.calls:
        assert timeout is not None, (method, resource)
        assert 0 < timeout <= 0.3, (method, resource, timeout)


# --------------------------------------------------------------------------- the reconciler


def record_object(*, uid: str, created: str, fingerprint: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"copy.{NAMESPACE}.mirrorgate-harbor-pull",
            "namespace": "mirrorgate",
            "uid": "record-uid",
            "resourceVersion": "7",
            "creationTimestamp": created,
        },
        "data": {
            "namespace": NAMESPACE,
            "secret": "mirrorgate-harbor-pull",
            "credential": CREDENTIAL.name,
            "uid": uid,
            "fingerprint": fingerprint,
        },
    }


def reconciler(client: ScriptedKube, record: dict[str, Any]) -> Reconciler:
    made = provisioner(client)
    made.records.informer.items[("mirrorgate", record["metadata"]["name"])] = record
    mirror_policy = policy.load(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": "m.example/hub", "credential": CREDENTIAL.name}
            ],
            "credentials": {CREDENTIAL.name: {"namespaces": ["*"]}},
        }
    )
    return Reconciler(
        made,
        made.client,
        mirror_policy=lambda: mirror_policy,
        policy_problem=lambda: None,
        is_leader=lambda: True,
    )


def test_no_pass_runs_before_the_policy_objects_are_composed_and_the_store_is_listed() -> None:
    """Until the objects are composed a replica serves the empty policy, which grants
    nothing, and a store not listed yet holds nothing: a pass then would delete every
    copy as unwanted. A replica that takes the Lease as it starts (the old leader
    stopping in a rollout, as in the upgrade from 0.1.0) waits for both."""
    client = ScriptedKube({("DELETE", "secrets"): lambda body: {}})
    made = reconciler(client, record_object(uid="u", created="2020-01-01T00:00:00Z"))
    made.mirror_policy = lambda: policy.compose([]).cluster  # what serve serves meanwhile
    waiting: dict[str, str] = {"policy": "policy objects: not composed yet"}
    made.policy_problem = lambda: waiting.get("policy")
    store = made.provisioner.store
    assert isinstance(store, StaticStore)
    store.waiting = "credential-store: not synced yet"
    made.provisioner.optin.informer.synced.set()
    made.provisioner.records.informer.synced.set()
    made.interval = 0.1
    made.start()
    try:
        ends = time.monotonic() + 0.6  # six re-assertions due meanwhile
        while time.monotonic() < ends:
            made.trigger()
            time.sleep(0.05)
        assert client.calls == []
        assert not made._ready()
        store.waiting = None
        assert not made._ready()  # the policy is still not the cluster's
        waiting.clear()
        assert made._ready()
    finally:
        made.stop()


def test_a_pass_reasserts_every_copy_each_interval_however_often_it_is_triggered() -> None:
    """Triggers more often than the interval (a provider's login refreshed every 15 s
    against the default 30 s) still leave a re-assertion, the heal of a deleted copy,
    due each interval: a quiet interval never comes."""
    made = reconciler(ScriptedKube({}), record_object(uid="u", created="2020-01-01T00:00:00Z"))
    made.interval = 0.3
    passes: list[bool] = []

    def reconcile_once(*, reassert: bool = False) -> dict[str, int]:
        passes.append(reassert)
        return {}

    made.reconcile_once = reconcile_once  # type: ignore[method-assign]
    made.provisioner.record_unrecorded = lambda: None  # type: ignore[method-assign]
    made._ready = lambda: True  # type: ignore[method-assign]  # the informers, synced
    made.start()
    try:
        ends = time.monotonic() + 1.5
        while time.monotonic() < ends:
            made.trigger()
            time.sleep(0.05)
    finally:
        made.stop()
    assert passes.count(False) >= 10  # the triggered passes ran
    assert passes.count(True) >= 3, passes  # and every 0.3 s a re-assertion among them


@pytest.mark.parametrize(
    ("age", "dropped"),
    [
        pytest.param(3600, True, id="abandoned"),
        pytest.param(5, False, id="in-progress"),
    ],
)
def test_a_claim_never_completed_is_dropped_after_a_minute(age: int, dropped: bool) -> None:
    """A claim a crash abandoned stops blocking the name; one in progress is left to finish."""
    created = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=age)
    client = ScriptedKube({("DELETE", "configmaps"): lambda body: {}})
    reconciler(
        client, record_object(uid="", created=created.strftime("%Y-%m-%dT%H:%M:%SZ"))
    ).reconcile_once(reassert=True)
    assert [(m, r) for m, r, _ in client.calls] == ([("DELETE", "configmaps")] if dropped else [])


def test_reassertion_forgets_a_copy_replaced_by_someone_else() -> None:
    """The uid precondition fails and the name is taken: the Secret there is not ours;
    only our record goes."""
    client = ScriptedKube(
        {
            ("PUT", "secrets"): kube.Conflict(409, "Conflict", "UID mismatch"),
            ("POST", "secrets"): kube.AlreadyExists(409, "AlreadyExists", "exists"),
            ("DELETE", "configmaps"): lambda body: {},
        }
    )
    fingerprint = Fingerprints(KEY).of(CREDENTIAL)
    made = reconciler(
        client,
        record_object(uid="secret-uid", created="2020-01-01T00:00:00Z", fingerprint=fingerprint),
    )
    assert made.reconcile_once(reassert=True)["failed"] == 1
    assert [(m, r) for m, r, _ in client.calls] == [
        ("PUT", "secrets"),
        ("POST", "secrets"),
        ("DELETE", "configmaps"),
    ]
    assert made.provisioner.records.all() == []


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(kube.NotFound(404, "NotFound", "secrets not found"), id="not-found"),
        # Kubernetes 1.30: the uid precondition, unmet by no object at all.
        pytest.param(
            kube.Conflict(409, "Conflict", "Precondition failed: UID in object meta: "),
            id="conflict-1.30",
        ),
    ],
)
def test_reassertion_brings_back_a_deleted_copy_whatever_the_api_server_answers(
    answer: kube.KubeError,
) -> None:
    """A deleted copy is created again and its record follows the new uid, whether the
    replace of the deleted Secret is answered NotFound or, as on 1.30, Conflict."""
    client = ScriptedKube(
        {
            ("PUT", "secrets"): answer,
            ("POST", "secrets"): lambda body: {
                **body,
                "metadata": {**body["metadata"], "uid": "new"},
            },
            ("PUT", "configmaps"): lambda body: dict(body),
        }
    )
    fingerprint = Fingerprints(KEY).of(CREDENTIAL)
    made = reconciler(
        client,
        record_object(uid="secret-uid", created="2020-01-01T00:00:00Z", fingerprint=fingerprint),
    )
    assert made.reconcile_once(reassert=True) == {
        "updated": 0,
        "restored": 1,
        "deleted": 0,
        "failed": 0,
    }
    assert [(m, r) for m, r, _ in client.calls] == [
        ("PUT", "secrets"),
        ("POST", "secrets"),
        ("PUT", "configmaps"),
    ]
    (record,) = made.provisioner.records.all()
    assert record.uid == "new"


def test_a_copy_whose_record_failed_is_recorded_later_not_taken_for_foreign() -> None:
    """The Secret was made but its uid could not be recorded: this replica remembers it."""
    made_secret: dict[str, Any] = {}

    def create_secret(body: Any) -> dict[str, Any]:
        made_secret.update(stored(body))
        return made_secret

    claim: dict[str, Any] = {}

    def create_claim(body: Any) -> dict[str, Any]:
        claim.update(stored(body))
        return claim

    completed: list[dict[str, Any]] = []

    def complete(body: Any) -> dict[str, Any]:
        completed.append(body)
        return dict(body)

    client = ScriptedKube(
        {
            ("POST", "configmaps"): create_claim,
            ("POST", "secrets"): create_secret,
            ("PUT", "configmaps"): kube.Unavailable(0, "Unavailable", "reset"),
        }
    )
    made = provisioner(client)
    failed = ensure(made)
    assert failed == {
        CREDENTIAL.name: "mirrorgate could not create it: the Kubernetes API is unavailable"
    }
    # The API is back; the background pass (every replica runs it) records the uid.
    client.script[("GET", "configmaps")] = lambda body: claim
    client.script[("PUT", "configmaps")] = complete
    made.record_unrecorded()
    assert [c["data"]["uid"] for c in completed] == [made_secret["metadata"]["uid"]]
    assert made.missing(NAMESPACE, [CREDENTIAL.name]) == []
    assert [(m, r) for m, r, _ in client.calls].count(("POST", "secrets")) == 1


def test_a_rotation_during_a_long_reassertion_is_handled_first() -> None:
    """The store changes while the paced re-assertion runs: every copy rotates in that pass."""
    rotated = Credential(
        name=CREDENTIAL.name,
        registry=CREDENTIAL.registry,
        username=CREDENTIAL.username,
        password="rotated-" + PASSWORD,
    )
    written: list[str] = []
    holder: list[Reconciler] = []

    def put_secret(body: Any) -> dict[str, Any]:
        written.append(
            json.loads(base64.b64decode(body["data"][".dockerconfigjson"]))["auths"][
                CREDENTIAL.registry
            ]["password"]
        )
        if len(written) == 1:  # the central credential changes during the first write
            holder[0].provisioner.store.credentials[CREDENTIAL.name] = rotated  # type: ignore[attr-defined]
            holder[0].trigger()
        return dict(body)

    client = ScriptedKube(
        {("PUT", "secrets"): put_secret, ("PUT", "configmaps"): lambda body: dict(body)}
    )
    current = Fingerprints(KEY).of(CREDENTIAL)
    made = reconciler(
        client, record_object(uid="uid-1", created="2020-01-01T00:00:00Z", fingerprint=current)
    )
    holder.append(made)
    second = record_object(uid="uid-2", created="2020-01-01T00:00:00Z", fingerprint=current)
    second["metadata"]["name"] = f"copy.{NAMESPACE}.mirrorgate-other"
    second["data"]["secret"] = "mirrorgate-other"
    made.provisioner.records.informer.items[("mirrorgate", second["metadata"]["name"])] = second
    counts = made.reconcile_once(reassert=True)
    assert counts["updated"] == 2, (counts, written)
    assert written[0] == PASSWORD
    assert written[-1] == "rotated-" + PASSWORD
    assert all(
        r.fingerprint == Fingerprints(KEY).of(rotated) for r in made.provisioner.records.all()
    )


def test_a_credential_added_to_the_store_during_a_pass_is_no_error() -> None:
    """A credential arrives in the store while a pass runs, and admission has already
    made a copy of it: the pass judges that copy by the store as it is, never by the
    view it began with (where the credential is missing), and goes on to the end."""
    other = Credential(
        name="other-pull", registry="harbor.corp.example", username="robot$other", password="o"
    )
    holder: list[Reconciler] = []

    def put_secret(body: Any) -> dict[str, Any]:
        # The store replaces its mapping on a change, as the real stores do.
        store: Any = holder[0].provisioner.store
        store.credentials = {**store.credentials, other.name: other}
        return dict(body)

    client = ScriptedKube(
        {("PUT", "secrets"): put_secret, ("PUT", "configmaps"): lambda body: dict(body)}
    )
    first = record_object(uid="uid-1", created="2020-01-01T00:00:00Z", fingerprint="stale")
    made = reconciler(client, first)
    holder.append(made)
    second = record_object(uid="uid-2", created="2020-01-01T00:00:00Z", fingerprint="stale")
    second["metadata"]["name"] = f"copy.{NAMESPACE}.mirrorgate-other-pull"
    second["data"].update(secret="mirrorgate-other-pull", credential=other.name)
    made.provisioner.records.informer.items[("mirrorgate", second["metadata"]["name"])] = second
    both = policy.load(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": "m.example/hub", "credential": CREDENTIAL.name},
                {"source": "quay.io", "mirror": "m.example/quay", "credential": other.name},
            ],
            "credentials": {
                name: {"namespaces": [NAMESPACE]} for name in (CREDENTIAL.name, other.name)
            },
        }
    )
    made.mirror_policy = lambda: both
    counts = made.reconcile_once()
    assert counts == {"updated": 2, "restored": 0, "deleted": 0, "failed": 0}
    fingerprints = {r.credential: r.fingerprint for r in made.provisioner.records.all()}
    assert fingerprints == {
        CREDENTIAL.name: Fingerprints(KEY).of(CREDENTIAL),
        other.name: Fingerprints(KEY).of(other),
    }
