"""`mirrorgate serve`'s settings, each declared once: name, type, default, flag and help.

A :class:`Settings` field is the declaration: its annotation is the type, its default the
default, and its :class:`Flag` (in the field's metadata) how the command line gives it. The
argparse options (:func:`add_flags`), the value built from parsed arguments
(:meth:`Settings.from_args`) and the table in docs/cli.md (:mod:`.flagtable`) all come
from there. The server's limits are a :class:`~mirrorgate.webhook.edge.limits.Limits`:
their names, types and defaults are that dataclass's fields, and :data:`LIMIT_FLAGS` adds
each one's help. Values are checked where they are used (the port by argparse, the limits
by :meth:`Limits.problems`, the rest by the composition root), each in one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from mirrorgate.webhook.edge.limits import Limits

__all__ = [
    "GROUPS",
    "LIMIT_FLAGS",
    "SOURCE_FLAGS",
    "Flag",
    "Option",
    "Settings",
    "action",
    "add_flag",
    "add_flags",
    "options",
]


def tcp_port(text: str) -> int:
    """A TCP port to listen on, 1-65535, or 0 for any free one (bind would raise, not say)."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port {number} is outside 1-65535 (0: any free port)")
    return number


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flag:
    """How the command line gives one setting."""

    group: str
    """The heading of ``serve --help`` it is listed under (a key of :data:`GROUPS`)."""
    help: str | None = None
    """argparse's help, ``%(default)s`` and all: the text ``serve --help`` prints."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    """What turns the text into the value, when the field's type alone does not say."""
    required: bool = False
    negated: bool = False
    """A boolean given as its negation (``--no-health-probes``): present, it is False."""
    flag: str | None = None
    """The option, when it is not the setting's name (``--no-`` and the name, negated)."""


GROUPS: Mapping[str, str | None] = {
    "admission": None,
    "certificates": "either files (--tls-cert, --tls-key) or a Secret (--tls-secret)",
    "cluster and credentials": None,
    "kubelet credentials": "secretless pulls: the login for a Pod's mirror, asked for by the "
    "node's kubelet through mirrorgate-credential-provider (docs/install.md)",
    "limits": "what any client may make the server hold (see docs/security.md)",
}
"""The headings of ``serve --help``, in order, with their descriptions."""


def _flag(group: str, default: Any = dataclasses.MISSING, **flag: Any) -> Any:
    """A :class:`Settings` field with a default and a :class:`Flag` under ``group``."""
    return dataclasses.field(default=default, metadata={"flag": Flag(group=group, **flag)})


_admission = functools.partial(_flag, "admission")
_tls = functools.partial(_flag, "certificates")
_cluster = functools.partial(_flag, "cluster and credentials")
_kubelet = functools.partial(_flag, "kubelet credentials")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything `mirrorgate serve` is told; fields in the order ``serve --help`` lists them."""

    policy: str | None = _admission(
        None,
        metavar="FILE",
        help="the policy YAML, reloaded when it changes; required without a cluster. In a "
        "cluster the ClusterMirrorPolicy and MirrorPolicy objects are the policy, and this "
        "file (the ConfigMap policy, deprecated) is served beside them",
    )
    audit_only: bool = _admission(
        False,
        help="every endpoint only reports, whatever the namespace labels: "
        "a cluster-wide report-only override (a safe first install)",
    )
    host: str = _admission("127.0.0.1", help="listen address (default: %(default)s)")
    port: int = _admission(
        8443,
        parse=tcp_port,
        help="the admission port: /mutate, /audit, /validate-policy, /healthz and /readyz "
        "(default: %(default)s)",
    )
    metrics_port: int | None = _admission(
        None,
        parse=tcp_port,
        metavar="PORT",
        help="serve /metrics and the detailed /readyz (its problems name mirrors and "
        "credentials) on this port instead, over TLS with the same certificate and no "
        "client certificate; the admission port's /readyz then says only ready or not",
    )
    reload_interval: float = _admission(
        1.0,
        metavar="SECONDS",
        help="how often to check the policy, certificate and store files (default: %(default)s)",
    )
    log_level: str = _admission("info", choices=("debug", "info", "warning", "error"))
    health_probes: bool = _admission(
        True,
        negated=True,
        help="do not probe mirrors and credential logins (every mirror "
        "counts as up); the store is still checked against the policy",
    )
    mirror_ca: str | None = _admission(
        None,
        metavar="FILE",
        help="a PEM bundle of the private CAs your mirrors' certificates chain to: the "
        "health probes trust it beside the system store (a rule's caFile replaces "
        "both); reloaded when it changes",
    )

    tls_cert: str | None = _tls(None, metavar="FILE", help="serving certificate (PEM)")
    tls_key: str | None = _tls(None, metavar="FILE", help="its private key (PEM)")
    client_ca: str | None = _tls(
        None,
        metavar="FILE",
        help="the admission port completes a TLS handshake only with a client certificate "
        "from this CA (PEM): the API server's, from its AdmissionConfiguration; reloaded "
        "when it changes",
    )
    tls_secret: str | None = _tls(
        None,
        metavar="NAME",
        help="keep a CA and serving certificate in this Secret of mirrorgate's "
        "namespace, created and renewed as needed",
    )
    ca_secret: str = _tls(
        "mirrorgate-ca",
        metavar="NAME",
        help="with --tls-secret: keep the CA and its key in this Secret of its own, "
        "apart from the serving pair (default: %(default)s)",
    )
    ca_configmap: str = _tls(
        "mirrorgate-ca",
        metavar="NAME",
        help="with --tls-secret: publish the CA certificate (no key) in this ConfigMap, "
        "for Prometheus and other clients (default: %(default)s)",
    )
    service: str = _tls(
        "mirrorgate",
        metavar="NAME",
        help="with --tls-secret: the Service the certificate is for (default: %(default)s)",
    )
    webhook_configuration: str | None = _tls(
        None,
        flag="--webhook-config",
        metavar="NAME",
        help="with --tls-secret: keep the caBundle of the Mutating- and the "
        "ValidatingWebhookConfiguration of this name in step with the CA",
    )
    tls_names: tuple[str, ...] = _tls(
        (),
        flag="--tls-name",
        metavar="NAME",
        help="with --tls-secret: an extra DNS name or IP for the serving certificate (repeatable)",
    )
    tls_dir: str | None = _tls(
        None,
        metavar="DIR",
        help="with --tls-secret: where the serving files are written (default: a temporary folder)",
    )
    cert_check_interval: float = _tls(
        300.0,
        metavar="SECONDS",
        help="with --tls-secret: how often the certificates are checked (default: %(default)s)",
    )

    kubeconfig: str | None = _cluster(
        None,
        metavar="FILE",
        help="kubeconfig for the cluster (default: the in-cluster service "
        "account when in a Pod, else standalone: no pull secrets)",
    )
    kube_context: str | None = _cluster(
        None, flag="--context", metavar="CONTEXT", help="kubeconfig context"
    )
    namespace: str | None = _cluster(
        None,
        metavar="NAMESPACE",
        help="mirrorgate's own namespace (credential Secrets, "
        "the Lease; default: the Pod's namespace, else 'mirrorgate')",
    )
    store: str | None = _cluster(
        None,
        choices=("kubernetes", "file", "none"),
        help="credential store (default: kubernetes with a cluster, file "
        "with --store-file, else none)",
    )
    store_file: str | None = _cluster(
        None, metavar="FILE", help="the encrypted credential store file"
    )
    store_key_file: str | None = _cluster(
        None,
        flag="--key-file",
        metavar="FILE",
        help="file holding the store key (default: $MIRRORGATE_STORE_KEY)",
    )
    credential_provider_config: str | None = _cluster(
        None,
        metavar="FILE",
        help="the kubelet's CredentialProviderConfig, for policy credentials with a provider",
    )
    credential_provider_bin_dir: str | None = _cluster(
        None, metavar="DIR", help="where the credential-provider plugins are, to run them here"
    )
    credential_provider_socket: str | None = _cluster(
        None,
        metavar="PATH",
        help="the socket of `mirrorgate plugin-host`, to run the plugins in its container "
        "instead (no token of mirrorgate's there)",
    )
    credential_provider_timeout: float = _cluster(
        10.0, metavar="SECONDS", help="a plugin running longer is killed (default: %(default)s)"
    )
    # Keep it well inside the webhook's timeoutSeconds: the API server gives up first.
    credential_deadline: float = _cluster(
        2.0,
        metavar="SECONDS",
        help="longest time admission spends making pull secrets (default: %(default)s)",
    )
    reconcile_interval: float = _cluster(
        30.0,
        metavar="SECONDS",
        help="how often the leader re-asserts every generated pull secret, "
        "bringing back deleted ones (default: %(default)s)",
    )

    kubelet_port: int | None = _kubelet(
        None,
        parse=tcp_port,
        metavar="PORT",
        help="serve POST /kubelet-credentials on this port, over TLS with the serving "
        "certificate, to callers with a kubelet's client certificate only",
    )
    kubelet_client_ca: str | None = _kubelet(
        None,
        metavar="FILE",
        help="the CA (PEM) of the kubelets' client certificates (default: the API server's "
        "client-ca-file, from ConfigMap kube-system/extension-apiserver-authentication)",
    )
    kubelet_audience: str = _kubelet(
        "mirrorgate",
        metavar="AUDIENCE",
        help="the audience of the Pods' tokens, the kubelet's tokenAttributes."
        "serviceAccountTokenAudience (default: %(default)s)",
    )
    kubelet_cache_duration: float = _kubelet(
        300.0,
        metavar="SECONDS",
        help="how long a kubelet keeps a login (cacheDuration): bounds how long a node keeps "
        "using a rotated or revoked login (default: %(default)s)",
    )

    limits: Limits = dataclasses.field(default_factory=Limits)
    """Connections, request heads, read timeouts and buffered bodies (:data:`LIMIT_FLAGS`)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        """The settings :func:`add_flags` parsed into ``args``."""
        values: dict[str, Any] = {
            name: tuple(value) if action(option) == "append" else value
            for name, option in options().items()
            for value in [getattr(args, name)]
        }
        limits = Limits(**{name: values.pop(name) for name in LIMIT_FLAGS})
        return cls(**values, limits=limits)


LIMIT_FLAGS: Mapping[str, str] = {
    "max_connections": "open connections, TLS handshakes included; over it, the least "
    "recently active connection not being answered is closed",
    "max_header_bytes": "request line and header fields (431 beyond)",
    "max_headers": "header fields per request (431 beyond)",
    "header_timeout": "from accept (TLS handshake included), or from a request's first byte, "
    "to the end of its head",
    "body_timeout": "from the end of a request's head to the end of its body",
    "idle_timeout": "how long a keep-alive connection may wait for its next request",
    "max_buffered_bytes": "request-body bytes held at once across all connections; over it, "
    "clients that do not read their answers or that pipeline are closed first, then the "
    "longest-running body reads",
    "max_containers": "images of one Pod (containers and image volumes) that admission "
    "checks; a Pod with more is refused in an enforce namespace, reported in an audit one",
    "write_timeout": "how long an answer may wait for a client that does not read it",
    "max_unsent_bytes": "answer bytes held at once across all connections for clients that do "
    "not read them; over it, the connection that stopped reading first is closed",
    "max_pipelined": "requests of a connection read ahead of the one being answered; the rest "
    "waits unread",
}
"""Each limit's help. Its flag is its field name as an option (``--max-headers``), its metavar
what it counts: SECONDS for a timeout, BYTES for a size, COUNT for containers, else N."""

SOURCE_FLAGS = (
    "kubeconfig",
    "kube_context",
    "namespace",
    "store",
    "store_file",
    "store_key_file",
    "credential_provider_config",
    "credential_provider_bin_dir",
    "credential_provider_socket",
    "credential_provider_timeout",
)
"""Where credentials come from: `credentials check` takes these too, to resolve as serve does."""


def _flagged(cls: type[Settings] = Settings) -> Iterator[dataclasses.Field[Any]]:
    return (f for f in dataclasses.fields(cls) if "flag" in f.metadata)


@dataclasses.dataclass(frozen=True)
class Option:
    """One serve option: its setting's name, flag, type and default (a field or a limit)."""

    name: str
    declared: Flag
    kind: type
    default: Any

    @property
    def flag(self) -> str:
        dashed = self.name.replace("_", "-")
        return self.declared.flag or (f"--no-{dashed}" if self.declared.negated else f"--{dashed}")


def options() -> dict[str, Option]:
    """Every serve option by setting name: the Settings fields', then the limits'."""
    hints = typing.get_type_hints(Settings)
    options = {
        f.name: Option(f.name, f.metadata["flag"], hints[f.name], f.default) for f in _flagged()
    }
    limit_hints, defaults = typing.get_type_hints(Limits), Limits()
    for name, text in LIMIT_FLAGS.items():
        kind = limit_hints[name]
        metavar = _limit_metavar(name, kind)
        flag = Flag(group="limits", metavar=metavar, help=f"{text} (default: %(default)s)")
        options[name] = Option(name, flag, kind, getattr(defaults, name))
    return options


def _limit_metavar(name: str, kind: type) -> str:
    if kind is float:
        return "SECONDS"
    if name.endswith("_bytes"):
        return "BYTES"
    return "COUNT" if name == "max_containers" else "N"


def action(option: Option) -> Literal["store_true", "store_false", "append", "store"]:
    if option.kind is bool:
        return "store_false" if option.declared.negated else "store_true"
    return "append" if typing.get_origin(option.kind) is tuple else "store"


def add_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    *,
    dest: str | None = None,
    flag: str | None = None,
    text: str | None = None,
    **overrides: Any,
) -> None:
    """The option for setting ``name`` (a Settings field or a limit) on ``parser``.

    The other commands that take a setting of serve's name it here, so that it stays one
    declaration: ``dest``, ``flag``, ``text`` (the help), ``choices`` or ``required`` differ where
    their meaning does (`policy check --store FILE` is serve's ``--store-file``).
    """
    option = options()[name]
    declared = option.declared
    how = action(option)
    keywords: dict[str, Any] = {"dest": dest or name, "help": text or declared.help}
    if how == "store":
        kind = declared.parse or (option.kind if option.kind in (int, float) else None)
        keywords |= {"default": option.default, "metavar": declared.metavar}
        if kind is not None:
            keywords["type"] = kind
        if declared.choices is not None:
            keywords["choices"] = declared.choices
        if declared.required:
            keywords["required"] = True
    elif how == "append":
        keywords |= {"default": [], "metavar": declared.metavar}
    parser.add_argument(flag or option.flag, action=how, **(keywords | overrides))


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every serve option, under the headings of :data:`GROUPS`, in declaration order."""
    every = options()
    for heading, description in GROUPS.items():
        group = parser.add_argument_group(heading, description)
        for name, option in every.items():
            if option.declared.group == heading:
                add_flag(group, name)
