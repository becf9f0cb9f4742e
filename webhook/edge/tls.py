"""TLS for the server: 1.2 or newer, callers' certificates checked, and files that rotate
without a restart.

uvicorn loads its certificate once. Each listener's base context carries an
SNI callback that hands every new handshake the most recently loaded
context of its kind, so a renewed certificate (or client CA) on disk serves
new connections within a poll interval while connections already open keep
theirs. OpenSSL calls the callback whether or not the client sends SNI,
which the API server does not do when the webhook URL is an IP address. The
swapped context brings its own trust store; whether a client certificate is
required stays the base context's (OpenSSL copies the verify mode once, when
the connection is made), and never changes while the server runs.

Three kinds: the admission listener's, which with a client CA (``serve
--client-ca``) completes no handshake without a certificate from that CA (the
API server's, from its AdmissionConfiguration), and the metrics listener's
(``serve --metrics-port``), the same serving certificate without client
authentication (Prometheus and the kubelet's probes present none), and the kubelet credential
listener's (``serve --kubelet-port``), which completes no handshake without a
kubelet's client certificate (``serve --kubelet-client-ca``).
"""

from __future__ import annotations

import ssl

from mirrorgate.webhook.errors import ConfigError, why_unreadable

__all__ = ["CertificateReloader", "server_context"]


def server_context(cert_file: str, key_file: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server context for ``cert_file``/``key_file``, requiring a client certificate
    from ``client_ca`` when given; ConfigError names a bad file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    for path in (cert_file, key_file, *([client_ca] if client_ca else [])):
        # ssl's own OSError does not say which of the files it is about.
        problem = why_unreadable(path)
        if problem is not None:
            raise ConfigError(f"{path}: {problem}")
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as error:
        raise ConfigError(
            f"{cert_file} / {key_file}: not a usable certificate and key ({error.reason or error})"
        ) from None
    except OSError as error:
        raise ConfigError(f"{error.filename or cert_file}: {error.strerror}") from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, ValueError) as error:
            reason = getattr(error, "reason", None) or error
            raise ConfigError(f"{client_ca}: not a PEM CA certificate ({reason})") from None
        if not context.get_ca_certs():
            raise ConfigError(f"{client_ca}: holds no CA certificate")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class _Kind:
    """One listener's contexts: the base it was built with, and the newest loaded."""

    def __init__(self, cert_file: str, key_file: str, client_ca: str | None) -> None:
        self.current = server_context(cert_file, key_file, client_ca)
        self.base = server_context(cert_file, key_file, client_ca)
        self.base.sni_callback = self._select

    def _select(
        self,
        connection: ssl.SSLObject | ssl.SSLSocket,
        server_name: str | None,
        base: ssl.SSLContext,
    ) -> None:
        current = self.current
        if current is not base:
            connection.context = current


class CertificateReloader:
    """Holds the live server contexts and swaps them when the files change."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        client_ca: str | None = None,
        *,
        kubelet_ca: str | None = None,
    ) -> None:
        self.cert_file, self.key_file, self.client_ca = cert_file, key_file, client_ca
        self.kubelet_ca = kubelet_ca
        self._admission = _Kind(cert_file, key_file, client_ca)
        self._metrics = _Kind(cert_file, key_file, None)
        self._kubelet = _Kind(cert_file, key_file, kubelet_ca) if kubelet_ca else None
        self.loads = 1

    @property
    def base(self) -> ssl.SSLContext:
        """The admission listener's context (the acceptor holds it)."""
        return self._admission.base

    @property
    def metrics_base(self) -> ssl.SSLContext:
        """The metrics listener's: the same certificate, no client certificate asked for."""
        return self._metrics.base

    @property
    def kubelet_base(self) -> ssl.SSLContext | None:
        """The kubelet credential listener's: a kubelet's client certificate required."""
        return self._kubelet.base if self._kubelet is not None else None

    def reload(self) -> None:
        """Load the files again; on error keep serving the previous contexts."""
        admission = server_context(self.cert_file, self.key_file, self.client_ca)
        metrics = server_context(self.cert_file, self.key_file)
        kubelet = (
            server_context(self.cert_file, self.key_file, self.kubelet_ca)
            if self._kubelet is not None
            else None
        )
        self._admission.current, self._metrics.current = admission, metrics
        if self._kubelet is not None and kubelet is not None:
            self._kubelet.current = kubelet
        self.loads += 1
