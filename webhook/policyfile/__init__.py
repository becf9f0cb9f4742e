"""Reading a policy file: YAML in, a validated :class:`policy.Policy` out, or one clear error.

A file is either a policy document (today's format) or any number of
ClusterMirrorPolicy and MirrorPolicy documents, which are composed
(:func:`policy.compose`) as the cluster would: every object must be accepted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
from collections.abc import Mapping, Sequence

from mirrorgate import policy
from mirrorgate.policy import Policy
from mirrorgate.policy.composition import Composition
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.policyfile import boundedyaml

__all__ = [
    "MAX_POLICY_BYTES",
    "LoadedPolicy",
    "parse_composition",
    "parse_policy",
    "read_policy",
    "read_policy_bytes",
    "undecided",
]

MAX_POLICY_BYTES = 1 << 20
"""A ConfigMap holds at most 1 MiB: a policy file larger than that was not mounted from one."""
MAX_ERRORS_SHOWN = 50
"""Problems listed in one error; a policy with more gets a count of the rest."""


@dataclasses.dataclass(frozen=True)
class LoadedPolicy:
    policy: policy.Policy
    """The cluster's policy: a namespace's is :meth:`policy.Composition.policy_for`."""
    composition: Composition
    version: str
    """sha256 prefix of the file's bytes: what /readyz and the metrics show as live."""
    path: str
    data: bytes = dataclasses.field(default=b"", repr=False)
    """The bytes it was loaded from (kept in the cluster as the last accepted policy)."""

    def policy_for(self, namespace: str) -> Policy:
        """The policy admission plans ``namespace``'s Pods with."""
        return self.composition.policy_for(namespace)


def _invalid(source: str, errors: Sequence[str], omitted: int = 0) -> ConfigError:
    count = len(errors) + omitted
    shown = errors[:MAX_ERRORS_SHOWN]
    more = count - len(shown)
    lines = "\n".join([*(f"  {e}" for e in shown), *([f"  … and {more:,} more"] if more else [])])
    return ConfigError(
        f"{source}: invalid policy ({count:,} error{'s' if count != 1 else ''}):\n{lines}"
    )


def _objects(documents: Sequence[object], source: str) -> list[policy.PolicyObject]:
    found: dict[policy.ObjectKey, policy.PolicyObject] = {}
    errors: list[str] = []
    for i, document in enumerate(documents):
        where = f"document {i + 1}"
        if not policy.is_policy_object(document):
            errors.append(
                f"{where}: not a ClusterMirrorPolicy or MirrorPolicy: a file holds one "
                "policy document, or only objects"
            )
            continue
        try:
            obj = policy.parse_object(document, namespace=policy.DEFAULT_OBJECT_NAMESPACE)
        except policy.PolicyError as error:
            errors.extend(f"{where}: {e}" for e in error.errors)
            continue
        if obj.key in found:
            errors.append(
                f"{where}: {obj.key} is already document {list(found).index(obj.key) + 1}"
            )
        found[obj.key] = obj
    if errors:
        raise _invalid(source, errors)
    return list(found.values())


def undecided(
    key: policy.ObjectKey,
    verdict: policy.Verdict,
    namespace_labels: Mapping[str, Mapping[str, str]] | None,
) -> bool:
    """Whether a refusal is only for want of the namespace's labels, which a file read
    offline does not have: a MirrorPolicy granted by namespaceSelector is not refused
    then (its rules do not apply), only said (``policy check``)."""
    return verdict.reason == "NotGranted" and key.namespace not in (namespace_labels or {})


def parse_composition(
    data: bytes,
    *,
    source: str,
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> policy.Composition:
    """Decode and validate policy ``data`` (a policy document, or the objects); ``source``
    names it in errors. ``namespace_labels`` are the namespaces' labels, for
    MirrorPolicies granted by ``namespaceSelector``: a namespace without them may
    have MirrorPolicies that are not in force (:func:`undecided`)."""
    if len(data) > MAX_POLICY_BYTES:
        raise ConfigError(
            f"{source}: larger than {MAX_POLICY_BYTES:,} bytes; a policy is at "
            "most that (a ConfigMap's limit)"
        )
    try:
        documents = boundedyaml.load_all(data, source=source)
    except boundedyaml.YAMLError as error:
        raise ConfigError(str(error)) from None
    if any(policy.is_policy_object(d) for d in documents):
        # Objects as kubectl takes them: an empty document between two is no object.
        objects = _objects([d for d in documents if d is not None], source)
        composition = policy.compose(objects, namespace_labels)
        refused = [
            f"{key}: {line}"
            for key, verdict in composition.refused.items()
            if not undecided(key, verdict, namespace_labels)
            for line in verdict.message.splitlines()
        ]
        if refused:
            raise _invalid(source, refused)
        return composition
    if len(documents) > 1:
        raise ConfigError(f"{source}: {len(documents)} YAML documents; a policy is one")
    try:
        return policy.from_policy(policy.load(documents[0] if documents else None))
    except policy.PolicyError as error:
        raise _invalid(source, [str(e) for e in error.errors], error.omitted) from None


def parse_policy(data: bytes, *, source: str) -> policy.Policy:
    """The policy document ``data`` holds (a ConfigMap's): objects are not one."""
    composition = parse_composition(data, source=source)
    if composition.verdicts:
        raise ConfigError(
            f"{source}: holds ClusterMirrorPolicy or MirrorPolicy objects, not a policy "
            "document; apply them to the cluster as objects"
        )
    return composition.cluster


def read_policy_bytes(path: str | pathlib.Path) -> bytes:
    """The policy file's bytes, up to one past :data:`MAX_POLICY_BYTES` (which
    :func:`parse_policy` refuses): a file of gigabytes is never read whole."""
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_POLICY_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read policy: {error.strerror}") from None


def read_policy(
    path: str | pathlib.Path,
    *,
    data: bytes | None = None,
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> LoadedPolicy:
    """Read (unless ``data`` is given), decode and validate the policy file at ``path``."""
    if data is None:
        data = read_policy_bytes(path)
    composition = parse_composition(data, source=str(path), namespace_labels=namespace_labels)
    return LoadedPolicy(
        policy=composition.cluster,
        composition=composition,
        version=hashlib.sha256(data).hexdigest()[:12],
        path=str(path),
        data=data,
    )
