"""Read credentials out of a `.dockerconfigjson` the way kubelet does, but stricter.

Where a real kubelet can pull, it is the judge instead (tests/e2e/node/test_node.py:
the kubelet picks the generated Secret for the rewritten image). This
re-implementation stays only where no node is involved: the registry
harness's self-tests (test_harness.py) and the file credential store's
Secret, made by a mirrorgate serving the node-less `control_plane`
(test_pull_secrets.py); `encode` also builds the Secrets the tests hand out.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


class DockerConfigError(ValueError):
    """The `.dockerconfigjson` is malformed or self-contradictory (never shows secrets)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # keeps the password out of assertion rewrites and logs
        return f"Credentials(username={self.username!r}, password=***)"


def encode(host: str, username: str, password: str) -> dict[str, Any]:
    """The `.dockerconfigjson` a correct pull secret carries: auth, username and password."""
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"auths": {host: {"username": username, "password": password, "auth": auth}}}


def from_secret_data(data: Mapping[str, str]) -> dict[str, Any]:
    """Decode `Secret.data[".dockerconfigjson"]` (base64 JSON) into a dict."""
    try:
        raw = base64.b64decode(data[".dockerconfigjson"], validate=True)
        obj = json.loads(raw)
    except (KeyError, binascii.Error, ValueError) as exc:
        raise DockerConfigError(f"no valid .dockerconfigjson in secret data: {exc}") from None
    if not isinstance(obj, dict):
        raise DockerConfigError(".dockerconfigjson is not a JSON object")
    return obj


def _split_key(key: str) -> tuple[str, str]:
    # Keys are "host:port", "https://host:port" or "https://host:port/v1/" (docker login).
    rest = _SCHEME.sub("", key.strip())
    host, _, path = rest.partition("/")
    path = path.strip("/")
    if path in ("v1", "v2"):
        path = ""
    return host.lower(), path


def _entry_credentials(key: str, entry: Mapping[str, Any]) -> Credentials:
    username = entry.get("username")
    password = entry.get("password")
    auth = entry.get("auth")
    if auth:
        # kubelet lets `auth` override username/password, while containers/image reads
        # only `auth`; a secret whose fields disagree pulls differently per runtime, so
        # the harness treats the disagreement itself as an error.
        try:
            decoded = base64.b64decode(auth, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise DockerConfigError(f"auths[{key!r}].auth is not base64 text") from None
        user, sep, pw = decoded.partition(":")
        if not sep:
            raise DockerConfigError(f"auths[{key!r}].auth does not decode to user:password")
        if (username is not None and username != user) or (password is not None and password != pw):
            raise DockerConfigError(f"auths[{key!r}]: auth disagrees with username/password")
        return Credentials(user, pw)
    if username is None:
        raise DockerConfigError(f"auths[{key!r}] has neither auth nor username")
    return Credentials(str(username), str(password or ""))


def credentials_for(
    config: Mapping[str, Any], host: str, repository: str = ""
) -> Credentials | None:
    """The credentials the entry for `host` (most specific path prefix first) gives, or None."""
    auths = config.get("auths")
    if not isinstance(auths, Mapping):
        raise DockerConfigError(".dockerconfigjson has no 'auths' object")
    best: tuple[int, str, Mapping[str, Any]] | None = None
    for key, entry in auths.items():
        key_host, key_path = _split_key(key)
        if key_host != host.lower():
            continue
        if key_path and not (repository == key_path or repository.startswith(key_path + "/")):
            continue
        if not isinstance(entry, Mapping):
            raise DockerConfigError(f"auths[{key!r}] is not an object")
        if best is None or len(key_path) > best[0]:
            best = (len(key_path), key, entry)
    return None if best is None else _entry_credentials(best[1], best[2])
