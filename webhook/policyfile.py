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


def parse_policy(data: bytes, *, source: str) -> policy.Policy:
    """Decode and validate policy ``data``; ``source`` names it in errors."""
    try:
        document = yaml.safe_load(data)
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
                        version=hashlib.sha256(data).hexdigest()[:12], path=str(path))
