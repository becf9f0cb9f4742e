"""Stand-ins behind small interfaces: ``admission.PullSecrets`` and, for one fault, ``kube.Kube``.

Unit tests only observe which calls admission makes; the real API is the
e2e suite's business.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mirrorgate import policy
from mirrorgate.webhook.cluster import kube


@dataclasses.dataclass
class RecordingPullSecrets:
    """``missing`` reports every credential while ``stale``; ``ensure`` fails for ``failures``."""

    stale: bool = True
    failures: dict[str, str] = dataclasses.field(default_factory=dict)
    explode: bool = False
    """When set, ``missing`` raises, as a bug in the real implementation would."""
    missing_calls: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)
    ensure_calls: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)
    labels: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    """Each namespace's labels, as the Namespace cache would hold them (absent: not known)."""

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.labels.get(namespace)

    def missing(self, namespace: str, credentials: Sequence[str]) -> list[str]:
        self.missing_calls.append((namespace, tuple(credentials)))
        if self.explode:
            raise RuntimeError("pull-secret cache exploded")
        return list(credentials) if self.stale else []

    async def ensure(self, namespace: str, credentials: Sequence[str]) -> dict[str, str]:
        self.ensure_calls.append((namespace, tuple(credentials)))
        return {c: self.failures[c] for c in credentials if c in self.failures}


Behaviour = Callable[[Any], dict[str, Any]] | Exception | None
"""How a scripted call answers: a function of the body, an error to raise, or None: never."""


class ScriptedKube:
    """Stands in for :class:`webhook.cluster.kube.Kube` for one fault the real API server cannot be
    made to show on demand: answering some calls and never answering others.

    A call that never answers waits for its timeout (``forever`` seconds when it has
    none, as the real client's would) and then fails as the real client does.
    """

    def __init__(self, script: dict[tuple[str, str], Behaviour], *, forever: float = 60.0) -> None:
        self.script = script
        self.forever = forever
        self.calls: list[tuple[str, str, float | None]] = []
        self._in_flight = 0
        self._idle = threading.Condition()

    def wait_idle(self, timeout: float) -> bool:
        """Whether every call has returned within ``timeout`` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout)

    def _call(self, method: str, path: str, body: Any, timeout: float | None) -> dict[str, Any]:
        resource = next(
            part
            for part in reversed(path.split("/"))
            if part in ("secrets", "configmaps", "namespaces")
        )
        self.calls.append((method, resource, timeout))
        behaviour = self.script.get((method, resource))
        with self._idle:
            self._in_flight += 1
        try:
            if behaviour is None:
                time.sleep(timeout if timeout is not None else self.forever)
                raise kube.Unavailable(0, "Unavailable", f"{method} {path}: timed out")
            if isinstance(behaviour, Exception):
                raise behaviour
            return behaviour(body)
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def create(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        return self._call("POST", path, body, timeout)

    def get(self, path: str, *, timeout: float | None = None) -> dict[str, Any]:
        return self._call("GET", path, None, timeout)

    def replace(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        return self._call("PUT", path, body, timeout)

    def delete(self, path: str, *, uid: str | None = None, timeout: float | None = None) -> None:
        self._call("DELETE", path, {"uid": uid}, timeout)


def stored(body: Any) -> dict[str, Any]:
    """What the API server answers to a create: the body with a uid and a version."""
    answer = copy.deepcopy(body)
    answer["metadata"] |= {
        "uid": str(uuid.uuid4()),
        "resourceVersion": "1",
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    return dict(answer)


@dataclasses.dataclass
class ListingKube:
    """Stands in for :class:`webhook.cluster.kube.Kube` where `mirrorgate audit` reads it: the
    Namespaces and Pods it holds, every read recorded (path, and the page's continue token).

    A namespace whose labels are None exists but may not be read (``get`` is forbidden, as a
    namespace-scoped Role allows); Pods are served in pages of ``page`` at most.
    ``objects`` are the ClusterMirrorPolicies and MirrorPolicies stored, listed cluster-wide
    or a namespace's (None: their CRDs are not installed, a 404).
    """

    namespaces: dict[str, dict[str, str] | None]
    pods: dict[str, list[dict[str, Any]]]
    page: int = 500
    reads: list[str] = dataclasses.field(default_factory=list)
    objects: list[dict[str, Any]] | None = dataclasses.field(default_factory=list)

    def _namespace(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": dict(self.namespaces[name] or {})}}

    def get(self, path: str, *, timeout: float | None = None, **query: Any) -> dict[str, Any]:
        self.reads.append(path)
        parts = path.removeprefix("/api/v1/").split("/")
        if parts == ["pods"] or parts[2:] == ["pods"]:
            found = [
                {**pod, "metadata": {**pod.get("metadata", {}), "namespace": namespace}}
                for namespace, pods in self.pods.items()
                if parts == ["pods"] or namespace == parts[1]
                for pod in pods
            ]
            start = int(query.get("continue") or 0)
            end = start + min(int(query.get("limit") or self.page), self.page)
            token = str(end) if end < len(found) else None
            return {"items": found[start:end], "metadata": {"continue": token}}
        if parts[0] == "namespaces" and len(parts) == 2:
            if parts[1] not in self.namespaces:
                raise kube.NotFound(404, "NotFound", f"namespaces {parts[1]!r} not found")
            if self.namespaces[parts[1]] is None:
                raise kube.Forbidden(403, "Forbidden", f"cannot get namespaces {parts[1]!r}")
            return self._namespace(parts[1])
        raise AssertionError(f"audit reads nothing else: GET {path}")

    def list(self, path: str, *, limit: int = 500, **_: Any) -> tuple[list[dict[str, Any]], str]:
        self.reads.append(path)
        if path == kube.namespaces_path():
            return [self._namespace(name) for name in self.namespaces], "1"
        prefix = f"/apis/{policy.API_VERSION}/"
        assert path.startswith(prefix), f"audit lists nothing else: {path}"
        if self.objects is None:
            raise kube.NotFound(404, "NotFound", "the server could not find the requested resource")
        parts = path.removeprefix(prefix).split("/")
        kind = (
            policy.CLUSTER_KIND if parts[-1] == "clustermirrorpolicies" else policy.NAMESPACED_KIND
        )
        return [
            copy.deepcopy(o)
            for o in self.objects
            if o["kind"] == kind and (len(parts) == 1 or o["metadata"].get("namespace") == parts[1])
        ], "1"

    def close(self) -> None:
        pass
