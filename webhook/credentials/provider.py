"""Logins from the kubelet's credential-provider exec plugins.

mirrorgate runs a plugin as the kubelet does: the binary ``<bin-dir>/<name>``
with the provider's ``args``, an allow-listed environment plus the provider's
``env``, a ``CredentialProviderRequest`` for one image on standard input, and
a ``CredentialProviderResponse`` expected on standard output, of the same
``apiVersion``. Where it runs (here, or in the plugin host's container) is
the :class:`~webhook.credentials.pluginrunner.PluginRunner`'s business; what
comes back is read and redacted here, the same way for both.

From the response it takes the login whose ``auth`` key covers the image
(the most specific one, as the kubelet's keyring tries them) and the lifetime:
``cacheDuration``, else the provider's ``defaultCacheDuration``. Responses are
cached by ``cacheKeyType`` (``Image``, ``Registry`` or ``Global``), as the
kubelet caches them, but a cached login is reused only in the first 80 % of its
life, so that a refresh asks the plugin again.

Bounded and quiet: a plugin that runs longer than the timeout, or writes more
than 1 MiB, is killed, and so is everything it started
(:mod:`~webhook.credentials.pluginprocess`); only the last 8 KiB of its
standard error are kept (whole lines), and logged with every secret it might
echo replaced by ``[redacted]``: the provider's ``env`` values, the passwords
of earlier answers, and every password in this run's output, found before
the output is parsed (so a refused answer is hidden too), in each form a line
could show it (as written, JSON-escaped, base64 of ``user:password``). The
same goes for the one-line reasons a run fails with. No password is in any
message here.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from mirrorgate.webhook.credentials.pluginrunner import STDOUT_LIMIT, PluginRunner, ProviderError
from mirrorgate.webhook.credentials.providerconfig import (
    CredentialProvider,
    CredentialProviderConfig,
    image_matches,
    parse_duration,
)
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.logs import logger

__all__ = ["REFRESH_AT", "ProviderError", "ProviderSource"]

REFRESH_AT = 0.8
"""The fraction of a login's lifetime after which it is asked for again."""
_CACHE_LIMIT = 1024
_SECRETS_LIMIT = 256
_CACHE_KEY_TYPES = ("Image", "Registry", "Global")
REDACTED = "[redacted]"


@dataclasses.dataclass(frozen=True)
class _Issued:
    """One response: its logins by auth key, and when and for how long."""

    logins: Mapping[str, tuple[str, str]] = dataclasses.field(repr=False)
    issued: float
    lifetime: float

    def fresh(self, now: float) -> bool:
        return now < self.issued + REFRESH_AT * self.lifetime

    def login(self, credential: str, image: str) -> Credential | None:
        """The login for ``image`` (the most specific key that covers it), or None."""
        chosen = _most_specific(self.logins, image)
        if chosen is None:
            return None
        username, password = self.logins[chosen]
        issued = datetime.datetime.fromtimestamp(self.issued, datetime.UTC)
        return Credential(
            name=credential,
            registry=chosen,
            username=username,
            password=password,
            issued=issued,
            expires=issued + datetime.timedelta(seconds=self.lifetime),
        )


def _registry_of(image: str) -> str:
    return image.partition("/")[0]


# A "username" or "password" member and its JSON string, found without
# parsing: output refused for any reason (not JSON, cut at the limit, the
# wrong kind, a failing exit status) holds its logins all the same.
_LOGIN_FIELD = re.compile(rb'"(username|password)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_SHARED_USERS = 8
"""Users tried with every password for the base64 form, besides its entry's own."""


def candidate_secrets(output: bytes) -> set[str]:
    """Every form in which a line could show a password of this output.

    Every password of the output (it is at most 1 MiB, and a plugin that hides
    its real login behind many others must not get it logged), as the output
    wrote it (JSON-escaped its own way), JSON-escaped as a log line escapes it
    (and with ASCII escapes), and base64 of ``user:password`` with the users
    of its neighbouring fields (its own entry's), the first few users of the
    output, and none: linear in the output.
    """
    fields: list[tuple[bytes, str, str]] = []
    for match in _LOGIN_FIELD.finditer(output):
        raw = match.group(2)
        try:
            value = orjson.loads(b'"' + raw + b'"')
        except orjson.JSONDecodeError:
            value = raw.decode("utf-8", "replace")
        fields.append((match.group(1), value, raw.decode("utf-8", "replace")))
    shared = {""}
    for kind, value, _ in fields:
        if kind == b"username" and len(shared) <= _SHARED_USERS:
            shared.add(value)
    found: set[str] = set()
    for at, (kind, password, raw) in enumerate(fields):
        if kind != b"password":
            continue
        users = set(shared)
        users.update(v for k, v, _ in fields[max(at - 1, 0) : at + 2] if k == b"username")
        found.update((raw, password, orjson.dumps(password).decode()[1:-1]))
        found.add(json.dumps(password)[1:-1])
        found.update(base64.b64encode(f"{user}:{password}".encode()).decode() for user in users)
    return found


_GRAM = 4
"""The shortest secret redacted, and the width of the grams that screen candidates."""


def _redact(text: str, secrets: Iterable[str]) -> str:
    # A run can yield hundreds of thousands of candidates and the text is a few
    # KiB: only a secret whose first and last grams are both in the text is
    # searched for, so the cost follows the candidates, not candidates x text.
    grams = {text[i : i + _GRAM] for i in range(len(text) - _GRAM + 1)}
    present = {
        s
        for s in secrets
        if len(s) >= _GRAM and s[:_GRAM] in grams and s[-_GRAM:] in grams and s in text
    }
    for secret in sorted(present, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


class ProviderSource:
    """Runs the configured plugins; thread-safe; one plugin run at a time per provider."""

    def __init__(
        self,
        config: CredentialProviderConfig,
        runner: PluginRunner,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.runner = runner
        self.clock = clock
        self._cache: dict[tuple[str, str, str], _Issued] = {}
        self._locks = {name: threading.Lock() for name in config.providers}
        # What stderr must never show: recent passwords and the env values.
        # Insertion-ordered and bounded: a refresh every hour for a year stays small.
        self._secrets: dict[str, None] = {}

    def __repr__(self) -> str:
        return f"ProviderSource({sorted(self.config.providers)}, {self.runner!r})"

    def provider(self, name: str) -> CredentialProvider:
        provider = self.config.providers.get(name)
        if provider is None:
            raise ProviderError(
                f"provider {name!r} is not in the credential-provider config "
                f"(it has: {', '.join(sorted(self.config.providers)) or 'none'})"
            )
        return provider

    def login(self, credential: str, provider_name: str, image: str) -> Credential:
        """A current login for ``image`` from the provider; its ``expires`` is set."""
        provider = self.provider(provider_name)
        if not provider.matches(image):
            raise ProviderError(
                f"image {image!r} does not match provider {provider_name!r}'s "
                f"matchImages ({', '.join(provider.match_images)})"
            )
        with self._locks[provider_name]:
            now = self.clock()
            for key in self._cache_keys(provider_name, image):
                cached = self._cache.get(key)
                login = (
                    cached.login(credential, image)
                    if cached is not None and cached.fresh(now)
                    else None
                )
                if login is not None:
                    return login
            login = self._run(provider, image, now).login(credential, image)
            if login is None:
                raise ProviderError(f"plugin {provider_name!r}: no auth key covers image {image!r}")
            return login

    @staticmethod
    def _cache_keys(provider: str, image: str) -> list[tuple[str, str, str]]:
        return [
            (provider, "Image", image),
            (provider, "Registry", _registry_of(image)),
            (provider, "Global", ""),
        ]

    def _run(self, provider: CredentialProvider, image: str, now: float) -> _Issued:
        for _, value in provider.env:
            self._remember(value)
        try:
            finished = self.runner.run(provider, image)
        except ProviderError as error:  # the plugin host's reasons, too, are redacted
            raise ProviderError(_redact(str(error), self._secrets)) from None
        # Whatever the output turns out to be, the logins in it are secrets
        # from here on: in the logged stderr and in every message.
        found = candidate_secrets(finished.stdout)
        hidden = {*self._secrets, *found}
        try:
            if finished.failure == "timeout":
                raise ProviderError(
                    f"plugin {provider.name!r} did not answer within "
                    f"{self.runner.timeout:g} s and was killed"
                )
            if finished.failure == "too much":
                raise ProviderError(
                    f"plugin {provider.name!r} wrote more than {STDOUT_LIMIT} bytes and was killed"
                )
            if finished.returncode != 0:
                raise ProviderError(
                    f"plugin {provider.name!r} failed with exit status {finished.returncode}"
                )
            issued = self._read(provider, image, finished.stdout, now)
            for secret in found:
                self._remember(secret)  # a later run may echo this run's login
            return issued
        except ProviderError as error:
            raise ProviderError(_redact(str(error), hidden)) from None
        finally:
            self._log_stderr(provider.name, finished.stderr, hidden)

    def _remember(self, secret: str) -> None:
        self._secrets.pop(secret, None)
        self._secrets[secret] = None
        while len(self._secrets) > _SECRETS_LIMIT:
            del self._secrets[next(iter(self._secrets))]

    def _log_stderr(self, provider: str, stderr: bytes, hidden: Iterable[str]) -> None:
        if not stderr.strip():
            return
        text = stderr.decode("utf-8", "replace").strip()
        logger.info(
            "credential provider said",
            extra={"fields": {"provider": provider, "stderr": _redact(text, hidden)}},
        )

    def _read(self, provider: CredentialProvider, image: str, stdout: bytes, now: float) -> _Issued:
        where = f"plugin {provider.name!r}"
        try:
            response = orjson.loads(stdout)
        except orjson.JSONDecodeError:
            raise ProviderError(f"{where} did not answer with JSON") from None
        if not isinstance(response, dict):
            raise ProviderError(f"{where} did not answer with a JSON object")
        if response.get("kind") != "CredentialProviderResponse":
            raise ProviderError(
                f"{where}: kind is {str(response.get('kind'))[:60]!r}, not "
                "CredentialProviderResponse"
            )
        if response.get("apiVersion") != provider.api_version:
            raise ProviderError(
                f"{where}: apiVersion {str(response.get('apiVersion'))[:60]!r} "
                f"does not match the configured {provider.api_version}"
            )
        key_type = response.get("cacheKeyType")
        if key_type not in _CACHE_KEY_TYPES:
            raise ProviderError(
                f"{where}: cacheKeyType {str(key_type)[:20]!r} is not one of "
                f"{', '.join(_CACHE_KEY_TYPES)}"
            )
        lifetime: float | None = provider.default_cache_duration
        if response.get("cacheDuration") is not None:
            lifetime = parse_duration(response["cacheDuration"])
            if lifetime is None or lifetime < 0:
                raise ProviderError(
                    f"{where}: cacheDuration "
                    f"{str(response['cacheDuration'])[:40]!r} is not a "
                    "duration from 0 to 2562047h (such as 12h)"
                )
        if not lifetime:
            # The kubelet would ask again at every pull; a pull secret must outlive that.
            raise ProviderError(
                f"{where}: the login has no lifetime (cacheDuration and "
                "defaultCacheDuration are 0), so it cannot be kept in a Secret"
            )
        issued = _Issued(self._logins(response.get("auth"), where), now, lifetime)
        key = {
            "Image": (provider.name, "Image", image),
            "Registry": (provider.name, "Registry", _registry_of(image)),
            "Global": (provider.name, "Global", ""),
        }[key_type]
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = issued
        return issued

    def _logins(self, auth: object, where: str) -> dict[str, tuple[str, str]]:
        if not isinstance(auth, dict) or not auth:
            raise ProviderError(f"{where}: the response has no auth entries")
        logins: dict[str, tuple[str, str]] = {}
        for key, entry in auth.items():
            if not isinstance(entry, dict):
                raise ProviderError(f"{where}: auth[{str(key)[:80]!r}] is not an object")
            username, password = entry.get("username"), entry.get("password")
            if not (isinstance(username, str) and isinstance(password, str) and password):
                raise ProviderError(
                    f"{where}: auth[{str(key)[:80]!r}] has no username and password"
                )
            logins[key] = (username, password)
        return logins


def _most_specific(logins: Mapping[str, Any], image: str) -> str | None:
    # The kubelet's keyring tries keys in reverse lexical order: longer,
    # more specific keys of one registry come first.
    for key in sorted(logins, reverse=True):
        if image_matches(key, image):
            return key
    return None
