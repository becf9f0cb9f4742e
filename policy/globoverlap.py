"""Whether two namespace globs can match one namespace name, and which.

A rule with one credential per team must never find two of them granted to
one namespace: the Pod's pull secret would be a guess. Grants by name and
by glob are known when the policy loads, so the loader asks this module for
a namespace both grants reach and refuses the policy, naming it.

Globs are fnmatch's (``*``, ``?``, ``[...]``, ``[!...]``) over the characters
of a namespace name (``a-z``, ``0-9``, ``-``). Two globs overlap when the
product of their automata reaches a state where both accept: a breadth-first
walk over pairs of glob positions, at most ``2 * (len(a) + 1) * (len(b) + 1)``
states of 37 characters each, whatever the globs.
"""

from __future__ import annotations

import string
from collections import deque
from collections.abc import Sequence

__all__ = ["shared_namespace"]

# Letters first: the witness shown in a message reads like a name.
NAMESPACE_CHARS = string.ascii_lowercase + string.digits + "-"
_ANY = frozenset(NAMESPACE_CHARS)

Token = frozenset[str] | None
"""One glob position: the characters it matches, or None for ``*`` (any run of them)."""

_State = tuple[int, int, bool]
"""A position in each glob, and whether a character was taken yet (a name is never empty)."""


def _class(body: str) -> frozenset[str]:
    """The characters of a bracket expression's body, ranges (``a-z``) expanded."""
    chars: set[str] = set()
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            low, high = body[i], body[i + 2]
            chars.update(c for c in NAMESPACE_CHARS if low <= c <= high)
            i += 3
        else:
            chars.add(body[i])
            i += 1
    return frozenset(chars) & _ANY


def tokens(glob: str) -> tuple[Token, ...]:
    """``glob`` as positions, read the way :func:`fnmatch.translate` reads it."""
    found: list[Token] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        i += 1
        if char == "*":
            if not found or found[-1] is not None:
                found.append(None)
        elif char == "?":
            found.append(_ANY)
        elif char == "[":
            j = i + 1 if i < len(glob) and glob[i] == "!" else i
            if j < len(glob) and glob[j] == "]":
                j += 1
            j = glob.find("]", j)
            if j == -1:
                found.append(frozenset("[") & _ANY)  # a literal "[": no namespace has one
            else:
                body = glob[i:j]
                negate = body.startswith("!")
                chars = _class(body[1:] if negate else body)
                found.append(_ANY - chars if negate else chars)
                i = j + 1
        else:
            found.append(frozenset(char) & _ANY)
    return tuple(found)


def _closure(glob: Sequence[Token], position: int) -> list[int]:
    """``position`` and every position after the ``*``s that start there (they match nothing)."""
    reached = [position]
    while position < len(glob) and glob[position] is None:
        position += 1
        reached.append(position)
    return reached


def _step(glob: Sequence[Token], position: int, char: str) -> int | None:
    if position == len(glob):
        return None
    token = glob[position]
    if token is None:
        return position  # a "*" takes the character and stays
    return position + 1 if char in token else None


def shared_namespace(a: str, b: str) -> str | None:
    """A namespace name both globs match (a shortest one), or None when there is none."""
    first, second = tokens(a), tokens(b)
    start: _State = (0, 0, False)
    came: dict[_State, tuple[_State, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        i_states, j_states = _closure(first, state[0]), _closure(second, state[1])
        if state[2] and len(first) in i_states and len(second) in j_states:
            name: list[str] = []
            at = state
            while (back := came[at]) is not None:
                at, char = back
                name.append(char)
            return "".join(reversed(name))
        for char in NAMESPACE_CHARS:
            for i in i_states:
                for j in j_states:
                    ni, nj = _step(first, i, char), _step(second, j, char)
                    if ni is None or nj is None or (ni, nj, True) in came:
                        continue
                    came[(ni, nj, True)] = (state, char)
                    queue.append((ni, nj, True))
    return None
