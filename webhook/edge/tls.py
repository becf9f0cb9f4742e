"""TLS for the admission server: 1.2 or newer, and certificates that rotate without a restart.

uvicorn loads its certificate once. The server context here carries an SNI
callback that hands every new handshake the most recently loaded context,
so a renewed certificate on disk serves new connections within a poll
interval while connections already open keep theirs. OpenSSL calls the
callback whether or not the client sends SNI, which the API server does not
do when the webhook URL is an IP address.
"""

from __future__ import annotations

import ssl

from mirrorgate.webhook.errors import ConfigError, why_unreadable

__all__ = ["CertificateReloader", "server_context"]


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context for ``cert_file``/``key_file``; ConfigError names a bad file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    for path in (cert_file, key_file):
        # ssl's own OSError does not say which of the two it is about.
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
    return context


class CertificateReloader:
    """Holds the live server context and swaps it when the files change."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.current = server_context(cert_file, key_file)
        self.base = server_context(cert_file, key_file)
        self.base.sni_callback = self._select
        self.loads = 1

    def _select(
        self,
        connection: ssl.SSLObject | ssl.SSLSocket,
        server_name: str | None,
        base: ssl.SSLContext,
    ) -> None:
        current = self.current
        if current is not base:
            connection.context = current

    def reload(self) -> None:
        """Load the files again; on error keep serving the previous certificate."""
        context = server_context(self.cert_file, self.key_file)
        self.current = context
        self.loads += 1
