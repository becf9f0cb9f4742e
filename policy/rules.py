"""The value types of one mirror rule: where images come from and where they go."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = [
    "CATCH_ALL",
    "ON_MIRROR_DOWN",
    "ON_NOT_GRANTED",
    "Mirror",
    "MirrorRule",
    "OnMirrorDown",
    "OnNotGranted",
    "Scheme",
    "Source",
]

OnMirrorDown = Literal["fallback", "keep"]
ON_MIRROR_DOWN: tuple[OnMirrorDown, ...] = ("fallback", "keep")
OnNotGranted = Literal["skip", "next", "deny"]
"""What a rule does in a namespace granted none of its credentials: leave the image as
written (``skip``), let the next broader rule that covers the image decide (``next``), or
refuse the Pod in enforce and warn in audit (``deny``)."""
ON_NOT_GRANTED: tuple[OnNotGranted, ...] = ("skip", "next", "deny")
CATCH_ALL = "*"
"""The source that covers every registry no other source covers."""
Scheme = Literal["https", "http"]


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """Where images come from: a host, a host plus repository prefix, ``*.suffix``, or
    ``*`` (the catch-all: a wildcard with an empty suffix)."""

    host: str
    """The registry ``host[:port]``; for a wildcard, the suffix after ``*.`` (empty: ``*``)."""
    path: str
    """Repository prefix in whole path components; empty for a whole host."""
    wildcard: bool

    @property
    def catch_all(self) -> bool:
        return self.wildcard and not self.host

    def __str__(self) -> str:
        if self.wildcard:
            return f"*.{self.host}" if self.host else CATCH_ALL
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
    credentials: tuple[str, ...]
    """The credentials the mirror takes, one per team (empty: none). A Pod uses the one
    granted to its namespace; the loader refuses two granted to one namespace by name."""
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
    position: int | None = None
    """Its place in the rule's list of mirrors (``mirror: [...]``, tried in order); None: the
    rule names one mirror. Each entry of a list is a rule of its own, with its own mirror,
    credential and transport, under the same ``index`` and source."""
    on_not_granted: OnNotGranted = "skip"
    """What happens where none of ``credentials`` is granted (see :data:`OnNotGranted`)."""
    fixed: bool = False
    """``fixed: true`` (a ClusterMirrorPolicy's rule): no MirrorPolicy may take images from it."""
    origin: str = ""
    """The object the rule was written in (``ClusterMirrorPolicy base``), for messages;
    empty for a policy file, whose rules are plain ``mirrors[i]``."""

    @property
    def mirror_url(self) -> str:
        """The mirror as written, scheme included: what ``explain`` shows."""
        return f"{self.scheme}://{self.mirror}"

    @property
    def label(self) -> str:
        """The rule as messages name it: ``mirrors[N]``, or ``mirrors[N].mirror[J]`` for an
        entry of a mirror list, prefixed by the object it was written in, if any."""
        own = (
            f"mirrors[{self.index}]"
            if self.position is None
            else f"mirrors[{self.index}].mirror[{self.position}]"
        )
        return f"{self.origin} spec.{own}" if self.origin else own

    def field(self, key: str) -> str:
        """The path of ``key`` in the policy document: an entry of a mirror list holds its own
        ``credential``, ``caFile`` and ``insecureSkipVerify`` (and is itself the ``mirror``);
        ``source`` and ``onMirrorDown`` are the whole rule's."""
        whole = (
            f"{self.origin} spec.mirrors[{self.index}]" if self.origin else f"mirrors[{self.index}]"
        )
        if self.position is None or key in ("source", "onMirrorDown"):
            return f"{whole}.{key}"
        return self.label if key == "mirror" else f"{self.label}.{key}"
