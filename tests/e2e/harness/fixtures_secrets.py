"""Helpers for the generated-pull-secret e2e tests (tests/e2e/api/test_pull_secrets.py).

Everything here talks to real components: a TCP relay that really cuts the
link to the API server, webhook configurations of our own, crafted
AdmissionReviews posted over HTTPS, and the servers' own logs and metrics.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s

from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.kube import create_namespace, namespace_name
from tests.e2e.harness.procs import wait_until

SUITE_LABEL = "e2e.mirrorgate.io/suite"
MODE_LABEL = "mirrorgate.io/mode"
# A namespace's labels for each mode (the label mirrorgate itself reads).
ENFORCE_LABELS = {MODE_LABEL: "enforce"}
AUDIT_LABELS = {MODE_LABEL: "audit"}
MANAGED_BY = "app.kubernetes.io/managed-by"
LEASE = "mirrorgate-reconciler"


# --------------------------------------------------------------------------- credentials


def auth_value(username: str, password: str) -> str:
    """The base64 `auth` field of a .dockerconfigjson entry."""
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def as_dict(api: k8s.ApiClient, obj: object) -> dict[str, Any]:
    """A client model as the API server's JSON (camelCase keys)."""
    data: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data


def secret_config(secret: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    return config


def read_secret(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The Secret as JSON, or None when there is none."""
    try:
        return as_dict(api, k8s.CoreV1Api(api).read_namespaced_secret(name, namespace))
    except k8s.ApiException as error:
        if error.status == 404:
            return None
        raise


def list_secrets(api: k8s.ApiClient, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = as_dict(
        api, k8s.CoreV1Api(api).list_namespaced_secret(namespace)
    )["items"]
    return items


def labels_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def annotations_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


# --------------------------------------------------------------------------- policy files


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` in one rename, as a ConfigMap mount does: never read half-written."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    temporary.write_text(text)
    os.replace(temporary, path)


def policy_version(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:12]


def metrics_text(server: mg.Mirrorgate) -> str:
    with server.client() as http:
        response = http.get("/metrics")
    response.raise_for_status()
    return response.text


def wait_policy_live(server: mg.Mirrorgate, text: str, *, timeout: float = 10) -> None:
    """Wait until ``server`` reports the policy ``text`` as its live version."""
    version = policy_version(text)

    def live() -> str | None:
        found = re.findall(
            r'mirrorgate_policy_info\{[^}]*version="([0-9a-f]+)"', metrics_text(server)
        )
        return None if found == [version] else f"live versions {found}, want {version}"

    wait_until(
        live, timeout=timeout, what="policy reloaded", interval=0.1, alive=server.process.exited
    )


def rewrite_policy(server: mg.Mirrorgate, text: str) -> None:
    write_atomically(server.policy_path, text)
    wait_policy_live(server, text)


# --------------------------------------------------------------------------- metrics, logs


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def log_entries(text: str) -> list[dict[str, Any]]:
    """The JSON log lines of a mirrorgate log; any other line as {"level": "raw", ...}."""
    entries: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        entries.append(entry if isinstance(entry, dict) else {"level": "raw", "msg": line})
    return entries


def entries_with(server: mg.Mirrorgate, msg: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in log_entries(server.logs())
        if e.get("msg") == msg and all(e.get(k) == v for k, v in fields.items())
    ]


def wait_log(
    server: mg.Mirrorgate, msg: str, *, timeout: float = 10, **fields: Any
) -> dict[str, Any]:
    """Wait for a log line (info lines reach the file within about a second)."""
    found: list[dict[str, Any]] = []

    def seen() -> str | None:
        found[:] = entries_with(server, msg, **fields)
        return None if found else f"no {msg!r} line with {fields}"

    wait_until(seen, timeout=timeout, what=f"log line {msg!r}", interval=0.1)
    return found[-1]


def logs_flushed(servers: Sequence[mg.Mirrorgate], namespace: str) -> None:
    """Until every line each server has logged so far is in its log file.

    Info lines sit in a buffer flushed once a second, so reading a log once
    can miss a line already written. Each server gets a dry-run review (it
    makes nothing) and its admission line is awaited: a server's lines reach
    the file in the order written, so every earlier line is there too.
    """
    for server in servers:
        marker = f"flushed-{uuid.uuid4().hex[:8]}"
        review = admission_review(
            namespace, pod_dict(marker, "flush.e2e.example/marker:1", namespace=namespace)
        )
        review["request"]["dryRun"] = True
        with server.client() as http:
            status, body = post_review(http, review)
        assert status == 200, body
        wait_log(server, "admission", pod=marker)


def bad_lines(text: str) -> list[dict[str, Any]]:
    """Error or critical lines, tracebacks, and lines that are not our JSON."""
    return [
        e
        for e in log_entries(text)
        if e.get("level") in ("error", "critical", "raw") or "error_type" in e
    ]


# --------------------------------------------------------------------------- webhook plumbing


def own_configuration(configuration: Mapping[str, Any]) -> dict[str, Any]:
    """The base configuration's enforce webhook only.

    Registered with ``namespace_label=(SUITE_LABEL, value)`` it matches only
    namespaces labelled with that value (and mirrorgate.io/mode=enforce, which
    mirrorgate checks itself); the session's configuration leaves those out.
    """
    body = copy.deepcopy(dict(configuration))
    body["webhooks"] = [
        w for w in body["webhooks"] if w["clientConfig"]["service"]["path"] == "/mutate"
    ]
    assert len(body["webhooks"]) == 1, body["webhooks"]
    return body


def pod_dict(
    name: str, image: str, *, namespace: str | None = None, extra_images: Sequence[str] = ()
) -> dict[str, Any]:
    containers = [{"name": "app", "image": image}]
    containers += [{"name": f"extra{i}", "image": x} for i, x in enumerate(extra_images)]
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": containers},
    }


def admission_review(namespace: str, pod: Mapping[str, Any]) -> dict[str, Any]:
    """A CREATE pods AdmissionReview as kube-apiserver sends it."""
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": pod["metadata"]["name"],
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "e2e-tester", "groups": ["system:authenticated"]},
            "object": dict(pod),
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def post_review(http: httpx.Client, review: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    response = http.post(
        "/mutate", content=json.dumps(review), headers={"Content-Type": "application/json"}
    )
    body: dict[str, Any] = response.json()
    return response.status_code, body


def decoded_patch(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    operations: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return operations


def lease_holder(api: k8s.ApiClient, namespace: str = mg.NAMESPACE) -> str:
    lease = k8s.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
    assert lease.spec is not None
    return lease.spec.holder_identity or ""


def identity_pid(identity: str) -> int | None:
    """The pid in a LeaderElector identity (``<hostname>-<pid>-<hex>``)."""
    parts = identity.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


# --------------------------------------------------------------------------- a cuttable link


class ApiRelay:
    """A TCP relay in front of the API server whose link can be cut for real.

    ``hang()`` keeps every connection open but stops passing bytes either way
    (an API server that accepted the connection and never answers);
    ``close()`` closes the listening port and every connection (refused).
    """

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("https://").partition(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.forwarding = True
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="api-relay")
        self._threads.append(thread)
        thread.start()

    def _track(self, *sockets: socket.socket) -> bool:
        with self._lock:
            if self._closed.is_set():
                for s in sockets:
                    s.close()
                return False
            self._sockets.update(sockets)
            return True

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(0.2)
            if not self.forwarding:
                if self._track(client):
                    self._spawn(self._pump, client, None)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(0.2)
            if self._track(client, upstream):
                self._spawn(self._pump, client, upstream)
                self._spawn(self._pump, upstream, client)

    def _pump(self, source: socket.socket, sink: socket.socket | None) -> None:
        while not self._closed.is_set():
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if self.forwarding and sink is not None:
                try:
                    sink.sendall(data)
                except OSError:
                    break
        for s in (source, sink):
            if s is not None:
                self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(s)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()

    def hang(self) -> None:
        self.forwarding = False

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            self._drop(s)
        for thread in self._threads:
            thread.join(timeout=2)


# --------------------------------------------------------------------------- evidence


class Evidence:
    """Everything a secret could leak into: logs, metrics, warnings, annotations, outputs."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []
        self.logs: list[tuple[str, Path]] = []
        self.secrets: set[str] = set()

    def text(self, where: str, value: object) -> None:
        self.texts.append((where, value if isinstance(value, str) else json.dumps(value)))

    def log(self, name: str, server: mg.Mirrorgate) -> None:
        self.logs.append((name, server.process.log_path))

    def secret(self, username: str, password: str) -> None:
        self.secrets.update({password, auth_value(username, password)})

    def sources(self) -> Iterator[tuple[str, str]]:
        yield from self.texts
        for name, path in self.logs:
            yield f"log {name} ({path})", path.read_text(errors="replace")

    def leaks(self, extra: Sequence[tuple[str, str]] = ()) -> list[str]:
        found = []
        for where, text in [*self.sources(), *extra]:
            for index, secret in enumerate(sorted(self.secrets)):
                if secret and secret in text:
                    found.append(f"secret #{index} found in {where}")
        return found


def elapsed(since: float) -> float:
    return round(time.monotonic() - since, 3)


def register_for_suite(
    api: k8s.ApiClient,
    configuration: Mapping[str, Any],
    server: mg.Mirrorgate,
    *,
    name: str,
    suite: str,
) -> None:
    """Register ``server`` as ``name``, with ``configuration``'s enforce webhook only
    (failurePolicy Fail), for the namespaces labelled with ``suite``."""
    mg.register(
        api,
        own_configuration(configuration),
        server,
        name=name,
        namespace_label=(SUITE_LABEL, suite),
        failure_policy="Fail",
    )


def suite_namespace(api: k8s.ApiClient, hint: str, suite: str) -> str:
    """A new namespace of ``suite``, opted in to enforce: what its own server serves."""
    return create_namespace(api, namespace_name(hint), {SUITE_LABEL: suite, **ENFORCE_LABELS})
