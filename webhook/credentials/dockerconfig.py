"""A registry login taken from a docker ``config.json``, for
``mirrorgate credentials add NAME --registry HOST --from-docker-config FILE``.

What ``docker login`` (or ``podman login --authfile``) wrote is read the way
the docker CLI looks it up:

* ``credHelpers[HOST]``, then ``credsStore``, keep the login outside the file
  (in a keychain, a cloud helper): mirrorgate runs no helper, so the error
  names the helper and how to get the login instead;
* otherwise ``auths``: the entry whose key is HOST (keys may be written as
  URLs, ``https://HOST/v1/``), with ``auth`` (base64 ``user:password``),
  ``username``/``password``, or ``identitytoken``. An identity token is the
  password, sent with the entry's user (``<token>`` when it has none): the
  registries that issue them accept it so.

No message here contains a secret: not the password, not the ``auth`` value,
not a fragment of either.
"""

from __future__ import annotations

import base64
import binascii
import json
import pathlib
import re
from collections.abc import Mapping
from typing import NamedTuple

from mirrorgate.webhook.credentials.store import StoreError

__all__ = ["DockerConfigError", "Login", "login_for_add", "read_login"]

MAX_CONFIG_BYTES = 1 << 20
TOKEN_USER = "<token>"  # noqa: S105 (a user name, not a password)
"""The user docker's credential helpers pair with an identity token."""
_SCHEME_RE = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


class DockerConfigError(StoreError):
    """The docker config gives no usable login for the host; the message says why (no secret)."""


class Login(NamedTuple):
    username: str
    password: str

    def __repr__(self) -> str:
        return f"Login(username={self.username!r}, password=***)"


def _key_registry(key: str) -> str:
    """``https://HOST/v1/`` → ``HOST``; ``HOST/path/`` → ``HOST/path``: how docker reads keys."""
    bare = _SCHEME_RE.sub("", key).rstrip("/")
    if bare != key.rstrip("/"):  # a URL key: docker's legacy https://HOST/v1/ form
        bare = bare.removesuffix("/v1").removesuffix("/v2")
    return bare


def _entry(auths: Mapping[str, object], registry: str) -> tuple[str, object] | None:
    """The ``auths`` entry for ``registry``: its exact key first, then one for its host."""
    host = registry.partition("/")[0]
    keyed = {_key_registry(key): key for key in auths}
    for wanted in (registry, host):
        if wanted in keyed:
            return keyed[wanted], auths[keyed[wanted]]
    return None


def _helper(document: Mapping[str, object], registry: str) -> str | None:
    """The credential helper docker would ask for ``registry``'s login, if any."""
    helpers = document.get("credHelpers")
    if isinstance(helpers, Mapping):
        for candidate in (registry, registry.partition("/")[0]):
            helper = helpers.get(candidate)
            if isinstance(helper, str) and helper:
                return f"docker-credential-{helper} (credHelpers[{candidate!r}])"
    store = document.get("credsStore")
    if isinstance(store, str) and store:
        return f"docker-credential-{store} (credsStore)"
    return None


def _login(entry: object, where: str) -> Login | None:
    """The login an ``auths`` entry holds; None when it holds none (e.g. ``{}``)."""
    if not isinstance(entry, Mapping):
        raise DockerConfigError(f"{where} must be a mapping")
    fields = {key: entry.get(key) for key in ("auth", "username", "password", "identitytoken")}
    for key, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise DockerConfigError(f"{where}.{key} must be a string")
    username, password = fields["username"] or "", fields["password"] or ""
    if fields["auth"]:
        try:
            decoded = base64.b64decode(str(fields["auth"]), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise DockerConfigError(f"{where}.auth is not base64 of user:password") from None
        user, colon, secret = decoded.partition(":")
        if not colon:
            raise DockerConfigError(f"{where}.auth is not base64 of user:password (no ':')")
        username, password = username or user, password or secret
    token = fields["identitytoken"]
    if token:
        return Login(username or TOKEN_USER, str(token))
    if not password:
        return None
    if not username:
        raise DockerConfigError(f"{where} has a password but no user name")
    return Login(str(username), str(password))


def login_for_add(path: str, registry: str, *, username: str | None, password_stdin: bool) -> Login:
    """``credentials add --from-docker-config``: the login, which no other option may give."""
    if username is not None or password_stdin:
        raise DockerConfigError(
            "--from-docker-config takes the user and the password from "
            "the file: leave out --username and --password-stdin"
        )
    return read_login(path, registry)


def read_login(path: str, registry: str) -> Login:
    """``registry``'s login from the docker config at ``path``, or a clear error."""
    try:
        with pathlib.Path(path).open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise DockerConfigError(f"{path}: cannot read: {error.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise DockerConfigError(
            f"{path}: larger than {MAX_CONFIG_BYTES} bytes: not a docker config"
        )
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        # The position, never the text: the text may hold a secret.
        where = f" at line {error.lineno}" if isinstance(error, json.JSONDecodeError) else ""
        raise DockerConfigError(f"{path}: not valid JSON{where}") from None
    if not isinstance(document, Mapping):
        raise DockerConfigError(f"{path}: not a docker config (a JSON object with auths)")
    auths = document.get("auths", {})
    if not isinstance(auths, Mapping):
        raise DockerConfigError(f"{path}: auths must be a mapping")
    found = _entry(auths, registry)
    helpers = document.get("credHelpers")
    by_helper = isinstance(helpers, Mapping) and any(
        helpers.get(c) for c in (registry, registry.partition("/")[0])
    )
    login = None if found is None or by_helper else _login(found[1], f"{path}: auths[{found[0]!r}]")
    if login is not None:
        return login
    helper = _helper(document, registry)
    if helper is not None:
        raise DockerConfigError(
            f"{path}: the login for {registry} is kept by the credential helper {helper}, not "
            f"in the file; mirrorgate runs no helper: pass the login with --username and "
            f"--password-stdin (e.g. from `{helper.split()[0]} get`)"
        )
    known = ", ".join(sorted(repr(k) for k in auths)) or "none"
    if found is not None:
        raise DockerConfigError(
            f"{path}: auths[{found[0]!r}] holds no login (no auth, password or identitytoken)"
        )
    raise DockerConfigError(f"{path}: no login for {registry} in auths (entries: {known})")
