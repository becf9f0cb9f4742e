"""Generated pull secrets: made before the Pod is admitted, rotated, healed and cleaned up.

For a Pod that needs credential C in namespace N, the Secret ``mirrorgate-C``
in N holds only C's registry login. mirrorgate may create, update and delete
Secrets but read none outside its own namespace, so what it knows of its
copies is its own record of them (:mod:`webhook.credentials.records`): the uid of each
copy and the keyed fingerprint (:mod:`webhook.credentials.fingerprints`) of what it wrote.

Admission asks :meth:`PullSecretProvisioner.missing` (memory only) and calls
:meth:`~PullSecretProvisioner.ensure` only for the few copies that are absent
or stale, and only in namespaces mirrorgate itself sees opted in
(:mod:`webhook.cluster.optin`). Creating claims the record first, so that of two
replicas exactly one creates the Secret; a Secret of that name that was there
before the claim is someone else's and is never touched. Every update and
delete carries the recorded uid as a precondition, so only the object
mirrorgate created is ever changed.

The leader's rotation, healing and clean-up of the copies is
:mod:`webhook.credentials.reconciler`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mirrorgate import policy
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.optin import ENFORCE, MODE_LABEL, NamespaceOptIn
from mirrorgate.webhook.credentials.fingerprints import Fingerprints
from mirrorgate.webhook.credentials.kubestore import MANAGED_BY_LABEL, secret_from_credential
from mirrorgate.webhook.credentials.records import Record, Records
from mirrorgate.webhook.credentials.store import Credential, CredentialStore
from mirrorgate.webhook.logs import logger

__all__ = ["CREDENTIAL_LABEL", "PullSecretProvisioner"]

CREDENTIAL_LABEL = "mirrorgate.io/credential"
OPT_IN_GRACE = 1.0
"""Seconds admission waits for its Namespace cache to show a label the API server saw."""
ABANDONED_CLAIM = 60.0
"""Seconds after which a claim never completed is taken for one a crash abandoned."""
RECONCILE_BUDGET = 15.0
"""Seconds one background write may take in all."""
_LOCK_STRIPES = 64
_UNRECORDED_LIMIT = 1024
_NAME_LIMIT = 63
"""A namespace name is a DNS label: never longer."""
_SLACK = 0.02
"""A call that failed this close to the deadline failed because the deadline came."""


class EnsureError(Exception):
    """One pull secret could not be made current; the message is for the Pod's creator.

    It says what happened in a few words and never quotes the API server: its
    RBAC messages name mirrorgate's ServiceAccount, which is for mirrorgate's
    log (where the detail goes), not for every user creating Pods.
    """


class Deadline:
    """The time left to an admission (or a background write), for every API call it makes."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> EnsureError:
        return EnsureError(f"no answer from the Kubernetes API within {self.seconds:g}s")

    def left(self) -> float:
        """The timeout for the next call; EnsureError when none is left."""
        remaining = self.remaining()
        if remaining <= 0.001:
            raise self.expired()
        return remaining


def secret_body(namespace: str, credential: Credential) -> dict[str, Any]:
    return secret_from_credential(
        credential,
        namespace,
        policy.pull_secret_name(credential.name),
        labels={MANAGED_BY_LABEL: "mirrorgate", CREDENTIAL_LABEL: credential.name},
    )


def _public(error: kube.KubeError, step: str) -> str:
    """What the Pod's creator is told; the detail goes to the log."""
    if isinstance(error, kube.Forbidden):
        cause = "forbidden"
    elif isinstance(error, kube.Unavailable):
        cause = "the Kubernetes API is unavailable"
    else:
        cause = f"the Kubernetes API answered {error.status} {error.reason}"[:120]
    return f"mirrorgate could not {step} it: {cause}"


def _foreign(namespace: str, secret: str) -> EnsureError:
    return EnsureError(
        f"Secret {namespace}/{secret} exists and was not created by mirrorgate; it is left "
        "alone (the name prefix mirrorgate- is reserved: delete or rename that Secret)"
    )


def is_abandoned(claim: Record) -> bool:
    """Whether a claim is older than :data:`ABANDONED_CLAIM` (an unreadable date is new)."""
    try:
        created = datetime.datetime.fromisoformat(claim.created)
    except ValueError:
        return False
    return (datetime.datetime.now(datetime.UTC) - created).total_seconds() > ABANDONED_CLAIM


class PullSecretProvisioner:
    """The :class:`webhook.admission.PullSecrets` implementation against the real API."""

    def __init__(
        self,
        client: kube.Kube,
        store: CredentialStore,
        *,
        records: Records,
        optin: NamespaceOptIn,
        fingerprints: Fingerprints,
        deadline: float = 2.0,
        counter: Callable[[str], Any] | None = None,
        squatted: Callable[[str, str, str], Any] | None = None,
    ) -> None:
        self.client = client
        self.store = store
        self.records = records
        self.optin = optin
        self.fingerprints = fingerprints
        self.deadline = deadline
        """Seconds ensure() may take in all: well inside the webhook's timeoutSeconds."""
        self.count = counter or (lambda action: None)
        self._squatted = squatted or (lambda namespace, secret, credential: None)
        """Told (namespace, secret, credential) of each copy's name found taken."""
        # Concurrent admissions for one copy take turns in a replica (bounded: striped).
        self._locks = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        self._unrecorded: dict[tuple[str, str], tuple[str, str]] = {}
        """(namespace, secret) -> (uid, fingerprint) of copies made whose record failed."""

    def start(self) -> None:
        self.records.informer.start()

    def stop(self) -> None:
        self.records.informer.stop()

    def problem(self) -> str | None:
        return (
            self.records.informer.problem() or self.optin.informer.problem() or self.store.problem()
        )

    def _current(self, namespace: str, credential: str) -> bool:
        wanted = self.store.snapshot().get(credential)
        return (
            wanted is not None
            and not wanted.expired()
            and self.records.holds(
                namespace, policy.pull_secret_name(credential), self.fingerprints.of(wanted)
            )
        )

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.optin.labels(namespace)

    def missing(self, namespace: str, credentials: Sequence[str]) -> list[str]:
        if not self.optin.enforced(namespace):
            return list(credentials)
        return [c for c in credentials if not self._current(namespace, c)]

    async def ensure(self, namespace: str, credentials: Sequence[str]) -> dict[str, str]:
        deadline = Deadline(self.deadline)
        grace = min(deadline.end, time.monotonic() + OPT_IN_GRACE)
        if not await self.optin.wait_enforced(namespace, until=grace):
            # A review can name any namespace: only our own cache says who opted in.
            # Quoted no longer than a namespace name can be: the review may be forged.
            quoted = namespace[:_NAME_LIMIT] + ("..." if len(namespace) > _NAME_LIMIT else "")
            logger.warning(
                "pull secret refused: namespace not opted in",
                extra={"fields": {"namespace": quoted, "mode": self.optin.mode(namespace)}},
            )
            for _ in credentials:
                self.count("failed")
            return dict.fromkeys(
                credentials, f"namespace {quoted!r} is not labelled {MODE_LABEL}={ENFORCE}"
            )
        done: set[str] = set()
        failures: dict[str, str] = {}

        def work() -> None:
            for credential in credentials:
                try:
                    self.ensure_one(namespace, credential, deadline)
                except EnsureError as error:
                    failures[credential] = str(error)
                # Only after the outcome is recorded: a credential the deadline
                # catches half-way counts as failed, never as done.
                done.add(credential)

        # Every call the thread makes is bounded by the deadline's remaining
        # time, so it ends when admission stops waiting for it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(work), timeout=max(deadline.remaining(), 0))
        timed_out = str(deadline.expired())
        failures = {**failures, **{c: timed_out for c in credentials if c not in done}}
        for _ in failures:
            self.count("failed")
        return failures

    def _lock(self, namespace: str, secret: str) -> threading.Lock:
        return self._locks[zlib.crc32(f"{namespace}/{secret}".encode()) % _LOCK_STRIPES]

    def ensure_one(self, namespace: str, name: str, deadline: Deadline) -> None:
        """Make ``mirrorgate-<name>`` in ``namespace`` current; EnsureError says why not."""
        credential = self.store.snapshot().get(name)
        if credential is None:
            raise EnsureError(f"credential {name!r} is not in the credential store")
        if credential.expired():
            # Kept in the store (its copies stay until it is renewed), but a
            # Pod is never pointed at a mirror with a login known to be dead.
            assert credential.expires is not None
            raise EnsureError(
                f"credential {name!r} expired at {credential.expires.isoformat(timespec='seconds')}"
            )
        secret = policy.pull_secret_name(name)
        lock = self._lock(namespace, secret)
        if not lock.acquire(timeout=deadline.left()):
            raise deadline.expired()
        step = ["create"]
        try:
            self._ensure_locked(namespace, secret, credential, deadline, step)
        except kube.KubeError as error:
            logger.warning(
                "pull secret not made",
                extra={"fields": {"secret": f"{namespace}/{secret}", "error": str(error)}},
            )
            if isinstance(error, kube.Unavailable) and deadline.remaining() < _SLACK:
                raise deadline.expired() from None  # the call ran out of the time it was given
            raise EnsureError(_public(error, step[0])) from None
        finally:
            lock.release()

    def _ensure_locked(
        self,
        namespace: str,
        secret: str,
        credential: Credential,
        deadline: Deadline,
        step: list[str],
    ) -> None:
        want = self.fingerprints.of(credential)
        for _ in range(3):  # another replica may be writing the record at the same moment
            record = self.records.get(namespace, secret)
            if record is None:
                try:
                    claim = self.records.claim(
                        namespace, secret, credential.name, timeout=deadline.left()
                    )
                except kube.AlreadyExists:
                    record = self._complete_unrecorded(
                        namespace, secret, deadline
                    ) or self._await_claim(namespace, secret, deadline)
                else:
                    self._create(claim, credential, want, deadline)
                    return
            elif not record.uid:
                record = self._complete_unrecorded(
                    namespace, secret, deadline
                ) or self._await_claim(namespace, secret, deadline)
            if record is None:
                continue  # the claim was released: claim again
            if record.fingerprint == want:
                return
            step[0] = "update"
            self._write(record, credential, want, deadline)
            return
        raise EnsureError(f"Secret {namespace}/{secret} kept changing under us")

    def _await_claim(self, namespace: str, secret: str, deadline: Deadline) -> Record | None:
        """Wait for another replica's claim to complete; None when it was released."""
        pause = 0.01
        while True:
            record = self.records.fetch(namespace, secret, timeout=deadline.left())
            if record is None or record.uid:
                return record
            if is_abandoned(record):
                raise EnsureError(
                    f"an earlier attempt to create Secret {namespace}/{secret} "
                    "was interrupted; mirrorgate will retry it"
                )
            time.sleep(min(pause, max(deadline.remaining(), 0)))
            pause = min(pause * 2, 0.1)

    def _create(self, claim: Record, credential: Credential, want: str, deadline: Deadline) -> None:
        body = secret_body(claim.namespace, credential)
        try:
            created = self.client.create(
                kube.secrets_path(claim.namespace), body, timeout=deadline.left()
            )
        except kube.AlreadyExists:
            # It was there before our claim: someone else's. Release the claim.
            self.records.drop(claim, timeout=deadline.left())
            raise self._foreign(claim) from None
        except kube.KubeError:
            with contextlib.suppress(kube.KubeError, EnsureError):
                self.records.drop(claim, timeout=deadline.left())
            raise
        self.count("created")
        uid = created["metadata"]["uid"]
        try:
            self.records.complete(claim, uid=uid, fingerprint=want, timeout=deadline.left())
        except (kube.KubeError, EnsureError):
            # The Secret is ours, but only this process knows its uid: keep it, so
            # that the claim is completed later rather than left to look foreign.
            if len(self._unrecorded) < _UNRECORDED_LIMIT:
                self._unrecorded[(claim.namespace, claim.secret)] = (uid, want)
            raise

    def _foreign(self, record: Record) -> EnsureError:
        """A Secret mirrorgate did not make holds the copy's name: say so, where people look."""
        self._squatted(record.namespace, record.secret, record.credential)
        return _foreign(record.namespace, record.secret)

    def record_unrecorded(self) -> None:
        """Complete the claims whose Secret was made but whose record write failed."""
        for namespace, secret in list(self._unrecorded):
            with self._lock(namespace, secret):
                try:
                    self._complete_unrecorded(namespace, secret, Deadline(RECONCILE_BUDGET))
                except (kube.KubeError, EnsureError) as error:
                    logger.warning(
                        "pull secret record not written",
                        extra={"fields": {"secret": f"{namespace}/{secret}", "error": str(error)}},
                    )

    def _complete_unrecorded(
        self, namespace: str, secret: str, deadline: Deadline
    ) -> Record | None:
        """The claim completed with the uid this process remembers; None if there is none."""
        remembered = self._unrecorded.get((namespace, secret))
        if remembered is None:
            return None
        claim = self.records.fetch(namespace, secret, timeout=deadline.left())
        if claim is not None and not claim.uid:
            claim = self.records.complete(
                claim, uid=remembered[0], fingerprint=remembered[1], timeout=deadline.left()
            )
        self._unrecorded.pop((namespace, secret), None)
        return claim

    def _write(self, record: Record, credential: Credential, want: str, deadline: Deadline) -> str:
        """Write the copy mirrorgate made (by its uid): "updated", or "created" if it was gone."""
        body = secret_body(record.namespace, credential)
        body["metadata"]["uid"] = record.uid  # the API server's precondition: this object only
        path = kube.secrets_path(record.namespace, record.secret)
        try:
            self.client.replace(path, body, timeout=deadline.left())
            uid, action = record.uid, "updated"
        except (kube.NotFound, kube.Conflict):
            # Ours is gone (NotFound; a Kubernetes 1.30 API server answers Conflict, the
            # uid precondition unmet by no object), or a Secret of that name is another
            # object than ours (Conflict). The create tells which: it fails only for the
            # other object, and then ours is forgotten.
            del body["metadata"]["uid"]
            try:
                uid = self.client.create(
                    kube.secrets_path(record.namespace), body, timeout=deadline.left()
                )["metadata"]["uid"]
            except kube.AlreadyExists:
                self.records.drop(record, timeout=deadline.left())
                raise self._foreign(record) from None
            action = "created"
        if (uid, want) != (record.uid, record.fingerprint):
            with contextlib.suppress(kube.Conflict):  # another replica recorded it first
                self.records.complete(record, uid=uid, fingerprint=want, timeout=deadline.left())
            self.count(action)
        return action

    def reassert(self, record: Record) -> str:
        """Write a copy again whether or not it looks current (heals a deleted one).

        Returns "updated" (written; unchanged contents are no write at all in
        etcd), "created" (it had been deleted) or raises EnsureError.
        """
        credential = self.store.snapshot().get(record.credential)
        if credential is None:
            raise EnsureError(f"credential {record.credential!r} is not in the credential store")
        deadline = Deadline(RECONCILE_BUDGET)
        lock = self._lock(record.namespace, record.secret)
        with lock:
            current = self.records.get(record.namespace, record.secret) or record
            try:
                return self._write(current, credential, self.fingerprints.of(credential), deadline)
            except kube.KubeError as error:
                raise EnsureError(str(error)) from None
