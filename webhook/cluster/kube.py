"""The Kubernetes API, as plain JSON over the client library's transport.

This is the only module that imports ``kubernetes`` (an import-linter contract
checks it). We borrow the library's kubeconfig and in-cluster loading and its
authenticated connection pool, and speak to the API in dicts: objects keep
every field, nothing is re-serialised through generated models, and errors
become the small hierarchy below with messages that never quote request or
response bodies (a Secret's body is a credential).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import kubernetes.client
import kubernetes.config
import orjson
import urllib3

from mirrorgate.webhook.errors import why_unreadable

__all__ = [
    "AlreadyExists",
    "Conflict",
    "Forbidden",
    "Gone",
    "Kube",
    "KubeError",
    "NotFound",
    "Unavailable",
]

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when none came back)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{message} (HTTP {status} {reason})" if status else message)
        self.status, self.reason, self.message = status, reason, message


class NotFound(KubeError):
    pass


class Forbidden(KubeError):
    """RBAC said no: the message names the verb and resource."""


class AlreadyExists(KubeError):
    """409 on create."""


class Conflict(KubeError):
    """409 on update: someone else changed the object since we read it."""


class Gone(KubeError):
    """410: a watch's resourceVersion is too old; list again."""


class Unavailable(KubeError):
    """No answer in time, a connection failure, or a 5xx."""


def _status_message(data: bytes) -> tuple[str, str]:
    try:
        status = orjson.loads(data)
    except orjson.JSONDecodeError:
        return "", ""
    if not isinstance(status, dict) or status.get("kind") != "Status":
        return "", ""
    # A Status message names the object and the rule; it never carries data.
    return str(status.get("reason", "")), str(status.get("message", ""))[:500]


def _error(status: int, data: bytes, what: str, method: str) -> KubeError:
    reason, message = _status_message(data)
    message = message or f"{method} {what} failed"
    if status == 404:
        return NotFound(status, reason or "NotFound", message)
    if status == 403:
        return Forbidden(status, reason or "Forbidden", message)
    if status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(status, reason or "Conflict", message)
    if status == 410:
        return Gone(status, reason or "Gone", message)
    if status >= 500 or status == 429:
        return Unavailable(status, reason or "Unavailable", message)
    return KubeError(status, reason or "Error", message)


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    """The query of a list or watch narrowed by labels and fields (``metadata.name=x``:
    one object, which RBAC's resourceNames can then allow)."""
    query = {}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


class Kube:
    """A connection to one API server; thread-safe (the pool is)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, *, timeout: float = 5.0) -> None:
        self.api = api_client
        self.timeout = timeout

    @classmethod
    def connect(
        cls, *, kubeconfig: str | None = None, context: str | None = None, timeout: float = 5.0
    ) -> Kube:
        """From a kubeconfig file, else the in-cluster service account.

        Raises KubeError (status 0) naming what is missing.
        """
        configuration = kubernetes.client.Configuration()
        problem = why_unreadable(kubeconfig) if kubeconfig is not None else None
        if problem is not None:
            # The library would call it "Invalid kube-config file".
            raise KubeError(0, "Config", f"kubeconfig {kubeconfig}: {problem}")
        try:
            if kubeconfig is not None or "KUBERNETES_SERVICE_HOST" not in os.environ:
                kubernetes.config.load_kube_config(
                    config_file=kubeconfig, context=context, client_configuration=configuration
                )
            else:
                kubernetes.config.load_incluster_config(client_configuration=configuration)
        except (kubernetes.config.ConfigException, OSError, ValueError, TypeError) as error:
            where = kubeconfig or "the default kubeconfig"
            raise KubeError(0, "Config", f"cannot load {where}: {error}") from None
        # Retries are ours to decide: the admission path has a deadline, and
        # urllib3's default three retries would multiply every timeout.
        configuration.retries = False
        return cls(kubernetes.client.ApiClient(configuration), timeout=timeout)

    @property
    def server(self) -> str:
        """The API server's URL, as the kubeconfig or the in-cluster config gives it."""
        return str(self.api.configuration.host)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.api.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = None,
        stream: bool = False,
    ) -> Any:
        url_path = path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            _, url, headers, _, _ = self.api.param_serialize(
                method=method,
                resource_path=url_path,
                header_params=headers,
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(
                method,
                url,
                header_params=headers,
                body=body,
                _request_timeout=timeout if timeout is not None else self.timeout,
            )
        except (
            urllib3.exceptions.HTTPError,
            OSError,
            kubernetes.client.exceptions.ApiException,
        ) as error:
            raise Unavailable(
                0,
                "Unavailable",
                f"{method} {path}: API server {self.server} unreachable ({type(error).__name__})",
            ) from None
        if stream:
            if response.status >= 400:
                raise _error(response.status, response.read() or b"", path, method)
            return response.response
        data = response.read() or b""
        if response.status >= 400:
            raise _error(response.status, data, path, method)
        return orjson.loads(data) if data else {}

    def get(self, path: str, *, timeout: float | None = None, **query: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", path, query=query or None, timeout=timeout)
        return result

    def create(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        timeout: float | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", path, body=body, timeout=timeout, query={"dryRun": "All"} if dry_run else None
        )
        return result

    def replace(
        self, path: str, body: Mapping[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """PUT: optimistic concurrency through the body's metadata.resourceVersion."""
        result: dict[str, Any] = self._call("PUT", path, body=body, timeout=timeout)
        return result

    def patch(
        self, path: str, body: Any, *, patch_type: str = "merge", timeout: float | None = None
    ) -> dict[str, Any]:
        content_type = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
        }[patch_type]
        result: dict[str, Any] = self._call(
            "PATCH", path, body=body, content_type=content_type, timeout=timeout
        )
        return result

    def delete(
        self,
        path: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Delete, optionally only if the object is still the one we saw."""
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v is not None
        }
        body = (
            {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
            if preconditions
            else None
        )
        self._call("DELETE", path, body=body, timeout=timeout)

    def list(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object under ``path`` (paginated) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        query: dict[str, Any] = {"limit": limit, **_selectors(label_selector, field_selector)}
        while True:
            page = self._call("GET", path, query=query)
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, (page.get("metadata") or {}).get("resourceVersion", "")
            query["continue"] = token

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events ``(type, object)`` after ``resource_version``; ends when the server closes."""
        query: dict[str, Any] = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
            **_selectors(label_selector, field_selector),
        }
        response = self._call(
            "GET", path, query=query, stream=True, timeout=(self.timeout, timeout_seconds + 30)
        )
        try:
            for line in response:
                if not line.strip():
                    continue
                event = orjson.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    code = int(status.get("code", 500))
                    raise _error(code, orjson.dumps(status), path, "WATCH")
                yield event["type"], event["object"]
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise Unavailable(
                0,
                "Unavailable",
                f"watch {path} on {self.server} interrupted ({type(error).__name__})",
            ) from None
        finally:
            response.release_conn()


def own_namespace(default: str = "mirrorgate") -> str:
    """The namespace this Pod runs in, from the service-account mount."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as handle:
            return handle.read().strip() or default
    except OSError:
        return default


MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
"""``mirrorgate`` on every object mirrorgate makes at run time."""


# Paths of the few resources mirrorgate touches.
def secrets_path(namespace: str | None = None, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/secrets" if namespace else "/api/v1/secrets"
    return f"{base}/{quote(name)}" if name else base


def namespaces_path(name: str | None = None) -> str:
    return f"/api/v1/namespaces/{quote(name)}" if name else "/api/v1/namespaces"


def configmaps_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/configmaps"
    return f"{base}/{quote(name)}" if name else base


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/events"


def pods_path(namespace: str | None = None) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"


def leases_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
    return f"{base}/{quote(name)}" if name else base


def webhook_configuration_path(name: str | None = None) -> str:
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    return f"{path}/{quote(name)}" if name else path


def validating_webhook_configuration_path(name: str | None = None) -> str:
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    return f"{path}/{quote(name)}" if name else path
