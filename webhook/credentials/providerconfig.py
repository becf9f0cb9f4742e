"""The kubelet's ``CredentialProviderConfig``, read and validated as the kubelet does.

The same file a node uses (``--image-credential-provider-config``) configures
mirrorgate's ``--credential-provider-config``: ``kubelet.config.k8s.io/v1``
(or ``v1beta1``), a list of exec plugins, each with ``name`` (the file in the
plugin directory), ``matchImages``, ``defaultCacheDuration``, the plugin
protocol's ``apiVersion``, and optional ``args`` and ``env``. The rules are
the kubelet's (``validateCredentialProviderConfig``); unknown fields are
errors, as in the kubelet's strict decoding. Every problem is reported with
its field path: ``providers[0].defaultCacheDuration: Required value``.

``tokenAttributes`` (plugins that want the Pod's service-account token) is
refused: mirrorgate asks for a login on behalf of a namespace, not a Pod.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from pathlib import Path

from mirrorgate import policy
from mirrorgate.policy.durations import parse_duration
from mirrorgate.webhook.policyfile import boundedyaml

__all__ = [
    "CredentialProvider",
    "CredentialProviderConfig",
    "ProviderConfigError",
    "image_matches",
    "load",
    "parse_duration",
    "policy_problems",
]

CONFIG_API_VERSIONS = ("kubelet.config.k8s.io/v1", "kubelet.config.k8s.io/v1beta1")
PLUGIN_API_VERSIONS = (
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
)
_PROVIDER_KEYS = (
    "name",
    "matchImages",
    "defaultCacheDuration",
    "apiVersion",
    "args",
    "env",
    "tokenAttributes",
)
_MAX_BYTES = 1 << 20  # a config file is a few hundred bytes; refuse to parse anything huge


# Go's time.ParseDuration: an optional sign, then one or more decimal numbers with units.
class ProviderConfigError(ValueError):
    """The configuration cannot be used; the message lists every problem with its field path."""


@dataclasses.dataclass(frozen=True)
class CredentialProvider:
    """One exec plugin of the configuration."""

    name: str
    match_images: tuple[str, ...]
    default_cache_duration: float
    """Seconds; used when a response gives no ``cacheDuration``."""
    api_version: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False)
    """Extra environment of the plugin; values may be secrets, so never in repr."""

    def matches(self, image: str) -> bool:
        return any(image_matches(pattern, image) for pattern in self.match_images)


@dataclasses.dataclass(frozen=True)
class CredentialProviderConfig:
    providers: Mapping[str, CredentialProvider]


def _split(url: str) -> tuple[str, str, str] | None:
    """(host, port, path) of a schemeless ``host[:port][/path]``, as the kubelet splits it."""
    if not url or "://" in url or any(c.isspace() for c in url):
        return None
    hostport, slash, path = url.partition("/")
    host, colon, port = hostport.partition(":")
    if not host or (colon and not port.isdigit()):
        return None
    return host, port, slash + path


def image_matches(pattern: str, image: str) -> bool:
    """The kubelet's ``URLsMatch``: globs per host label, the same port, a path prefix."""
    glob, target = _split(pattern), _split(image)
    if glob is None or target is None or glob[1] != target[1]:
        return False
    glob_parts, target_parts = glob[0].split("."), target[0].split(".")
    if len(glob_parts) != len(target_parts):
        return False
    if not all(fnmatch.fnmatchcase(t, g) for g, t in zip(glob_parts, target_parts, strict=True)):
        return False
    return target[2].startswith(glob[2])


class _Errors:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.lines.append(f"{path}: {message}")


def _strings(value: object, path: str, errors: _Errors) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        errors.add(path, "must be a list of strings")
        return ()
    return tuple(value)


def _env(value: object, path: str, errors: _Errors) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        errors.add(path, "must be a list of {name, value}")
        return ()
    pairs = []
    for i, item in enumerate(value):
        if not (
            isinstance(item, dict)
            and set(item) <= {"name", "value"}
            and isinstance(item.get("name"), str)
            and item["name"]
            and isinstance(item.get("value", ""), str)
        ):
            errors.add(f"{path}[{i}]", "must be {name: NAME, value: STRING}")
            continue
        pairs.append((item["name"], item.get("value", "")))
    return tuple(pairs)


def _provider(
    doc: object, where: str, seen: set[str], errors: _Errors
) -> CredentialProvider | None:
    if not isinstance(doc, dict):
        errors.add(where, "must be a mapping")
        return None
    for key in doc:
        if key not in _PROVIDER_KEYS:
            errors.add(
                f"{where}.{key}", f"unknown field (expected one of: {', '.join(_PROVIDER_KEYS)})"
            )
    before = len(errors.lines)
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        errors.add(f"{where}.name", "Required value")
    elif "/" in name:
        errors.add(f"{where}.name", f"Invalid value: {name!r}: provider name cannot contain '/'")
    elif " " in name:
        errors.add(f"{where}.name", f"Invalid value: {name!r}: provider name cannot contain spaces")
    elif name in (".", ".."):
        errors.add(f"{where}.name", f"Invalid value: {name!r}: provider name cannot be {name!r}")
    elif name in seen:
        errors.add(f"{where}.name", f"Duplicate value: {name!r}")
    api_version = doc.get("apiVersion")
    if not api_version:
        errors.add(f"{where}.apiVersion", "Required value")
    elif api_version not in PLUGIN_API_VERSIONS:
        errors.add(
            f"{where}.apiVersion",
            f"Unsupported value: {api_version!r}: supported "
            f"values: {', '.join(PLUGIN_API_VERSIONS)}",
        )
    match_images = _strings(doc.get("matchImages"), f"{where}.matchImages", errors)
    if not match_images:
        errors.add(
            f"{where}.matchImages", "Required value: at least 1 item in matchImages is required"
        )
    for i, pattern in enumerate(match_images):
        if _split(pattern) is None:
            errors.add(
                f"{where}.matchImages[{i}]", f"Invalid value: {pattern!r}: match image is invalid"
            )
    duration = None
    if "defaultCacheDuration" not in doc:
        errors.add(f"{where}.defaultCacheDuration", "Required value")
    else:
        duration = parse_duration(doc["defaultCacheDuration"])
        if duration is None:
            errors.add(
                f"{where}.defaultCacheDuration",
                f"Invalid value: "
                f"{str(doc['defaultCacheDuration'])[:40]!r}: not a duration such as 12h or "
                "90s (at most 2562047h)",
            )
        elif duration < 0:
            errors.add(
                f"{where}.defaultCacheDuration", "Invalid value: must be greater than or equal to 0"
            )
    if doc.get("tokenAttributes") is not None:
        errors.add(
            f"{where}.tokenAttributes",
            "not supported by mirrorgate: it asks for a "
            "namespace's login, not with a Pod's service-account token",
        )
    args = _strings(doc.get("args"), f"{where}.args", errors)
    env = _env(doc.get("env"), f"{where}.env", errors)
    if len(errors.lines) > before or not isinstance(name, str) or duration is None:
        return None
    seen.add(name)
    return CredentialProvider(
        name=name,
        match_images=match_images,
        default_cache_duration=duration,
        api_version=str(api_version),
        args=args,
        env=env,
    )


def parse(document: object, *, source: str) -> CredentialProviderConfig:
    """Validate a decoded document; ProviderConfigError lists every problem."""
    errors = _Errors()
    if not isinstance(document, dict):
        raise ProviderConfigError(f"{source}: must be a CredentialProviderConfig mapping")
    for key in document:
        if key not in ("apiVersion", "kind", "providers"):
            errors.add(key, "unknown field (expected one of: apiVersion, kind, providers)")
    if document.get("kind") != "CredentialProviderConfig":
        errors.add("kind", f"must be CredentialProviderConfig, got {document.get('kind')!r}")
    if document.get("apiVersion") not in CONFIG_API_VERSIONS:
        errors.add(
            "apiVersion",
            f"Unsupported value: {document.get('apiVersion')!r}: "
            f"supported values: {', '.join(CONFIG_API_VERSIONS)}",
        )
    providers_doc = document.get("providers")
    if not isinstance(providers_doc, list) or not providers_doc:
        errors.add("providers", "Required value: at least 1 item in plugins is required")
        providers_doc = []
    seen: set[str] = set()
    providers = {}
    for i, doc in enumerate(providers_doc):
        provider = _provider(doc, f"providers[{i}]", seen, errors)
        if provider is not None:
            providers[provider.name] = provider
    if errors.lines:
        raise ProviderConfigError(f"{source}: " + "; ".join(errors.lines))
    return CredentialProviderConfig(providers=providers)


def load(path: str | Path) -> CredentialProviderConfig:
    """Read and validate the file at ``path`` (YAML or JSON)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_BYTES + 1)
    except OSError as error:
        raise ProviderConfigError(f"{path}: cannot read: {error.strerror}") from None
    if len(data) > _MAX_BYTES:
        raise ProviderConfigError(f"{path}: larger than {_MAX_BYTES} bytes")
    try:
        # Bounded as a policy file is: an alias bomb or deep nesting is refused,
        # naming the line and column, before anything walks it or quotes it.
        documents = boundedyaml.load_all(data, source=str(path))
    except boundedyaml.YAMLError as error:
        raise ProviderConfigError(str(error)) from None
    if len(documents) > 1:
        raise ProviderConfigError(
            f"{path}: {len(documents)} YAML documents; a CredentialProviderConfig is one"
        )
    return parse(documents[0] if documents else None, source=str(path))


def policy_problems(
    config: CredentialProviderConfig, mirror_policy: policy.Policy, *, source: str
) -> list[str]:
    """What in the policy this configuration cannot serve, one line each with its field path.

    A credential's provider must be configured, and every mirror that uses the
    credential must match the provider's ``matchImages``: the plugin is asked
    about an image under it.
    """
    problems = []
    for name, grant in sorted(mirror_policy.grants.items()):
        if grant.provider is None:
            continue
        provider = config.providers.get(grant.provider)
        if provider is None:
            problems.append(f"credentials.{name}.provider: {grant.provider!r} is not in {source}")
            continue
        for rule in mirror_policy.rules:
            if name in rule.credentials and not provider.matches(str(rule.mirror)):
                problems.append(
                    f"{rule.field('mirror')}: {str(rule.mirror)!r} (credential "
                    f"{name!r}) does not match provider {provider.name!r}'s "
                    f"matchImages ({', '.join(provider.match_images)})"
                )
    return problems
