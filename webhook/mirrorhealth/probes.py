"""One probe of a registry: is its API up, and does a credential log in to it?

Blocking stdlib HTTP (``http.client``), run by the health monitor's threads,
never on the admission path. Each probe is bounded: a deadline over the whole
exchange, at most :data:`MAX_BODY` bytes read, TLS 1.2 or later, verified
with the system trust store (which ``SSL_CERT_FILE`` replaces) or the
mirror's own CA file, unverified only where the policy says so. A mirror the
policy declares ``http://`` is probed in plain HTTP: its probes get no TLS
context (None), and only they may use plain HTTP. No message here contains a
password or a token.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Literal, NamedTuple

__all__ = ["Answer", "Login", "check_login", "check_mirror", "tls_context"]

MAX_BODY = 64 * 1024
USER_AGENT = "mirrorgate-health"


class Answer(NamedTuple):
    """The verdict of one probe, with a reason an operator can act on."""

    ok: bool
    reason: str


class Login(NamedTuple):
    """The verdict of one login: ``valid``, ``invalid`` (refused), or ``unknown`` (no answer)."""

    verdict: Literal["valid", "invalid", "unknown"]
    reason: str


class _Failed(Exception):
    """The exchange did not complete; the message says why, in an operator's words."""


def tls_context(
    ca_file: str | None, *, skip_verify: bool = False, mirror_ca: str | None = None
) -> ssl.SSLContext:
    """The system trust store (``SSL_CERT_FILE`` replaces it) with ``mirror_ca``'s CAs
    added (PEM, ``serve --mirror-ca``), or only ``ca_file``'s CAs: a rule's own caFile
    is the whole trust for its mirror.

    ``skip_verify``: no verification at all (the policy's ``insecureSkipVerify``).
    """
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(
            f"cannot load caFile {ca_file!r}: {getattr(error, 'strerror', None) or error}"
        ) from None
    if ca_file is None and mirror_ca:
        context.load_verify_locations(cadata=mirror_ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def mirror_url(host: str, context: ssl.SSLContext | None) -> str:
    """The mirror's API root: ``https://HOST/v2/``, or ``http://`` without a TLS context."""
    return f"{'https' if context is not None else 'http'}://{host}/v2/"


class _Response(NamedTuple):
    status: int
    headers: Mapping[str, str]
    body: bytes


class _Connection(http.client.HTTPSConnection):
    """An HTTP(S) connection that a timer cuts at ``deadline``, handshake included.

    Without a TLS context (None) it speaks plain HTTP.

    Socket timeouts bound each read, not the exchange: a server that drips a
    byte at a time would hold a probe for as long as it likes. The timer
    shuts the connection down through a duplicate of its descriptor, which
    ends whatever read is blocked on it.
    """

    def __init__(self, netloc: str, *, context: ssl.SSLContext | None, deadline: float) -> None:
        super().__init__(netloc, timeout=max(0.001, deadline - time.monotonic()), context=context)
        if context is None and ":" not in netloc.rpartition("]")[2]:
            self.port = http.client.HTTP_PORT
        self._tls, self._deadline = context, deadline
        self._killer: socket.socket | None = None
        self._timer: threading.Timer | None = None

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self._killer = raw.dup()
        self._timer = threading.Timer(max(0.0, self._deadline - time.monotonic()), self._cut)
        self._timer.daemon = True
        self._timer.start()
        self.sock = (
            raw if self._tls is None else self._tls.wrap_socket(raw, server_hostname=self.host)
        )

    def _cut(self) -> None:
        if self._killer is not None:
            with contextlib.suppress(OSError):
                self._killer.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        super().close()
        if self._timer is not None:
            self._timer.cancel()
        if self._killer is not None:
            self._killer.close()


def _get(
    url: str, *, context: ssl.SSLContext | None, deadline: float, authorization: str | None = None
) -> _Response:
    """One GET that gives up at ``deadline`` (monotonic), whatever the server does.

    HTTPS with ``context``; plain HTTP only without one (a mirror the policy
    declares ``http://``), never as a downgrade of an HTTPS exchange.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != ("https" if context is not None else "http") or not parts.netloc:
        raise _Failed(
            f"refusing to log in over {parts.scheme or 'no'} scheme "
            f"({'HTTPS' if context is not None else 'plain HTTP'} only: the "
            "scheme the policy gives the mirror)"
        )
    if time.monotonic() >= deadline:
        raise _Failed("timed out")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    connection = _Connection(parts.netloc, context=context, deadline=deadline)
    try:
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
        body = response.read(MAX_BODY)
        # The cut comes at the deadline, and a read it ends may look complete
        # (headers cut short): only what was read before the deadline counts.
        finished = time.monotonic()
        answered = _Response(
            response.status, {k.lower(): v for k, v in response.getheaders()}, body
        )
    except (OSError, http.client.HTTPException) as error:
        if time.monotonic() >= deadline:
            raise _Failed("timed out") from None  # whatever the cut made the read raise
        raise _Failed(_describe(error, parts.hostname)) from None
    finally:
        connection.close()
    if finished >= deadline:
        raise _Failed("timed out")
    return answered


def _describe(error: OSError | http.client.HTTPException, hostname: str | None) -> str:
    """Why an exchange failed, in an operator's words (never an exception's repr)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS verification failed: {error.verify_message}"
    if isinstance(error, ssl.SSLError):
        return f"TLS failed: {error.reason or error}"
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve {hostname}: {error.strerror}"
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    return f"not an HTTP answer ({type(error).__name__})"


def check_mirror(host: str, *, context: ssl.SSLContext | None, timeout: float) -> Answer:
    """``GET https://HOST/v2/``: 200 or 401 is up; refusal, timeout, TLS failure, 5xx are not.

    Without a TLS context, ``GET http://HOST/v2/``: a plain-HTTP mirror.
    """
    try:
        response = _get(
            mirror_url(host, context), context=context, deadline=time.monotonic() + timeout
        )
    except _Failed as error:
        return Answer(False, str(error))
    if response.status in (200, 401):
        return Answer(True, f"HTTP {response.status}")
    return Answer(False, f"/v2/ answered HTTP {response.status}")


_CHALLENGE_RE = re.compile(r"\s*([A-Za-z]+)\s*(.*)")
_PARAM_RE = re.compile(r'([A-Za-z_]+)\s*=\s*(?:"([^"]*)"|([^\s,]*))')


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="..."`` → (``bearer``, its parameters)."""
    found = _CHALLENGE_RE.match(header)
    if found is None:
        return "", {}
    params = {
        m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
        for m in _PARAM_RE.finditer(found.group(2))
    }
    return found.group(1).lower(), params


def check_login(
    host: str,
    username: str,
    password: str,
    *,
    repository: str,
    context: ssl.SSLContext | None,
    timeout: float,
) -> Login:
    """Log in to the registry at ``host`` as a client would before a pull, without pulling.

    Basic: ``/v2/`` with the credentials. Bearer: a token for
    ``repository:REPOSITORY:pull`` from the realm the challenge names. The
    whole login shares one ``timeout``.
    """
    deadline = time.monotonic() + timeout
    basic = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    try:
        challenge = _get(mirror_url(host, context), context=context, deadline=deadline)
        if challenge.status == 200:
            return Login("valid", "the mirror asks for no login")
        if challenge.status != 401:
            return Login("unknown", f"/v2/ answered HTTP {challenge.status}")
        scheme, params = _challenge(challenge.headers.get("www-authenticate", ""))
        if scheme == "basic":
            answer = _get(
                mirror_url(host, context), context=context, deadline=deadline, authorization=basic
            )
            where = "/v2/"
        elif scheme == "bearer" and params.get("realm"):
            query = {"scope": f"repository:{repository}:pull"}
            if params.get("service"):
                query["service"] = params["service"]
            realm = params["realm"]
            separator = "&" if "?" in realm else "?"
            answer = _get(
                realm + separator + urllib.parse.urlencode(query),
                context=context,
                deadline=deadline,
                authorization=basic,
            )
            where = "the token realm"
            if answer.status == 200 and not _has_token(answer.body):
                return Login("invalid", "the token realm answered without a token")
        else:
            return Login("unknown", "the 401 from /v2/ advertises no Basic or Bearer login")
    except _Failed as error:
        return Login("unknown", str(error))
    if answer.status == 200:
        return Login("valid", "logged in")
    if answer.status in (401, 403):
        return Login("invalid", f"login refused by {where} (HTTP {answer.status})")
    return Login("unknown", f"{where} answered HTTP {answer.status}")


def _has_token(body: bytes) -> bool:
    try:
        document = json.loads(body)
    except ValueError:
        return False
    return isinstance(document, dict) and any(
        isinstance(document.get(key), str) and document[key] for key in ("token", "access_token")
    )
