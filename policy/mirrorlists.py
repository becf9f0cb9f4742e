"""A rule's ``mirror``: one mirror, or several tried in order (failover).

Two spellings, one meaning per entry::

    mirror: harbor.corp.example/hub          # one mirror; the rule's credential,
    credential: harbor-pull                  # caFile and insecureSkipVerify are its own

    mirror:                                  # several, in order of preference
      - url: harbor-a.corp.example/hub
        credential: harbor-a-pull
        caFile: /etc/mirrorgate/ca/corp.pem
      - harbor-b.corp.example/hub            # a string: no credential, verified HTTPS

An entry of a list carries its own ``credential``, ``caFile`` and
``insecureSkipVerify``; the rule's own are refused next to a list, so that no
entry inherits a login or a trust meant for another host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from mirrorgate.policy.collector import Collector, type_name

__all__ = ["ENTRY_KEYS", "MirrorEntry", "mirror_entries"]

ENTRY_KEYS = ("url", "credential", "caFile", "insecureSkipVerify")
"""The keys of a mapping in a mirror list."""
_PER_MIRROR_KEYS = ("credential", "caFile", "insecureSkipVerify")
MAX_MIRRORS = 8
"""Mirrors one rule may list: each is probed, and a Pod waits on none of them, but a longer
list is a policy nobody can reason about."""


class MirrorEntry(NamedTuple):
    """One mirror of a rule, with where its fields are in the document."""

    position: int | None
    """Its place in the list; None: the rule's ``mirror`` is a single string."""
    url: object
    """The mirror as written (not validated yet)."""
    url_path: str
    """The field path of ``url``, for messages."""
    prefix: str
    """The path its ``credential``, ``caFile`` and ``insecureSkipVerify`` are under."""
    fields: Mapping[str, object]
    """Where those keys are read from: the rule itself, or the list's mapping."""


def mirror_entries(rule: Mapping[str, object], where: str, errors: Collector) -> list[MirrorEntry]:
    """The mirrors of the rule at ``where``, in order; problems go to ``errors``."""
    value = rule.get("mirror")
    if not isinstance(value, list):
        return [MirrorEntry(None, value, f"{where}.mirror", where, rule)]
    for key in _PER_MIRROR_KEYS:
        if key in rule:
            errors.add(
                f"{where}.{key}",
                f"cannot stand next to a list of mirrors: give each mirror its own "
                f"({where}.mirror[N].{key})",
            )
    if not value:
        errors.add(f"{where}.mirror", "is an empty list: name at least one mirror")
    elif len(value) > MAX_MIRRORS:
        errors.add(f"{where}.mirror", f"lists {len(value)} mirrors; at most {MAX_MIRRORS}")
        return []
    entries: list[MirrorEntry] = []
    for j, item in enumerate(value):
        at = f"{where}.mirror[{j}]"
        if isinstance(item, str):
            entries.append(MirrorEntry(j, item, at, at, {}))
            continue
        if not isinstance(item, Mapping):
            errors.add(at, f"must be a mirror URL or a mapping with url, got {type_name(item)}")
            continue
        entry = errors.mapping(item, at, ENTRY_KEYS)
        if "url" not in entry:
            errors.add(f"{at}.url", "is required")
            continue
        entries.append(MirrorEntry(j, entry["url"], f"{at}.url", at, entry))
    return entries
