"""The client certificate a TLS handshake verified, handed to the application in its scope.

uvicorn tells an application nothing of the TLS connection a request came
on. A listener whose context requires a client certificate
(``ssl.CERT_REQUIRED``: OpenSSL completes no handshake without one that
chains to the listener's CA) knows its peer as well as its address, and
:class:`PeerCertProtocol` passes it on the way the ASGI TLS extension names
it: ``scope["extensions"]["tls"]["client_cert_chain"]``, the peer's
certificate in PEM (the leaf: what Python's ``ssl`` exposes). Read once per
connection, after the handshake; a request cannot choose it.
"""

from __future__ import annotations

import asyncio
import ssl

from mirrorgate.webhook.edge.protocol import LimitedHttpProtocol

__all__ = ["TLS_EXTENSION", "PeerCertProtocol"]

TLS_EXTENSION = "tls"


class PeerCertProtocol(LimitedHttpProtocol):
    """:class:`LimitedHttpProtocol`, with the verified client certificate in every request's
    scope (an empty chain when the handshake verified none)."""

    peer_chain: tuple[str, ...] = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tls = transport.get_extra_info("ssl_object")
        der = tls.getpeercert(binary_form=True) if tls is not None else None
        self.peer_chain = (ssl.DER_cert_to_PEM_cert(der),) if der else ()
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {  # scope: private hook
            TLS_EXTENSION: {"client_cert_chain": list(self.peer_chain), "client_cert_error": None}
        }
