"""webhook.edge.hooks: every uvicorn internal the edge uses, named, and present.

The edge subclasses uvicorn's httptools protocol; a uvicorn release may
rename any of what it uses. These tests name each hook (one test id per
hook), check the list against the edge's own source, and show that a server
on a uvicorn without one refuses to start with a message naming it and the
pinned range.
"""

from __future__ import annotations

import ast
import asyncio
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.server import ServerState

from mirrorgate.certs import KeyPair
from mirrorgate.webhook.commands.serve import process, settings, wiring
from mirrorgate.webhook.edge import hooks
from mirrorgate.webhook.errors import ConfigError
from tests.webhook import policies, serving

ROOT = Path(__file__).resolve().parents[2]
EDGE = ROOT / "webhook" / "edge"
PUBLIC = {("uvicorn.config", "Config")}
"""uvicorn names the edge imports that are its documented API."""
ASYNCIO_PROTOCOL = set(dir(asyncio.Protocol))


@pytest.mark.parametrize("hook", hooks.HOOKS, ids=str)
def test_the_installed_uvicorn_has_the_hook(hook: hooks.Hook) -> None:
    assert hook.problem() is None


def test_new_uvicorn_objects_have_the_attributes_the_edge_uses() -> None:
    assert hooks.missing() == []
    hooks.check()


def test_the_pins_are_pyprojects() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    specifiers = {
        requirement.name: str(requirement.specifier)
        for requirement in map(Requirement, pyproject["project"]["dependencies"])
    }
    for name, spec in hooks.PINNED.items():
        assert (
            Requirement(f"{name}{spec}").specifier
            == Requirement(f"{name}{specifiers[name]}").specifier
        ), f"{name}: pyproject.toml says {specifiers[name]}, hooks.PINNED {spec}"


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _own(cls: ast.ClassDef) -> set[str]:
    """What a class of the edge defines itself: its methods and what its __init__ sets."""
    names = {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            names |= {
                target.attr
                for assign in ast.walk(node)
                if isinstance(assign, ast.Assign | ast.AnnAssign)
                for target in (
                    assign.targets if isinstance(assign, ast.Assign) else [assign.target]
                )
                if isinstance(target, ast.Attribute)
            }
    return names - {"__init__"}


def _used(tree: ast.AST, *, names: tuple[str, ...] = ("self",), attribute: str = "") -> set[str]:
    """Attribute names read on ``names`` or, given ``attribute``, on ``self.<attribute>``."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if attribute:
            if isinstance(owner, ast.Attribute) and owner.attr == attribute:
                found.add(node.attr)
        elif isinstance(owner, ast.Name) and owner.id in names:
            found.add(node.attr)
    return found


def _inherited(tree: ast.AST) -> set[str]:
    """What ``super()`` is asked for: the base class's, whether or not overridden here."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "super"
    } - (ASYNCIO_PROTOCOL - {"__init__"})


def _hooked(cls: str) -> set[str]:
    listed = {hook.name.split(".", 1)[1] for hook in hooks.HOOKS if hook.name.startswith(cls)}
    return listed | set(hooks.INSTANCE_ATTRIBUTES.get(f"{httptools_impl.__name__}.{cls}", ()))


def test_every_internal_the_protocol_uses_is_listed() -> None:
    tree = ast.parse((EDGE / "protocol.py").read_text())
    classes = _classes(tree)
    protocol, flow = classes["LimitedHttpProtocol"], classes["_Flow"]
    uvicorns = _used(protocol) - _own(protocol) - ASYNCIO_PROTOCOL | _inherited(protocol)
    assert {"_start_asgi_task", "pipeline", "on_message_complete", "__init__"} <= uvicorns
    assert uvicorns <= _hooked("HttpToolsProtocol"), "unlisted: add them to webhook/edge/hooks.py"
    # Its flow control, as the protocol and the flow itself use it.
    flows = (_used(flow) | _used(protocol, attribute="flow")) - _own(flow) | _inherited(flow)
    assert flows <= _hooked("FlowControl") | {"held"}
    # The acceptor reaches the protocol as ``http``.
    acceptor = _classes(ast.parse((EDGE / "accept.py").read_text()))["TlsAcceptor"]
    accepted = _used(acceptor, names=("http",)) - _own(protocol) - ASYNCIO_PROTOCOL
    assert accepted == {"loop"}
    assert accepted <= _hooked("HttpToolsProtocol")


def test_every_internal_module_name_the_edge_imports_is_listed() -> None:
    listed = {(hook.module, hook.name.split(".")[0]) for hook in hooks.HOOKS}
    for path in sorted(set(EDGE.glob("*.py")) - {EDGE / "hooks.py"}):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] not in ("uvicorn", "httptools"):
                    continue
                for alias in node.names:
                    name = (node.module, alias.name)
                    assert name in listed | PUBLIC, f"{path.name} imports {name}, not listed"


def test_a_missing_hook_is_named_with_the_pinned_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "_start_asgi_task")
    with pytest.raises(ConfigError) as refused:
        hooks.check()
    message = str(refused.value)
    assert (
        "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol._start_asgi_task is missing"
        in message
    )
    assert "uvicorn>=0.54,<0.55 and httptools>=0.9,<0.10" in message
    assert "uvicorn 0.54." in message  # the installed version


def test_a_changed_signature_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(self: object, task: object) -> None:
        """uvicorn's, had it dropped the app argument."""

    monkeypatch.setattr(httptools_impl.HttpToolsProtocol, "_start_asgi_task", start)
    assert hooks.missing() == [
        "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol._start_asgi_task takes"
        " (self, task), not (self, cycle, app)"
    ]


def test_a_missing_instance_attribute_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    created = httptools_impl.HttpToolsProtocol.__init__

    def without_pipeline(
        self: httptools_impl.HttpToolsProtocol,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        created(self, config, server_state, app_state, _loop)
        del self.pipeline

    monkeypatch.setattr(httptools_impl.HttpToolsProtocol, "__init__", without_pipeline)
    assert hooks.missing() == [
        "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol().pipeline is missing"
    ]


def test_the_server_refuses_to_start_without_a_hook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, serving_pair: KeyPair
) -> None:
    """Before it serves: serve makes the protocol factory as it builds uvicorn's config."""
    cert, key = serving.write_pair(tmp_path, serving_pair)
    (tmp_path / "policy.yaml").write_text(policies.POLICY)
    built = wiring.build(
        settings.Settings(
            policy=str(tmp_path / "policy.yaml"), tls_cert=str(cert), tls_key=str(key)
        )
    )
    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "_unset_keepalive_if_required")
    with pytest.raises(ConfigError, match="_unset_keepalive_if_required is missing"):
        process.uvicorn_config(built)
