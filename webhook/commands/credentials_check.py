"""``mirrorgate credentials check``: resolve one credential through its source, as serve would.

The answer is what a pull secret made now would hold, less the password:
``{"credential", "source", "registry", "username", "expires"}``, where
``source`` is ``kubernetes``, ``file`` or ``provider``, ``registry`` the key
of the generated ``.dockerconfigjson`` (the policy's scope when it gives
one), and ``expires`` RFC 3339 or null. A source that cannot give a usable
login for the image raises :class:`CheckFailed` with a one-line reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mirrorgate import policy
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.credentials import filestore, kubestore, pluginhost, providerconfig
from mirrorgate.webhook.credentials.provider import ProviderError, ProviderSource
from mirrorgate.webhook.credentials.store import Credential, StoreError, rfc3339
from mirrorgate.webhook.errors import ConfigError

__all__ = ["CheckFailed", "Sources", "admitted_image", "check"]


class CheckFailed(Exception):
    """The source was asked and gave no usable login; the message says why in one line."""


@dataclasses.dataclass(frozen=True)
class Sources:
    """Where a credential may come from: the same choices as ``serve``."""

    store: str | None = None
    """``kubernetes`` or ``file``; default: file with store_file, else kubernetes."""
    store_file: str | None = None
    key: Callable[[], bytes] | None = None
    """The file store's key, read only when the file store is used."""
    kube: Callable[[], kube.Kube] | None = None
    namespace: str = "mirrorgate"
    provider_config: str | None = None
    provider_bin_dir: str | None = None
    provider_socket: str | None = None
    provider_timeout: float = 10.0


def _from_provider(name: str, provider: str, image: str, sources: Sources) -> Credential:
    if sources.provider_config is None or (
        sources.provider_bin_dir is None and sources.provider_socket is None
    ):
        raise StoreError(
            f"credential {name!r} comes from provider {provider!r}: pass "
            "--credential-provider-config and --credential-provider-socket "
            "(or --credential-provider-bin-dir)"
        )
    try:
        config = providerconfig.load(sources.provider_config)
        runner = pluginhost.runner(
            bin_dir=sources.provider_bin_dir,
            socket_path=sources.provider_socket,
            timeout=sources.provider_timeout,
        )
    except (providerconfig.ProviderConfigError, ConfigError) as error:
        raise StoreError(str(error)) from None
    source = ProviderSource(config, runner)
    try:
        return source.login(name, provider, image)
    except ProviderError as error:
        raise CheckFailed(str(error)) from None


def _from_store(name: str, sources: Sources) -> tuple[str, Credential]:
    kind = sources.store or ("file" if sources.store_file else "kubernetes")
    if kind == "file":
        if sources.store_file is None or sources.key is None:
            raise StoreError("--store file needs --store-file FILE")
        found = filestore.read_store(sources.store_file, sources.key()).credentials.get(name)
        if found is None:
            raise CheckFailed(f"no credential {name!r} in {sources.store_file}")
        return kind, found
    if kind != "kubernetes" or sources.kube is None:
        raise StoreError(f"--store {kind!r}: expected kubernetes or file")
    try:
        client = sources.kube()
    except kube.KubeError as error:
        raise StoreError(error.message) from None
    try:
        secret = client.get(kube.secrets_path(sources.namespace, name))
    except kube.NotFound:
        raise CheckFailed(f"no Secret {sources.namespace}/{name} in the credential store") from None
    except kube.KubeError as error:
        raise CheckFailed(f"cannot read Secret {sources.namespace}/{name}: {error}") from None
    try:
        return kind, kubestore.credential_from_secret(secret, sources.namespace, name)
    except StoreError as error:
        raise CheckFailed(str(error)) from None


def admitted_image(name: str, image: str, mirror_policy: policy.Policy) -> str:
    """``image`` as admission would write it: a source image through its rule's mirror.

    An image already on a mirror, or that no rule rewrites, is checked as given; of a
    rule's several mirrors, the first whose credential is ``name``. CheckFailed when
    no mirror of the rule that rewrites it uses ``name``.
    """
    found = mirror_policy.resolve(image)
    if found.outcome != "rewrite" or found.rule is None or found.new_image is None:
        return image
    # Under onNotGranted: next, a broader rule of the chain may be the one that uses it;
    # of a rule's several mirrors, the first that does.
    link: policy.Resolution | None = found
    while link is not None:
        if link.rule is not None and link.new_image is not None:
            mirrors = ((link.rule, link.new_image), *link.standbys)
            for rule, new_image in mirrors:
                if name in rule.credentials:
                    return new_image
        link = link.broader
    names = found.rule.credentials
    uses = (
        "no credential"
        if not names
        else f"credential {names[0]!r}"
        if len(names) == 1
        else f"credentials {', '.join(map(repr, names))}"
    )
    raise CheckFailed(
        f"image {image!r} is rewritten by {found.rule.label} to "
        f"{found.new_image!r}, which uses {uses}, not {name!r}"
    )


def check(
    name: str, image: str, *, mirror_policy: policy.Policy | None, sources: Sources
) -> dict[str, Any]:
    """Resolve ``name`` for ``image``; StoreError for configuration, CheckFailed for the source."""
    grant = mirror_policy.grants.get(name) if mirror_policy is not None else None
    if grant is not None and grant.provider is not None:
        source, login = "provider", _from_provider(name, grant.provider, image, sources)
    else:
        source, login = _from_store(name, sources)
    if grant is not None and grant.registry is not None:
        login = dataclasses.replace(login, registry=str(grant.registry))
    if not providerconfig.image_matches(login.registry, image):
        raise CheckFailed(
            f"credential {name!r} is for {login.registry}, which does not cover "
            f"image {image!r}: the kubelet would not send it"
        )
    if login.expired():
        assert login.expires is not None
        raise CheckFailed(f"credential {name!r} expired at {rfc3339(login.expires)}")
    return {
        "credential": name,
        "source": source,
        "registry": login.registry,
        "username": login.username,
        "expires": rfc3339(login.expires) if login.expires else None,
    }
