"""Mirror and credential health as values: the probe settings, and what the probes concluded.

The probing itself is I/O and lives in ``webhook.mirrorhealth.monitor``; admission only
ever sees a :class:`Health` value, read from memory, and the planner decides
with it like with any other input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from mirrorgate.policy.rules import MirrorRule

__all__ = [
    "DEFAULT_HEALTH_SETTINGS",
    "HEALTHY",
    "NOT_PROBED",
    "UNPROBED",
    "Health",
    "HealthSettings",
]


@dataclasses.dataclass(frozen=True, slots=True)
class HealthSettings:
    """The policy's ``health`` block: how often and how patiently mirrors are probed."""

    interval: float = 10.0
    """Seconds from the start of one probe round to the start of the next."""
    timeout: float = 2.0
    """Seconds one probe may take, connection and answer included."""
    failure_threshold: int = 3
    """Consecutive failed probes that mark a mirror down (or a credential invalid)."""
    success_threshold: int = 1
    """Consecutive good probes that mark it up (or valid) again."""


DEFAULT_HEALTH_SETTINGS = HealthSettings()

_EMPTY: Mapping[str, str] = MappingProxyType({})

NOT_PROBED = "not probed"
"""A planned rewrite's health where no probe runs (``serve --no-health-probes``): "up"
would claim what nobody checked."""


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    """What the probes last concluded: only the problems, each with why.

    Empty (and false) when every mirror is up and every credential logs in,
    which is the steady state; admission then plans exactly as without it.
    Hashable by content, computed once (treat the mappings as read-only): the
    plan memo keys the plans it shares by the health they were made under.
    """

    down: Mapping[str, str] = dataclasses.field(default_factory=lambda: _EMPTY)
    """Mirror hosts (``host[:port]``) that are down, with the reason."""
    failing: Mapping[str, str] = dataclasses.field(default_factory=lambda: _EMPTY)
    """Credentials that cannot log in to their mirror (or are misconfigured), with the reason."""
    probed: bool = True
    """False where no probe runs: a mirror without a problem is then not known to be up."""
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "_hash",
            hash((frozenset(self.down.items()), frozenset(self.failing.items()), self.probed)),
        )

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        return bool(self.down or self.failing)

    def problem(self, rule: MirrorRule, credential: str | None) -> str | None:
        """Why ``rule``'s mirror cannot be used right now with ``credential`` (the one of its
        credentials the namespace is granted), naming the mirror; None when it can."""
        reason = self.down.get(rule.mirror.host)
        if reason is not None:
            return f"mirror {rule.mirror} of {rule.label} is down: {reason}"
        if credential is not None:
            reason = self.failing.get(credential)
            if reason is not None:
                return (
                    f"credential {credential!r} of {rule.label} cannot log in to "
                    f"mirror {rule.mirror}: {reason}"
                )
        return None

    @property
    def well(self) -> str:
        """A rewrite's health without a problem: ``up``, or :data:`NOT_PROBED`."""
        return "up" if self.probed else NOT_PROBED

    def status(self, rule: MirrorRule, credential: str | None) -> str:
        """``up`` (or :data:`NOT_PROBED`), or the problem: what the audit reports next to a
        planned rewrite."""
        return self.problem(rule, credential) or self.well


HEALTHY = Health()
UNPROBED = Health(probed=False)
"""Nothing known, nothing wrong: the health where no probe runs."""
