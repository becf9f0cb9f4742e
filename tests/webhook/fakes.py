"""A recording stand-in for the Kubernetes API behind ``admission.PullSecrets``.

Unit tests only observe which calls admission makes; the real API is the
e2e suite's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass
class RecordingPullSecrets:
    """``missing`` reports every credential while ``stale``; ``ensure`` fails for ``failures``."""

    stale: bool = True
    failures: dict[str, str] = dataclasses.field(default_factory=dict)
    explode: bool = False
    """When set, ``missing`` raises, as a bug in the real implementation would."""
    missing_calls: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)
    ensure_calls: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)

    def missing(self, namespace: str, credentials: Sequence[str]) -> list[str]:
        self.missing_calls.append((namespace, tuple(credentials)))
        if self.explode:
            raise RuntimeError("pull-secret cache exploded")
        return list(credentials) if self.stale else []

    async def ensure(self, namespace: str, credentials: Sequence[str]) -> dict[str, str]:
        self.ensure_calls.append((namespace, tuple(credentials)))
        return {c: self.failures[c] for c in credentials if c in self.failures}
