"""Reading a policy file: YAML in, a validated :class:`policy.Policy` out, or one clear error."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib

import yaml

from mirrorgate import policy

__all__ = ["ConfigError", "LoadedPolicy", "read_policy"]


class ConfigError(Exception):
    """A file the operator gave us cannot be used; the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class LoadedPolicy:
    policy: policy.Policy
    version: str
    """sha256 prefix of the file's bytes: what /readyz and the metrics show as live."""
    path: str
    data: bytes = dataclasses.field(default=b"", repr=False)
    """The bytes it was loaded from (kept in the cluster as the last accepted policy)."""


MAX_NODES = 100_000
"""Values a policy document may hold once its aliases are expanded. Real policies hold a
few thousand; a few hundred bytes of nested aliases would otherwise hold billions, and
/validate-policy reads documents from whoever reaches the port."""


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _TooLarge(Exception):
    pass


def _expanded_size(node: yaml.Node, sizes: dict[int, int | None]) -> int:
    """How many values ``node`` stands for, aliases expanded; _TooLarge past MAX_NODES."""
    known = sizes.get(id(node), 0)
    if known is None:  # an alias to a node still being measured: a recursive document
        raise _TooLarge
    if known:
        return known
    sizes[id(node)] = None
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    size = 1
    for child in children:
        size += _expanded_size(child, sizes)
        if size > MAX_NODES:
            raise _TooLarge
    sizes[id(node)] = size
    return size


def _decode(data: bytes, source: str) -> object:
    """yaml.safe_load, refusing a document larger than MAX_NODES once expanded.

    libyaml's parser where PyYAML has it (four times faster: /validate-policy
    reads on a thread that shares the interpreter with admission).
    """
    loader = _LOADER(data)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {})
        return loader.construct_document(node)
    except _TooLarge:
        raise ConfigError(f"{source}: more than {MAX_NODES} values once its aliases are "
                          "expanded; a policy is far smaller") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be a policy") from None
    finally:
        loader.dispose()


def parse_policy(data: bytes, *, source: str) -> policy.Policy:
    """Decode and validate policy ``data``; ``source`` names it in errors."""
    try:
        document = _decode(data, source)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    try:
        return policy.load(document)
    except policy.PolicyError as error:
        lines = "\n".join(f"  {e}" for e in error.errors)
        count = len(error.errors)
        raise ConfigError(f"{source}: invalid policy ({count} "
                          f"error{'s' if count != 1 else ''}):\n{lines}") from None


def read_policy(path: str | pathlib.Path, *, data: bytes | None = None) -> LoadedPolicy:
    """Read (unless ``data`` is given), decode and validate the policy file at ``path``."""
    if data is None:
        try:
            data = pathlib.Path(path).read_bytes()
        except OSError as error:
            raise ConfigError(f"{path}: cannot read policy: {error.strerror}") from None
    return LoadedPolicy(policy=parse_policy(data, source=str(path)),
                        version=hashlib.sha256(data).hexdigest()[:12], path=str(path), data=data)
