"""The value types of one mirror rule: where images come from and where they go."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["ON_MIRROR_DOWN", "Mirror", "MirrorRule", "OnMirrorDown", "Scheme", "Source"]

OnMirrorDown = Literal["fallback", "keep"]
ON_MIRROR_DOWN: tuple[OnMirrorDown, ...] = ("fallback", "keep")
Scheme = Literal["https", "http"]


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """Where images come from: a host, a host plus repository prefix, or ``*.suffix``."""

    host: str
    """The registry ``host[:port]``; for a wildcard, the suffix after ``*.``."""
    path: str
    """Repository prefix in whole path components; empty for a whole host."""
    wildcard: bool

    def __str__(self) -> str:
        if self.wildcard:
            return f"*.{self.host}"
        return f"{self.host}/{self.path}" if self.path else self.host


@dataclasses.dataclass(frozen=True, slots=True)
class Mirror:
    """Where images are pulled from instead: ``host[:port][/path]``."""

    host: str
    path: str

    def __str__(self) -> str:
        return f"{self.host}/{self.path}" if self.path else self.host


@dataclasses.dataclass(frozen=True, slots=True)
class MirrorRule:
    """One entry of ``mirrors``; ``index`` is its position, for messages."""

    index: int
    source: Source
    mirror: Mirror
    credential: str | None
    on_mirror_down: OnMirrorDown = "fallback"
    """While the mirror is down or the credential cannot log in: leave images as
    written (``fallback``) or rewrite them anyway (``keep``, for air-gapped clusters)."""
    ca_file: str | None = None
    """A CA bundle (path) the health probe trusts for this mirror instead of the system's,
    and that ``export containerd`` writes as the mirror's ``ca``."""
    scheme: Scheme = "https"
    """How the mirror is reached: ``http`` for a plain-HTTP mirror (a dev cluster's
    pull-through cache). The rewritten image carries no scheme: the runtime's own
    configuration says how to reach the host (``export containerd`` writes it)."""
    skip_verify: bool = False
    """``insecureSkipVerify: true``: the mirror's TLS certificate is not verified."""

    @property
    def mirror_url(self) -> str:
        """The mirror as written, scheme included: what ``explain`` shows."""
        return f"{self.scheme}://{self.mirror}"

    @property
    def label(self) -> str:
        return f"mirrors[{self.index}]"
