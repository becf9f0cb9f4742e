"""The uvicorn and httptools internals the edge is written against, checked before serving.

:mod:`webhook.edge.protocol` subclasses uvicorn's httptools protocol and
:mod:`webhook.edge.accept` replaces uvicorn's protocol class: both use
names that are no public API and may change in any uvicorn release.
pyproject.toml pins the minor versions they were written against
(:data:`PINNED`); this module lists every such name, so that a server on a
uvicorn that lacks one refuses to start with a message naming it and the
pinned range, instead of failing at its first request. Each use in the
edge says, in a comment, that it is listed here; tests/webhook/test_hooks.py
checks the list against the installed uvicorn and against those uses.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from importlib import metadata
from typing import Any, cast

from mirrorgate.webhook.errors import ConfigError

__all__ = ["HOOKS", "INSTANCE_ATTRIBUTES", "PINNED", "Hook", "check", "missing"]

PINNED = {"uvicorn": ">=0.54,<0.55", "httptools": ">=0.9,<0.10"}
"""The versions the edge is written against: pyproject.toml's specifiers for them."""

_IMPL = "uvicorn.protocols.http.httptools_impl"


@dataclasses.dataclass(frozen=True)
class Hook:
    """A module-level name or a class attribute the edge relies on."""

    module: str
    name: str
    """Dotted within ``module``: ``HttpToolsProtocol._start_asgi_task``."""
    parameters: tuple[str, ...] | None = None
    """A callable's parameter names, in order, where the edge calls it with them."""

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"

    def problem(self) -> str | None:
        """Why this hook is unusable on the installed version, or None."""
        try:
            found: Any = importlib.import_module(self.module)
            for part in self.name.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            return f"{self} is missing"
        if self.parameters is not None:
            names = tuple(inspect.signature(found).parameters)
            if names != self.parameters:
                return f"{self} takes ({', '.join(names)}), not ({', '.join(self.parameters)})"
        return None


HOOKS = (
    # The protocol class the edge subclasses, its constructor and the
    # methods it calls or overrides (the parser calls the on_* ones).
    Hook(
        _IMPL,
        "HttpToolsProtocol.__init__",
        ("self", "config", "server_state", "app_state", "_loop"),
    ),
    Hook(_IMPL, "HttpToolsProtocol._unset_keepalive_if_required", ("self",)),
    Hook(_IMPL, "HttpToolsProtocol._start_asgi_task", ("self", "cycle", "app")),
    Hook(_IMPL, "HttpToolsProtocol.on_message_begin", ("self",)),
    Hook(_IMPL, "HttpToolsProtocol.on_headers_complete", ("self",)),
    Hook(_IMPL, "HttpToolsProtocol.on_body", ("self", "body")),
    Hook(_IMPL, "HttpToolsProtocol.on_message_complete", ("self",)),
    Hook(_IMPL, "HttpToolsProtocol.on_response_complete", ("self",)),
    # The server calls it on every connection at SIGTERM; the edge's keeps idle ones open.
    Hook(_IMPL, "HttpToolsProtocol.shutdown", ("self",)),
    Hook(_IMPL, "STATUS_LINE"),
    # The flow control the edge extends to hold unparsed bytes.
    Hook("uvicorn.protocols.http.flow_control", "HIGH_WATER_LIMIT"),
    Hook("uvicorn.protocols.http.flow_control", "FlowControl.__init__", ("self", "transport")),
    Hook("uvicorn.protocols.http.flow_control", "FlowControl.pause_reading", ("self",)),
    Hook("uvicorn.protocols.http.flow_control", "FlowControl.resume_reading", ("self",)),
    Hook("uvicorn.server", "ServerState"),
    # httptools, driven through uvicorn's parser.
    Hook("httptools", "HttpRequestParser.feed_data"),
    Hook("httptools", "HttpParserError"),
    Hook("httptools", "HttpParserUpgrade"),
)
"""Every module-level name and class attribute of uvicorn and httptools the edge uses
beyond uvicorn's public ``Config``/``Server`` API."""

INSTANCE_ATTRIBUTES = {
    f"{_IMPL}.HttpToolsProtocol": (
        "loop",
        "transport",
        "flow",
        "parser",
        "pipeline",
        "cycle",
        "headers",
        "url",
        "client",
        "scope",
    ),
    f"{_IMPL}.RequestResponseCycle": ("response_complete", "body", "message_event", "keep_alive"),
    "uvicorn.config.Config": ("http_protocol_class",),
}
"""Attributes of uvicorn's objects the edge reads or replaces: the protocol's (``url`` and
``headers`` once a request begins), a request cycle's, and a loaded ``Config``'s (serve
replaces its protocol class with :func:`webhook.edge.accept.protocol_factory`)."""


def _instance_problems() -> list[str]:
    """The :data:`INSTANCE_ATTRIBUTES` that new objects lack (the protocol's first request
    begun)."""
    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
    from uvicorn.server import ServerState

    async def app(scope: object, receive: object, send: object) -> None:
        """Never called: the objects are only built."""

    config = Config(app, log_config=None, lifespan="off")
    config.load()
    # Any loop will do: the protocol only keeps it until a connection arrives.
    protocol = HttpToolsProtocol(config, ServerState(), {}, cast("Any", object()))
    protocol.on_message_begin()
    # Nothing is sent or awaited: the cycle only keeps what it is given.
    parameters = inspect.signature(RequestResponseCycle).parameters
    nothing: dict[str, Any] = dict.fromkeys(parameters)
    cycle = RequestResponseCycle(**nothing)
    built = (protocol, cycle, config)
    return [
        f"{kind}().{name} is missing"
        for (kind, names), instance in zip(INSTANCE_ATTRIBUTES.items(), built, strict=True)
        for name in names
        if not hasattr(instance, name)
    ]


def missing() -> list[str]:
    """What the installed uvicorn and httptools lack of what the edge uses."""
    problems = [problem for hook in HOOKS if (problem := hook.problem()) is not None]
    if not problems:
        problems = _instance_problems()
    return problems


def check() -> None:
    """Raise ConfigError naming each missing hook and the versions the edge needs."""
    problems = missing()
    if problems:
        installed = ", ".join(f"{name} {_version(name)}" for name in PINNED)
        needed = " and ".join(f"{name}{spec}" for name, spec in PINNED.items())
        raise ConfigError(
            f"the HTTP edge cannot run on {installed}: {'; '.join(problems)} "
            f"(mirrorgate is written against {needed})"
        )


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(version unknown)"
