"""The plugin host: credential-provider plugins in a container of their own, over a unix socket.

Why: a plugin run in mirrorgate's container can read mirrorgate's
ServiceAccount token, the one the API server accepts, and act as mirrorgate.
The chart runs ``mirrorgate plugin-host`` as a sidecar whose container has
no such token mounted (the Pod sets ``automountServiceAccountToken: false``
and mounts the API token into the mirrorgate container alone), only a token
of an audience the cloud's STS takes, and ``serve`` asks it for each run
through a socket on an ``emptyDir`` the two containers share.

The exchange, one per connection: the client sends ``{"provider", "image"}``;
the host runs the provider that its own CredentialProviderConfig names, for an
image it matches (the caller chooses no binary, argument or environment), with
a :class:`~webhook.credentials.pluginrunner.LocalRunner`, and answers
``{"returncode", "failure", "stdout", "stderr"}`` (the outputs in base64) or
``{"error"}``. Each message is a frame: a 4-byte big-endian length, then that
much JSON. The output comes back raw: serve redacts and reads it, as it does
a plugin it ran itself, and the host logs none of it.

Bounded: the host runs one plugin at a time (other connections wait in the
listen backlog); it drops a request over 64 KiB or not complete within 5 s.
The client takes an answer of at most 2 MiB (a plugin's 1 MiB of output and
8 KiB of standard error, in base64) and waits for it the plugin's timeout plus
5 s. The socket is made with mode 0600: only the host's user (and root) may
connect.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

import orjson

from mirrorgate.webhook import logs
from mirrorgate.webhook.credentials import pluginprocess
from mirrorgate.webhook.credentials.pluginrunner import (
    LocalRunner,
    PluginRunner,
    ProviderError,
)
from mirrorgate.webhook.credentials.providerconfig import (
    CredentialProvider,
    CredentialProviderConfig,
)
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.logs import logger

__all__ = ["API_TOKEN", "REQUEST_LIMIT", "HostClient", "listen", "runner", "serve_forever"]

REQUEST_LIMIT = 64 << 10
_ANSWER_LIMIT = 2 << 20
_REQUEST_TIMEOUT = 5.0
"""Seconds a client has to send its request, and to take the answer."""
_GRACE = 5.0
"""Seconds the client waits beyond the plugin's timeout: the host's queue and the frames."""
_BACKLOG = 16
_HEADER = struct.Struct(">I")
API_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 - a path
"""Where a Pod's ServiceAccount token of the API server's audience is mounted."""


class FrameError(Exception):
    """A frame that is cut short, too long, or not a JSON object; the message says which."""


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    body = orjson.dumps(message)
    conn.sendall(_HEADER.pack(len(body)) + body)


def _read_exactly(conn: socket.socket, size: int, deadline: float) -> bytes:
    chunks, left = [], size
    while left:
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = conn.recv(min(left, 1 << 16))
        if not chunk:
            raise FrameError(f"ends after {size - left} of {size} bytes")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(conn: socket.socket, limit: int, deadline: float) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_read_exactly(conn, _HEADER.size, deadline))
    if size > limit:
        raise FrameError(f"is {size} bytes, over the limit of {limit}")
    try:
        message = orjson.loads(_read_exactly(conn, size, deadline))
    except orjson.JSONDecodeError:
        raise FrameError("is not JSON") from None
    if not isinstance(message, dict):
        raise FrameError("is not a JSON object")
    return message


@dataclasses.dataclass(frozen=True)
class HostClient:
    """Runs plugins in the plugin host listening on ``path``."""

    path: str | Path
    timeout: float = 10.0

    def run(self, provider: CredentialProvider, image: str) -> pluginprocess.Finished:
        where = f"the plugin host's socket {str(self.path)!r}"
        deadline = time.monotonic() + self.timeout + _GRACE
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(_REQUEST_TIMEOUT)
                conn.connect(str(self.path))
                _send(conn, {"provider": provider.name, "image": image})
                answer = _receive(conn, _ANSWER_LIMIT, deadline)
        except FileNotFoundError:
            raise ProviderError(
                f"{where} does not exist: is the plugin-host container running "
                "(mirrorgate plugin-host --socket PATH)?"
            ) from None
        except ConnectionRefusedError:
            raise ProviderError(f"nothing listens on {where}: the plugin host stopped") from None
        except TimeoutError:
            raise ProviderError(
                f"the plugin host did not answer plugin {provider.name!r}'s run within "
                f"{self.timeout + _GRACE:g} s"
            ) from None
        except FrameError as error:
            raise ProviderError(f"the plugin host's answer {error}") from None
        except OSError as error:
            raise ProviderError(f"{where}: {error.strerror or error}") from None
        return _finished(answer)


def _finished(answer: dict[str, Any]) -> pluginprocess.Finished:
    if "error" in answer:
        raise ProviderError(str(answer["error"])[:500])
    returncode, failure = answer.get("returncode"), answer.get("failure")
    try:
        stdout = base64.b64decode(answer.get("stdout", ""), validate=True)
        stderr = base64.b64decode(answer.get("stderr", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ProviderError("the plugin host's answer has an output that is not base64") from None
    if not isinstance(returncode, int) or failure not in (None, "timeout", "too much"):
        raise ProviderError("the plugin host's answer has no exit status or an unknown failure")
    return pluginprocess.Finished(stdout, stderr, returncode, failure)


def runner(*, bin_dir: str | None, socket_path: str | None, timeout: float) -> PluginRunner:
    """Plugins run here (``--credential-provider-bin-dir``) or in the plugin host (``-socket``)."""
    if bin_dir is not None and socket_path is not None:
        raise ConfigError(
            "--credential-provider-bin-dir and --credential-provider-socket: give one "
            "(plugins run in this container, or in the plugin host)"
        )
    if socket_path is not None:
        return HostClient(socket_path, timeout=timeout)
    if bin_dir is None:
        raise ConfigError(
            "--credential-provider-config needs --credential-provider-socket (the plugin "
            "host's) or --credential-provider-bin-dir"
        )
    if os.access(API_TOKEN, os.R_OK):
        logger.warning(
            "credential-provider plugins run in this container and can read its "
            "ServiceAccount token; run them in the plugin host (--credential-provider-socket)",
            extra={"fields": {"token": API_TOKEN}},
        )
    return LocalRunner(bin_dir, timeout=timeout)


def listen(path: str | Path) -> socket.socket:
    """The host's listening socket at ``path``, mode 0600; a stale socket there is replaced."""
    path = Path(path)
    if path.is_socket():
        path.unlink()  # left by a host that was killed
    elif path.exists() or path.is_symlink():
        raise ConfigError(f"--socket {str(path)!r}: exists and is not a socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)
    try:
        listener.bind(str(path))
        listener.listen(_BACKLOG)
    except OSError as error:
        listener.close()
        raise ConfigError(f"--socket {str(path)!r}: {error.strerror or error}") from None
    finally:
        os.umask(mask)
    return listener


def serve_forever(
    listener: socket.socket, config: CredentialProviderConfig, local: LocalRunner
) -> None:
    """Answer one connection at a time until the process is stopped."""
    while True:
        conn, _ = listener.accept()
        with conn:
            _answer(conn, config, local)
        logs.flush()  # no flusher runs here: each run's line goes out with its answer


def _answer(conn: socket.socket, config: CredentialProviderConfig, local: LocalRunner) -> None:
    try:
        request = _receive(conn, REQUEST_LIMIT, time.monotonic() + _REQUEST_TIMEOUT)
    except (FrameError, OSError) as error:
        logger.warning("plugin host: request dropped", extra={"fields": {"reason": str(error)}})
        return
    name, image = request.get("provider"), request.get("image")
    started = time.monotonic()
    answer = _run(config, local, name, image)
    logger.info(
        "plugin host: ran a plugin",
        extra={
            "fields": {
                "provider": str(name)[:253],
                "exit_status": answer.get("returncode"),
                "failure": answer.get("failure") or answer.get("error"),
                "seconds": round(time.monotonic() - started, 3),
            }
        },
    )
    with contextlib.suppress(OSError):  # the client gave up: its own timeout says so
        conn.settimeout(_REQUEST_TIMEOUT)
        _send(conn, answer)


def _run(
    config: CredentialProviderConfig, local: LocalRunner, name: object, image: object
) -> dict[str, Any]:
    if not (isinstance(name, str) and isinstance(image, str)):
        return {"error": "the plugin host was asked without a provider name and an image"}
    provider = config.providers.get(name)
    if provider is None:
        return {
            "error": f"provider {name[:253]!r} is not in the plugin host's "
            f"credential-provider config (it has: {', '.join(sorted(config.providers)) or 'none'})"
        }
    if not provider.matches(image):
        return {"error": f"image {image[:500]!r} does not match provider {name!r}'s matchImages"}
    try:
        finished = local.run(provider, image)
    except ProviderError as error:
        return {"error": str(error)}
    return {
        "returncode": finished.returncode,
        "failure": finished.failure,
        "stdout": base64.b64encode(finished.stdout).decode(),
        "stderr": base64.b64encode(finished.stderr).decode(),
    }
