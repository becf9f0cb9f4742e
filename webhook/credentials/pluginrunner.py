"""Where a credential-provider plugin runs, and with what environment.

A plugin runs either here (:class:`LocalRunner`: the binary in a directory of
this container) or in the plugin host (:class:`~webhook.credentials.pluginhost.HostClient`:
``mirrorgate plugin-host`` in a container of its own, which runs a
:class:`LocalRunner` there). Both hand back the plugin's raw output;
:class:`~webhook.credentials.provider.ProviderSource` redacts and reads it, the
same way whichever ran it.

The environment is an allow-list, never this process's whole environment: the
names a plugin needs to reach its cloud (proxies, the trust store, locale,
time zone, and the ``AWS_``, ``AZURE_`` and ``GOOGLE_`` families that the
clouds' identity webhooks inject), then the provider's own ``env`` from the
CredentialProviderConfig. The kubelet passes its whole environment; we do not,
because ours holds the API server's address (``KUBERNETES_*``), the store key
and whatever an operator added for mirrorgate alone. An environment variable
is not the only way to the ServiceAccount token: a plugin run here can still
read the token file, which is why the chart runs plugins in the plugin host,
whose container has no token of the API server's mounted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import orjson

from mirrorgate.webhook.credentials import pluginprocess
from mirrorgate.webhook.credentials.providerconfig import CredentialProvider

__all__ = [
    "ALLOWED_ENV",
    "ALLOWED_ENV_PREFIXES",
    "STDERR_LIMIT",
    "STDOUT_LIMIT",
    "LocalRunner",
    "PluginRunner",
    "ProviderError",
    "plugin_env",
    "plugin_request",
]

STDOUT_LIMIT = 1 << 20
STDERR_LIMIT = 8 << 10
ALLOWED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "TZ",
        "LANG",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
    }
)
"""Names passed on to a plugin as they are."""
ALLOWED_ENV_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "LC_")
"""Families passed on to a plugin: the clouds' identity and region settings, and locale."""


class ProviderError(Exception):
    """The plugin gave no usable login; the message says why in one line, with no secret."""


def plugin_env(environ: Mapping[str, str], provider: CredentialProvider) -> dict[str, str]:
    """The allow-listed part of ``environ``, then the provider's own ``env`` over it."""
    env = {
        name: value
        for name, value in environ.items()
        if name in ALLOWED_ENV or name.startswith(ALLOWED_ENV_PREFIXES)
    }
    env.update(provider.env)
    return env


def plugin_request(provider: CredentialProvider, image: str) -> bytes:
    """The ``CredentialProviderRequest`` a plugin reads on standard input."""
    return orjson.dumps(
        {"apiVersion": provider.api_version, "kind": "CredentialProviderRequest", "image": image}
    )


class PluginRunner(Protocol):
    """Runs one provider's plugin for one image; raises :class:`ProviderError` when it cannot."""

    @property
    def timeout(self) -> float:
        """Seconds after which a run is killed."""

    def run(self, provider: CredentialProvider, image: str) -> pluginprocess.Finished: ...


@dataclasses.dataclass(frozen=True)
class LocalRunner:
    """Runs ``<bin_dir>/<provider name>`` in this container, as the kubelet runs it."""

    bin_dir: str | Path
    timeout: float = 10.0

    def run(self, provider: CredentialProvider, image: str) -> pluginprocess.Finished:
        binary = Path(self.bin_dir) / provider.name
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise ProviderError(f"plugin {str(binary)!r} is not an executable file")
        try:
            return pluginprocess.run(
                [str(binary), *provider.args],
                plugin_env(os.environ, provider),
                plugin_request(provider, image),
                timeout=self.timeout,
                stdout_limit=STDOUT_LIMIT,
                stderr_limit=STDERR_LIMIT,
            )
        except OSError as error:
            raise ProviderError(
                f"plugin {provider.name!r} could not start: {error.strerror}"
            ) from None
