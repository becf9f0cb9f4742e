"""Mirror credentials: the value type, the pull-secret payload, and the central store interface.

A :class:`Credential` never shows its password: not in ``repr``, not in
``str``, not in any exception raised here. The only place the password
leaves this module is :meth:`Credential.dockerconfigjson`, the bytes that go
into a Secret's ``data``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import orjson

__all__ = ["Credential", "CredentialStore", "StoreError", "from_dockerconfigjson", "rfc3339"]


def rfc3339(moment: datetime.datetime) -> str:
    """``2026-11-30T20:30:00Z``: how expiry times are written and shown."""
    return moment.astimezone(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class StoreError(Exception):
    """The credential store cannot be read or written; the message names it and says why."""


@dataclasses.dataclass(frozen=True, slots=True)
class Credential:
    """One registry login: the mirror host it is for, a user, and a password."""

    name: str
    registry: str
    """The key in ``.dockerconfigjson``: the mirror's ``host[:port]`` (a path may follow)."""
    username: str
    password: str = dataclasses.field(repr=False)
    expires: datetime.datetime | None = None
    """When a short-lived login stops working (timezone-aware); None: not known to expire."""
    issued: datetime.datetime | None = dataclasses.field(default=None, compare=False)
    """When a short-lived login was issued (its lifetime is ``expires - issued``)."""

    def __str__(self) -> str:
        return f"credential {self.name!r} for {self.registry} (user {self.username!r})"

    def expired(self, now: datetime.datetime | None = None) -> bool:
        if self.expires is None:
            return False
        return (now or datetime.datetime.now(datetime.UTC)) >= self.expires

    def dockerconfigjson(self) -> bytes:
        """The ``.dockerconfigjson`` holding this login only.

        ``auth`` is what the kubelet and containers/image actually read;
        ``username`` and ``password`` are there for tools that read those.
        """
        auth = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return orjson.dumps(
            {
                "auths": {
                    self.registry: {
                        "username": self.username,
                        "password": self.password,
                        "auth": auth,
                    }
                }
            },
            option=orjson.OPT_SORT_KEYS,
        )


def _registry_key(key: str) -> str:
    # `kubectl create secret docker-registry --docker-server=https://h/v1/`
    # keys are URLs; the kubelet matches either form.
    for prefix in ("https://", "http://"):
        key = key.removeprefix(prefix)
    return key.removesuffix("/").removesuffix("/v1").removesuffix("/v2")


def from_dockerconfigjson(name: str, payload: bytes, *, where: str) -> Credential:
    """Read the single login of a ``kubernetes.io/dockerconfigjson`` payload.

    Raises StoreError naming ``where`` (never quoting the payload).
    """
    try:
        document = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise StoreError(f"{where}: .dockerconfigjson is not valid JSON") from None
    auths = document.get("auths") if isinstance(document, dict) else None
    if not isinstance(auths, dict) or len(auths) != 1:
        count = len(auths) if isinstance(auths, dict) else 0
        raise StoreError(
            f"{where}: .dockerconfigjson must hold exactly one registry under "
            f"'auths' (found {count})"
        )
    ((key, entry),) = auths.items()
    if not isinstance(entry, dict):
        raise StoreError(f"{where}: auths[{key!r}] is not an object")
    username, password = entry.get("username"), entry.get("password")
    if not (isinstance(username, str) and isinstance(password, str)):
        # `auth` alone is what some tools write: base64("user:pass").
        try:
            username, _, password = (
                base64.b64decode(str(entry.get("auth", ""))).decode().partition(":")
            )
        except (ValueError, UnicodeDecodeError):
            username = password = ""
    if not username or not password:
        raise StoreError(f"{where}: auths[{key!r}] has no username and password")
    return Credential(name=name, registry=_registry_key(key), username=username, password=password)


class CredentialStore(Protocol):
    """The central store: a snapshot of credentials by name, plus change notification."""

    def snapshot(self) -> Mapping[str, Credential]:
        """The current credentials (memory only, no I/O)."""
        ...

    def problem(self) -> str | None:
        """None when the store is loaded and current, else why not (for /readyz)."""
        ...

    def subscribe(self, callback: Callable[[], Any]) -> None:
        """Call ``callback`` after every change of the snapshot."""
        ...
