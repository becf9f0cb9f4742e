"""Which mirror of a rule's list serves an image: the first that can, by the probes' health.

A rule may list several mirrors (``mirror: [...]``). Each is a rule of its own
(its mirror, its credential); the planner asks :func:`choose_mirror` which of them an
image goes to. The answer reads only values in memory, the namespace's grants
and the :class:`~policy.health.Health` the background probes published: no
probe ever runs inline.

The order is the policy's:

1. a mirror none of whose credentials is granted to the namespace (or two of
   them, by label) is passed over: the namespace could not pull from it;
2. of the rest, the first whose mirror is up and whose credential logs in is
   chosen;
3. when none is, the first granted one is chosen with its problem, for
   ``onMirrorDown`` to decide: ``fallback`` leaves the image as written,
   ``keep`` rewrites it to that (first) mirror anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from mirrorgate.policy.health import Health
from mirrorgate.policy.matching import Resolution
from mirrorgate.policy.model import Policy
from mirrorgate.policy.quoting import quote
from mirrorgate.policy.rules import MirrorRule

__all__ = ["Choice", "PassedOver", "choose_mirror", "health_warning"]


class PassedOver(NamedTuple):
    """A mirror tried before the chosen one, and why it was not used."""

    rule: MirrorRule
    reason: str
    health: bool
    """Passed over for its health (a warning to the client), not for a grant (by design)."""


class Choice(NamedTuple):
    """The mirror an image goes to, and what was passed over on the way."""

    rule: MirrorRule
    new_image: str
    credential: str | None
    """Of the mirror's credentials, the one granted to the namespace (None: it needs none)."""
    problem: str | None
    """Why even this mirror cannot be used now (every granted mirror is down or cannot log
    in); None: it is up."""
    passed: tuple[PassedOver, ...] = ()
    """The mirrors passed over before it; with a ``problem``, every mirror tried, itself
    included."""


def choose_mirror(
    found: Resolution,
    *,
    health: Health,
    mirror_policy: Policy,
    namespace: str,
    labels: Mapping[str, str] | None,
) -> Choice | None:
    """The mirror of ``found``'s rule that an image in ``namespace`` goes to (``found`` is a
    ``rewrite``); ``labels`` are the namespace's, for grants by selector (None: not known).

    None when no mirror of the rule is granted: :func:`policy.decision.decide_image`
    has then said ``not-granted``, naming the first, as for a rule of one mirror.
    """
    assert found.rule is not None
    assert found.new_image is not None
    candidates = ((found.rule, found.new_image), *found.standbys)
    passed: list[PassedOver] = []
    fallback: Choice | None = None
    for rule, new_image in candidates:
        granted = mirror_policy.choose_credential(rule, namespace, labels)
        if granted.refusal is not None:
            passed.append(PassedOver(rule, granted.refusal, health=False))
            continue
        credential = granted.credential
        problem = health.problem(rule, credential) if health else None
        if problem is None:
            return Choice(rule, new_image, credential, None, tuple(passed))
        if fallback is None:
            fallback = Choice(rule, new_image, credential, problem)
        passed.append(PassedOver(rule, problem, health=True))
    if fallback is None:
        return None
    # Every granted mirror has a problem: name all of them, not only the first's.
    problems = "; ".join(p.reason for p in passed if p.health)
    return fallback._replace(problem=problems, passed=tuple(passed))


def health_warning(image: str, choice: Choice) -> str | None:
    """What admission tells the client about the health behind ``choice``, if anything.

    A later mirror serving the image names the ones passed over for their health
    (one passed over for a grant is the policy's design, not news); no mirror up
    names every problem, and what ``onMirrorDown`` then does.
    """
    rule, problem = choice.rule, choice.problem
    if problem is None:
        down = [p.reason for p in choice.passed if p.health]
        if not down:
            return None
        return (
            f"image {quote(image)} rewritten to {rule.label}'s mirror {rule.mirror}: "
            f"{'; '.join(down)}"
        )
    if rule.on_mirror_down == "fallback":
        return f"image {quote(image)} left as written: {problem} (onMirrorDown: fallback)"
    return f"image {quote(image)} rewritten although {problem} (onMirrorDown: keep)"
