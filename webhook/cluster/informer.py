"""A list-then-watch cache of one kind of object, kept in memory by a background thread.

This is what lets admission answer without calling the API: the generated
pull secrets, the central credentials and the namespaces' opt-in labels are
all read from informers. On a broken watch it lists again (a 410 means our
resourceVersion is too old), backing off while the API is unreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.logs import logger

__all__ = ["Informer", "Key"]

Key = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped objects."""


def key_of(obj: dict[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return metadata.get("namespace", ""), metadata.get("name", "")


class Informer(Loop):
    def __init__(
        self,
        client: kube.Kube,
        path: str,
        *,
        name: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_change: Callable[[str, dict[str, Any]], Any] | None = None,
        watch_timeout: int = 60,
        missing_ok: bool = False,
    ) -> None:
        super().__init__(f"informer-{name}")
        self.client, self.path, self.name = client, path, name
        self.label_selector, self.field_selector = label_selector, field_selector
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.items: dict[Key, dict[str, Any]] = {}
        self.synced = threading.Event()
        self.error: str | None = None
        self.missing_ok = missing_ok
        """A kind the API server does not serve (a 404 on the list: its CRD is not
        installed) counts as listed and empty, and is listed again until it is served."""

    def problem(self) -> str | None:
        if not self.synced.is_set():
            return f"{self.name}: not synced yet" + (f" ({self.error})" if self.error else "")
        return None

    def _notify(self, kind: str, obj: dict[str, Any]) -> None:
        if self.on_change is not None:
            try:
                self.on_change(kind, obj)
            except Exception:
                logger.exception(
                    "informer callback failed", extra={"fields": {"informer": self.name}}
                )

    def _relist(self) -> str:
        items, version = self.client.list(
            self.path, label_selector=self.label_selector, field_selector=self.field_selector
        )
        fresh = {key_of(obj): obj for obj in items}
        gone = [obj for key, obj in self.items.items() if key not in fresh]
        self.items = fresh  # one atomic swap: readers never see a half-built cache
        self.synced.set()
        self.error = None
        for obj in gone:
            self._notify("DELETED", obj)
        for obj in fresh.values():
            self._notify("SYNC", obj)
        return version

    def _missing(self, error: str) -> None:
        news = not self.synced.is_set() or bool(self.items)
        if news:
            logger.warning(
                "kind not served by the API server; taken as empty",
                extra={"fields": {"informer": self.name, "error": error}},
            )
        gone, self.items = list(self.items.values()), {}
        self.synced.set()
        self.error = None
        for obj in gone:
            self._notify("DELETED", obj)
        if news and not gone:
            self._notify("SYNC", {})  # listed (as empty) for the first time

    def _run(self) -> None:
        backoff = 0.5
        while not self.stopping:
            try:
                version = self._relist()
                backoff = 0.5
                while not self.stopping:
                    for kind, obj in self.client.watch(
                        self.path,
                        resource_version=version,
                        label_selector=self.label_selector,
                        field_selector=self.field_selector,
                        timeout_seconds=self.watch_timeout,
                    ):
                        version = (obj.get("metadata") or {}).get("resourceVersion", version)
                        if kind == "BOOKMARK":
                            continue
                        key = key_of(obj)
                        if kind == "DELETED":
                            self.items.pop(key, None)
                        else:
                            self.items[key] = obj
                        self._notify(kind, obj)
                        if self.stopping:
                            return
            except kube.Gone:
                continue  # relist from scratch
            except kube.KubeError as error:
                if self.missing_ok and isinstance(error, kube.NotFound):
                    self._missing(str(error))
                    self.pause(backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                self.error = str(error)
                logger.warning(
                    "informer error; retrying",
                    extra={
                        "fields": {
                            "informer": self.name,
                            "error": str(error),
                            "retry_in_s": backoff,
                        }
                    },
                )
                self.pause(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception:
                logger.exception(
                    "informer crashed; retrying", extra={"fields": {"informer": self.name}}
                )
                self.pause(backoff)
                backoff = min(backoff * 2, 10.0)
