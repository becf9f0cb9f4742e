"""`mirrorgate export cri-o`: the policy's mirrors as a containers-registries.conf(5) drop-in.

Prints a v2 drop-in for ``/etc/containers/registries.conf.d/``: one
``[[registry]]`` per rule, ``prefix``/``location`` the source and one
``[[registry.mirror]]`` per mirror of the rule, in order. What cannot be
expressed, and why, is in :mod:`webhook.commands.export`, which also holds
what both runtimes' exports share.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TextIO

from mirrorgate import policy
from mirrorgate.webhook.commands.export import (
    Export,
    _cluster_policy,
    _credential_notes,
    _describe_rule,
    _needs,
    _report,
    _rules,
    _toml_string,
)

__all__ = ["CRI_O_DROP_IN", "cri_o", "run_cri_o"]

CRI_O_DROP_IN = "/etc/containers/registries.conf.d/50-mirrorgate.conf"


def cri_o(mirror_policy: policy.Policy) -> Export:
    """A registries.conf v2 drop-in with one ``[[registry]]`` per expressible rule."""
    warnings: list[str] = []
    blocks: list[str] = []
    for mirrors in _rules(mirror_policy):
        rule = mirrors[0]
        if rule.source.catch_all:
            warnings.append(
                f"{_describe_rule(mirrors)}: not exported: registries.conf has no prefix for "
                f"every registry, and a mirror location cannot hold the registry host in its "
                f"path ({rule.mirror}/<host>/…)"
            )
            continue
        if rule.source.wildcard:
            warnings.append(
                f"{_describe_rule(mirrors)}: not exported: a registries.conf mirror replaces the "
                f"whole host matched by {rule.source}, but mirrorgate's mirror keeps that host as "
                f"the first path component ({rule.mirror}/<host>/…)"
            )
            continue
        blocks.append(_registry_block(mirrors))
    insecure_hosts = {r.mirror.host: r for r in mirror_policy.rules if _insecure(r)}
    blocks += [_insecure_mirror_block(r) for r in insecure_hosts.values()]
    header = [
        "# containers-registries.conf(5) v2 drop-in for CRI-O, written by",
        "# `mirrorgate export cri-o`. Install it on every node as",
        f"# {CRI_O_DROP_IN}.",
        "# CRI-O tries each mirror first, then the location.",
        "#",
        "# No credentials are written here: registries.conf has no place for them. For an",
        "# authenticated mirror, use mirrorgate's admission webhook: it rewrites the image",
        "# and attaches a pull secret.",
    ]
    text = "\n".join(header) + "\n" + "".join(f"\n{block}" for block in blocks)
    notes = _credential_notes(
        (r for r in mirror_policy.rules if not r.source.wildcard),
        "registries.conf has no place for them",
    )
    cas = {r.mirror.host: r.ca_file for r in mirror_policy.rules if r.ca_file is not None}
    notes += [
        f"the mirror {host} is verified with {ca}: CRI-O reads it from "
        f"/etc/containers/certs.d/{host}/ca.crt (copy it there)"
        for host, ca in cas.items()
    ]
    return Export(files={"registries.conf": text}, warnings=warnings, notes=notes)


def _insecure(rule: policy.MirrorRule) -> bool:
    """registries.conf's ``insecure``: plain HTTP, or TLS without verification."""
    return rule.scheme == "http" or rule.skip_verify


def _registry_block(mirrors: Sequence[policy.MirrorRule]) -> str:
    """A rule's ``[[registry]]``, its mirrors as ``[[registry.mirror]]`` in the rule's order
    (CRI-O tries them in that order)."""
    first = mirrors[0]
    prefix = str(first.source)
    text = (
        "".join(
            f"# {r.label}: {r.source} → {r.mirror}"
            + (f" (needs credential {_needs(r)})" if r.credentials else "")
            + "\n"
            for r in mirrors
        )
        + f"[[registry]]\n"
        f"prefix = {_toml_string(prefix)}\n"
        f"location = {_toml_string(prefix)}\n"
    )
    for rule in mirrors:
        insecure = "insecure = true\n" if _insecure(rule) else ""
        text += f"\n[[registry.mirror]]\nlocation = {_toml_string(str(rule.mirror))}\n{insecure}"
    return text


def _insecure_mirror_block(rule: policy.MirrorRule) -> str:
    """The mirror host itself, for the images admission rewrote to it."""
    host = rule.mirror.host
    why = "plain HTTP" if rule.scheme == "http" else "TLS not verified (insecureSkipVerify)"
    return (
        f"# the mirror host {host} itself ({why}), for images rewritten to it\n"
        f"[[registry]]\n"
        f"location = {_toml_string(host)}\n"
        f"insecure = true\n"
    )


def run_cri_o(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    export = cri_o(_cluster_policy(args.policy, err))
    status = _report(export, err)
    out.write(export.files["registries.conf"])
    return status
