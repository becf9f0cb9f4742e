"""Reading a policy file: YAML in, a validated :class:`policy.Policy` out, or one clear error."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib

from mirrorgate import policy
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.policyfile import boundedyaml

__all__ = [
    "MAX_POLICY_BYTES",
    "LoadedPolicy",
    "read_policy",
    "read_policy_bytes",
]

MAX_POLICY_BYTES = 1 << 20
"""A ConfigMap holds at most 1 MiB: a policy file larger than that was not mounted from one."""
MAX_ERRORS_SHOWN = 50
"""Problems listed in one error; a policy with more gets a count of the rest."""


@dataclasses.dataclass(frozen=True)
class LoadedPolicy:
    policy: policy.Policy
    version: str
    """sha256 prefix of the file's bytes: what /readyz and the metrics show as live."""
    path: str
    data: bytes = dataclasses.field(default=b"", repr=False)
    """The bytes it was loaded from (kept in the cluster as the last accepted policy)."""


def parse_policy(data: bytes, *, source: str) -> policy.Policy:
    """Decode and validate policy ``data``; ``source`` names it in errors."""
    if len(data) > MAX_POLICY_BYTES:
        raise ConfigError(
            f"{source}: larger than {MAX_POLICY_BYTES:,} bytes; a policy is at "
            "most that (a ConfigMap's limit)"
        )
    try:
        documents = boundedyaml.load_all(data, source=source)
    except boundedyaml.YAMLError as error:
        raise ConfigError(str(error)) from None
    if len(documents) > 1:
        raise ConfigError(f"{source}: {len(documents)} YAML documents; a policy is one")
    try:
        return policy.load(documents[0] if documents else None)
    except policy.PolicyError as error:
        count = len(error.errors) + error.omitted
        shown = error.errors[:MAX_ERRORS_SHOWN]
        more = count - len(shown)
        lines = "\n".join(
            [*(f"  {e}" for e in shown), *([f"  … and {more:,} more"] if more else [])]
        )
        raise ConfigError(
            f"{source}: invalid policy ({count:,} error{'s' if count != 1 else ''}):\n{lines}"
        ) from None


def read_policy_bytes(path: str | pathlib.Path) -> bytes:
    """The policy file's bytes, up to one past :data:`MAX_POLICY_BYTES` (which
    :func:`parse_policy` refuses): a file of gigabytes is never read whole."""
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_POLICY_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read policy: {error.strerror}") from None


def read_policy(path: str | pathlib.Path, *, data: bytes | None = None) -> LoadedPolicy:
    """Read (unless ``data`` is given), decode and validate the policy file at ``path``."""
    if data is None:
        data = read_policy_bytes(path)
    return LoadedPolicy(
        policy=parse_policy(data, source=str(path)),
        version=hashlib.sha256(data).hexdigest()[:12],
        path=str(path),
        data=data,
    )
