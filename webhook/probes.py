"""One probe of a registry: is its API up, and does a credential log in to it?

Blocking stdlib HTTP (``http.client``), run by the health monitor's threads,
never on the admission path. Each probe is bounded: a deadline over the whole
exchange, at most :data:`MAX_BODY` bytes read, TLS 1.2 or later, verified
with the system trust store (which ``SSL_CERT_FILE`` replaces) or the
mirror's own CA file. No message here contains a password or a token.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl
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


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The system trust store (``SSL_CERT_FILE`` replaces it), or only ``ca_file``'s CAs."""
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot load caFile {ca_file!r}: "
                         f"{getattr(error, 'strerror', None) or error}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class _Response(NamedTuple):
    status: int
    headers: Mapping[str, str]
    body: bytes


def _get(url: str, *, context: ssl.SSLContext, deadline: float,
         authorization: str | None = None) -> _Response:
    """One HTTPS GET that gives up at ``deadline`` (monotonic), whatever the server does."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https" or not parts.netloc:
        raise _Failed(f"refusing to log in over {parts.scheme or 'no'} scheme (HTTPS only)")

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Failed("timed out")
        return left

    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    connection = http.client.HTTPSConnection(parts.netloc, timeout=remaining(), context=context)
    try:
        connection.connect()
        # Kept: http.client drops its reference once a response will close the connection.
        sock = connection.sock
        assert sock is not None
        sock.settimeout(remaining())
        connection.request("GET", target, headers=headers)
        sock.settimeout(remaining())
        response = connection.getresponse()
        sock.settimeout(remaining())
        body = response.read(MAX_BODY)
        return _Response(response.status, {k.lower(): v for k, v in response.getheaders()},
                         body)
    except ssl.SSLCertVerificationError as error:
        raise _Failed(f"TLS verification failed: {error.verify_message}") from None
    except ssl.SSLError as error:
        raise _Failed(f"TLS failed: {error.reason or error}") from None
    except TimeoutError:
        raise _Failed("timed out") from None
    except ConnectionRefusedError:
        raise _Failed("connection refused") from None
    except socket.gaierror as error:
        raise _Failed(f"cannot resolve {parts.hostname}: {error.strerror}") from None
    except OSError as error:
        raise _Failed(error.strerror or type(error).__name__) from None
    except http.client.HTTPException as error:
        raise _Failed(f"not an HTTP answer ({type(error).__name__})") from None
    finally:
        connection.close()


def check_mirror(host: str, *, context: ssl.SSLContext, timeout: float) -> Answer:
    """``GET https://HOST/v2/``: 200 or 401 is up; refusal, timeout, TLS failure, 5xx are not."""
    try:
        response = _get(f"https://{host}/v2/", context=context,
                        deadline=time.monotonic() + timeout)
    except _Failed as error:
        return Answer(False, str(error))
    if response.status in (200, 401):
        return Answer(True, f"HTTP {response.status}")
    return Answer(False, f"/v2/ answered HTTP {response.status}")


_CHALLENGE_RE = re.compile(r'\s*([A-Za-z]+)\s*(.*)')
_PARAM_RE = re.compile(r'([A-Za-z_]+)\s*=\s*(?:"([^"]*)"|([^\s,]*))')


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="..."`` → (``bearer``, its parameters)."""
    found = _CHALLENGE_RE.match(header)
    if found is None:
        return "", {}
    params = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
              for m in _PARAM_RE.finditer(found.group(2))}
    return found.group(1).lower(), params


def check_login(host: str, username: str, password: str, *, repository: str,
                context: ssl.SSLContext, timeout: float) -> Login:
    """Log in to the registry at ``host`` as a client would before a pull, without pulling.

    Basic: ``/v2/`` with the credentials. Bearer: a token for
    ``repository:REPOSITORY:pull`` from the realm the challenge names. The
    whole login shares one ``timeout``.
    """
    deadline = time.monotonic() + timeout
    basic = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    try:
        challenge = _get(f"https://{host}/v2/", context=context, deadline=deadline)
        if challenge.status == 200:
            return Login("valid", "the mirror asks for no login")
        if challenge.status != 401:
            return Login("unknown", f"/v2/ answered HTTP {challenge.status}")
        scheme, params = _challenge(challenge.headers.get("www-authenticate", ""))
        if scheme == "basic":
            answer = _get(f"https://{host}/v2/", context=context, deadline=deadline,
                          authorization=basic)
            where = "/v2/"
        elif scheme == "bearer" and params.get("realm"):
            query = {"scope": f"repository:{repository}:pull"}
            if params.get("service"):
                query["service"] = params["service"]
            realm = params["realm"]
            separator = "&" if "?" in realm else "?"
            answer = _get(realm + separator + urllib.parse.urlencode(query), context=context,
                          deadline=deadline, authorization=basic)
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
        isinstance(document.get(key), str) and document[key] for key in ("token", "access_token"))
