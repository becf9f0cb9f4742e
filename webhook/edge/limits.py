"""The server's limits: what one client may make it hold, and for how long.

Kept apart from :mod:`webhook.edge.connections` and the modules around it
(which enforce them inside uvicorn) so that the command line can show the
defaults without loading the server.
"""

from __future__ import annotations

import dataclasses

from mirrorgate.webhook.admission import MAX_CONTAINERS

__all__ = ["Limits"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """What one client may make the server hold; the defaults are `mirrorgate serve`'s."""

    max_connections: int = 1024
    """Open connections, TLS handshakes in progress included."""
    max_header_bytes: int = 32 * 1024
    """Request line plus header fields; the API server sends well under 1 KB."""
    max_headers: int = 100
    header_timeout: float = 10.0
    """Seconds from accept (TLS handshake included), or from a request's first byte, to the
    end of its head."""
    body_timeout: float = 10.0
    """Seconds from the end of a request's head to the end of its body."""
    idle_timeout: float = 60.0
    """Seconds a keep-alive connection may wait for its next request (the API server's
    client keeps idle connections for 90 s and opens a new one when it finds one closed)."""
    max_buffered_bytes: int = 32 << 20
    """Request-body bytes held at once across all connections."""
    max_containers: int = MAX_CONTAINERS
    """Containers of one Pod that admission plans; a Pod with more is admitted as written,
    with a warning (see :data:`webhook.admission.MAX_CONTAINERS`)."""
    write_timeout: float = 10.0
    """Seconds an answer may wait for a client that does not read it (its connection's
    unsent output above the transport's high-water mark all along)."""
    max_unsent_bytes: int = 64 << 20
    """Answer bytes held at once, across all connections, for clients that do not read them."""
    max_pipelined: int = 8
    """Requests of a connection read ahead of the one being answered; the rest of what it
    sent waits unread."""

    def problems(self) -> list[str]:
        """What is wrong with these values, as `serve` option names."""
        found = []
        for option, value in (
            ("--max-connections", self.max_connections),
            ("--max-header-bytes", self.max_header_bytes),
            ("--max-headers", self.max_headers),
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--max-buffered-bytes", self.max_buffered_bytes),
            ("--max-containers", self.max_containers),
            ("--write-timeout", self.write_timeout),
            ("--max-unsent-bytes", self.max_unsent_bytes),
            ("--max-pipelined", self.max_pipelined),
        ):
            if not value > 0:
                found.append(f"{option} must be positive, got {value}")
        return found
