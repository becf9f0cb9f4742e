"""`mirrorgate export`: the policy's mirrors as container-runtime configuration.

For clusters (or node pools) that want the runtime itself to pull through the
mirrors, without admission rewriting images:

``mirrorgate export containerd --policy FILE --out DIR``
    writes ``DIR/<registry>/hosts.toml`` per source registry, in containerd's
    ``config_path`` format (point ``config_path`` of the CRI plugin at DIR,
    e.g. ``/etc/containerd/certs.d``)::

        server = "https://registry-1.docker.io"

        [host."https://harbor.corp.example/v2/dockerhub-proxy"]
          capabilities = ["pull", "resolve"]
          override_path = true

    A mirror with a repository path gets ``override_path = true`` and a host
    URL that spells the API root, ``/v2`` included, as containerd requires;
    a mirror without one is just ``https://<host>`` (containerd adds ``/v2``).
    Docker Hub's directory is ``docker.io`` and its server
    ``https://registry-1.docker.io``.

    How the mirror is reached goes with it: an ``http://`` mirror gets an
    ``http://`` host URL, a rule's ``caFile`` becomes ``ca``, and
    ``insecureSkipVerify: true`` becomes ``skip_verify = true``. With
    ``--mirror-ca FILE`` (the bundle ``serve --mirror-ca`` and the chart's
    ``mirrorCA`` give the probes), every other HTTPS mirror gets ``ca =
    "mirrorgate-ca.crt"``, a copy of the bundle written beside its hosts.toml
    (containerd reads a relative ``ca`` from the file's own directory, and
    adds it to the system roots), so the node needs no path of the Pod's. A mirror
    reached other than by verified HTTPS also gets a hosts.toml of its own
    (``DIR/<mirror host>/hosts.toml``): admission rewrites images to the
    mirror host, and containerd must know how to reach it for those too.

``mirrorgate export cri-o --policy FILE`` (:mod:`webhook.commands.export_crio`)
    prints a containers-registries.conf(5) v2 drop-in for
    ``/etc/containers/registries.conf.d/``: one ``[[registry]]`` per rule,
    ``prefix``/``location`` the source and one ``[[registry.mirror]]`` the
    mirror. Prefixes may carry a repository path, so every rule but wildcards
    is expressible. A plain-HTTP or unverified mirror is ``insecure = true``,
    on the mirror and in a ``[[registry]]`` of the mirror host itself (for
    rewritten images); a ``caFile`` goes, by hand, to
    ``/etc/containers/certs.d/<mirror host>/ca.crt`` (stderr says so).

What cannot be expressed is reported on stderr, rule by rule, and left out
(decided so because the alternatives pull the wrong images):

* containerd, a source with a repository path (``quay.io/prometheus``):
  hosts.toml configures whole registries. Widening the rule to the whole
  host would send every quay.io image to a mirror that holds only the
  prometheus ones, under the wrong path, so it is not exported. Where the
  same host also has a whole-host rule, the warning says that images under
  the path will use that rule's mirror.
* containerd, a wildcard source (``*.gcr.io``): there is one directory per
  registry host and no wildcard directory.
* containerd and CRI-O, the catch-all source (``*``): containerd's
  ``_default`` directory and registries.conf's mirrors send an image to the
  mirror under its own path, but the catch-all's mirror holds it under
  ``<mirror>/<registry host>/<path>``.
* CRI-O, a wildcard source: registries.conf does accept ``prefix =
  "*.gcr.io"``, but a mirror location then replaces the whole matched host
  (``eu.gcr.io/p/app`` → ``<mirror>/p/app``), while mirrorgate's mirrors keep
  the host as the first path component (``<mirror>/eu.gcr.io/p/app``).

Credentials are never written: containerd no longer reads plain-text registry
credentials from hosts.toml, and registries.conf has no place for them. Each
file says so at the top, and stderr names the rules whose mirror needs a
credential: authenticated mirrors are what mirrorgate's admission path is for
(it rewrites the image and attaches a pull secret). Both runtimes try the
mirror first and fall back to the source registry.

Exit codes: 0 every rule exported; 1 some rule could not be expressed
(warnings on stderr; the rest is still written); 2 usage or configuration
error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import tempfile
from collections.abc import Iterable, Sequence
from typing import TextIO

from mirrorgate import policy
from mirrorgate.policy.reference import DEFAULT_DOMAIN
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import EXIT_FINDINGS, EXIT_OK
from mirrorgate.webhook.commands.serve import reloaders
from mirrorgate.webhook.errors import ConfigError

__all__ = [
    "MIRROR_CA_FILE",
    "Export",
    "containerd",
    "run_containerd",
]

# Docker Hub's registry API host; `docker.io` itself only redirects.
DOCKER_HUB_SERVER = "https://registry-1.docker.io"
CAPABILITIES = ("pull", "resolve")  # a private mirror is trusted to resolve tags; never push

ADMISSION_HINT = (
    "for an authenticated mirror, use mirrorgate's admission webhook: it "
    "rewrites the image and attaches a pull secret"
)


@dataclasses.dataclass(frozen=True)
class Export:
    """Files to write (relative path → text) and what to say on stderr."""

    files: dict[str, str]
    warnings: list[str]
    notes: list[str]


def _toml_string(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(value, ensure_ascii=False)


def _describe(rule: policy.MirrorRule) -> str:
    return f"{rule.label} ({rule.source} → {rule.mirror})"


def _rules(mirror_policy: policy.Policy) -> list[tuple[policy.MirrorRule, ...]]:
    """Each entry of ``mirrors`` as its mirrors in order (one for most rules)."""
    return [mirror_policy.mirror_list(r) for r in mirror_policy.rules if r.position in (None, 0)]


def _describe_rule(mirrors: Sequence[policy.MirrorRule]) -> str:
    """A rule and its mirrors in order, for messages about the whole rule."""
    first = mirrors[0]
    return f"mirrors[{first.index}] ({first.source} → {', '.join(str(r.mirror) for r in mirrors)})"


def _needs(rule: policy.MirrorRule) -> str:
    """The rule's credentials as the notes name them: ``'a'``, or ``'a' or 'b'`` (per team)."""
    return " or ".join(map(repr, rule.credentials))


def _credential_notes(rules: Iterable[policy.MirrorRule], runtime: str) -> list[str]:
    needing = [r for r in rules if r.credentials]
    notes = [f"no credentials are written ({runtime}); {ADMISSION_HINT}"]
    notes += [
        f"{_describe(r)}: the mirror needs credential {_needs(r)}, which this file cannot carry"
        for r in needing
    ]
    return notes


# --- containerd ------------------------------------------------------------


MIRROR_CA_FILE = "mirrorgate-ca.crt"
"""The ``--mirror-ca`` bundle's copy beside each hosts.toml that trusts it."""


def containerd(mirror_policy: policy.Policy, *, mirror_ca: str | None = None) -> Export:
    """One ``<host>/hosts.toml`` per source registry with a whole-host rule.

    ``mirror_ca`` (PEM): the CAs every HTTPS mirror without a ``caFile`` of its own, and
    verified, is trusted with, written beside each hosts.toml that names it.
    """
    if mirror_ca is not None:
        mirror_policy = mirror_policy.with_rules(
            tuple(_trusting(r, mirror_ca) for r in mirror_policy.rules)
        )
    rules = _rules(mirror_policy)
    whole = {m[0].source.host: m for m in rules if not (m[0].source.wildcard or m[0].source.path)}
    warnings: list[str] = []
    for mirrors in rules:
        source = mirrors[0].source
        if source.catch_all:
            warnings.append(
                f"{_describe_rule(mirrors)}: not exported: containerd's _default hosts.toml "
                "cannot put the registry host into the mirror's path "
                f"({mirrors[0].mirror}/<host>/…); give each registry its own rule to export it"
            )
        elif source.wildcard:
            warnings.append(
                f"{_describe_rule(mirrors)}: not exported: containerd has one hosts.toml "
                "per registry host and no wildcard hosts"
            )
        elif source.path:
            warnings.append(_partial_warning(mirrors, whole.get(source.host)))
    files = {f"{host}/hosts.toml": _hosts_toml(m) for host, m in sorted(whole.items())}
    mirror_files, mirror_warnings = _mirror_hosts(mirror_policy.rules, whole)
    files.update(sorted(mirror_files.items()))
    warnings += mirror_warnings
    if mirror_ca is not None:
        named = f"ca = {_toml_string(MIRROR_CA_FILE)}"
        files.update(
            {
                str(pathlib.PurePosixPath(path).with_name(MIRROR_CA_FILE)): mirror_ca
                for path, text in list(files.items())
                if named in text
            }
        )
    notes = _credential_notes(
        (r for m in whole.values() for r in m),
        "containerd no longer supports plain-text credentials in hosts.toml",
    )
    return Export(files=files, warnings=warnings, notes=notes)


def _trusting(rule: policy.MirrorRule, mirror_ca: str | None) -> policy.MirrorRule:
    """``rule`` with the mirror CA's copy as its ``caFile``, where it is verified HTTPS
    without a caFile of its own."""
    if mirror_ca is None or rule.scheme != "https" or rule.ca_file or rule.skip_verify:
        return rule
    return dataclasses.replace(rule, ca_file=MIRROR_CA_FILE)


def _partial_warning(
    mirrors: Sequence[policy.MirrorRule], whole: Sequence[policy.MirrorRule] | None
) -> str:
    text = (
        f"{_describe_rule(mirrors)}: not exported: hosts.toml configures whole registries, not "
        f"repository paths"
    )
    if whole is not None:
        several = "s" if len(whole) > 1 else ""
        text += (
            f"; with these files, {mirrors[0].source} images are pulled through "
            f"mirrors[{whole[0].index}]'s mirror{several} "
            f"{', '.join(str(r.mirror) for r in whole)} instead"
        )
    return text


def server_url(host: str) -> str:
    return DOCKER_HUB_SERVER if host == DEFAULT_DOMAIN else f"https://{host}"


def mirror_url(rule: policy.MirrorRule) -> tuple[str, bool]:
    """The ``[host."…"]`` URL and whether it needs ``override_path``.

    containerd appends ``/v2`` only to a host URL without a path; with
    ``override_path`` the URL is the API root itself, so ``/v2`` comes before
    the mirror's repository prefix. The scheme is the rule's.
    """
    mirror = rule.mirror
    if not mirror.path:
        return f"{rule.scheme}://{mirror.host}", False
    return f"{rule.scheme}://{mirror.host}/v2/{mirror.path}", True


def _special_transport(rule: policy.MirrorRule) -> bool:
    """Whether containerd needs telling how to reach the mirror: not verified HTTPS."""
    return rule.scheme == "http" or rule.ca_file is not None or rule.skip_verify


def _transport_lines(rule: policy.MirrorRule) -> list[str]:
    """``ca`` and ``skip_verify`` of a ``[host]`` table, as the rule says."""
    lines = []
    if rule.ca_file is not None:
        lines.append(f"  ca = {_toml_string(rule.ca_file)}")
    if rule.skip_verify:
        lines.append("  skip_verify = true  # the policy's insecureSkipVerify")
    return lines


def _mirror_hosts(
    rules: Iterable[policy.MirrorRule], sources: Iterable[str]
) -> tuple[dict[str, str], list[str]]:
    """A hosts.toml for each mirror host reached other than by verified HTTPS.

    Rewritten images name the mirror host itself; without this file containerd
    would pull them over verified HTTPS and fail. A mirror host that is also
    a source keeps the source's file (its mirror wins), with a warning.
    """
    taken = set(sources)
    files: dict[str, str] = {}
    warnings: list[str] = []
    for rule in rules:
        host = rule.mirror.host
        if not _special_transport(rule) or f"{host}/hosts.toml" in files:
            continue
        if host in taken:
            warnings.append(
                f"{_describe(rule)}: the mirror host {host} is also a source "
                f"registry: its hosts.toml is the source's, and images rewritten "
                f"to {host} are pulled as that file says"
            )
            continue
        files[f"{host}/hosts.toml"] = _mirror_host_toml(rule)
    return files, warnings


def _mirror_host_toml(rule: policy.MirrorRule) -> str:
    url = f"{rule.scheme}://{rule.mirror.host}"
    how = {"http": "plain HTTP"}.get(rule.scheme, "HTTPS")
    lines = [
        f"# containerd hosts.toml for the mirror host {rule.mirror.host} itself,",
        f"# written by `mirrorgate export containerd` from the policy's {rule.label}:",
        f"# images admission rewrote to {rule.mirror} are pulled over {how} as below.",
        f"server = {_toml_string(url)}",
        "",
        # The table repeats the server: containerd 1.6 rejects a file without one.
        f"[host.{_toml_string(url)}]",
        f"  capabilities = [{', '.join(_toml_string(c) for c in CAPABILITIES)}]",
        *_transport_lines(rule),
    ]
    return "\n".join(lines) + "\n"


def _hosts_toml(mirrors: Sequence[policy.MirrorRule]) -> str:
    """A source's hosts.toml: one ``[host]`` table per mirror of its rule, in the rule's
    order, which is the order containerd tries them in."""
    first = mirrors[0]
    several = len(mirrors) > 1
    lines = [
        f"# containerd hosts.toml for {first.source}",
        f"# written by `mirrorgate export containerd` from the policy's mirrors[{first.index}]:",
        f"# {first.source} → {', '.join(str(r.mirror) for r in mirrors)}.",
        "# containerd tries the mirrors in this order first, then the server."
        if several
        else "# containerd tries the mirror first, then the server.",
        "#",
        "# No credentials are written here: containerd no longer supports plain-text",
        "# registry credentials in hosts.toml. For an authenticated mirror, use",
        "# mirrorgate's admission webhook: it rewrites the image and attaches a pull secret.",
    ]
    lines += [
        f"# The mirror {r.mirror} needs credential {_needs(r)}."
        if several
        else f"# This mirror needs credential {_needs(r)}."
        for r in mirrors
        if r.credentials
    ]
    lines.append(f"server = {_toml_string(server_url(first.source.host))}")
    for rule in mirrors:
        url, override = mirror_url(rule)
        lines += [
            "",
            f"[host.{_toml_string(url)}]",
            f"  capabilities = [{', '.join(_toml_string(c) for c in CAPABILITIES)}]",
        ]
        if override:
            lines.append("  override_path = true")
        lines += _transport_lines(rule)
    return "\n".join(lines) + "\n"


# --- the commands ----------------------------------------------------------


def _report(export: Export, err: TextIO) -> int:
    for note in export.notes:
        print(f"note: {note}", file=err)
    for warning in export.warnings:
        print(f"warning: {warning}", file=err)
    return EXIT_FINDINGS if export.warnings else EXIT_OK


def _write_atomically(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # containerd re-reads hosts.toml on every pull: never let it see half a file.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".hosts.toml.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise


def _cluster_policy(path: str, err: TextIO) -> policy.Policy:
    """The cluster's rules: a node's configuration serves every namespace, so a
    MirrorPolicy's rules (one namespace's) are said on stderr and left out."""
    loaded = policyfile.read_policy(path)
    for rules in loaded.composition.team_rules.values():
        for rule in rules:
            print(
                f"warning: {rule.label}: not exported: a namespace's rule cannot be node "
                "configuration (admission applies it)",
                file=err,
            )
    return loaded.policy


def run_containerd(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    mirror_ca = None if args.mirror_ca is None else reloaders.read_bundle(args.mirror_ca)
    export = containerd(_cluster_policy(args.policy, err), mirror_ca=mirror_ca)
    status = _report(export, err)
    directory = pathlib.Path(args.out)
    try:
        for relative, text in export.files.items():
            _write_atomically(directory / relative, text)
    except OSError as error:
        raise ConfigError(f"{args.out}: cannot write: {error.strerror or error}") from None
    for relative in export.files:
        print(f"wrote {directory / relative}", file=err)
    if not export.files:
        print("warning: no rule could be exported; nothing written", file=err)
        status = EXIT_FINDINGS
    return status
