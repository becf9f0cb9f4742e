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
    ``insecureSkipVerify: true`` becomes ``skip_verify = true``. A mirror
    reached other than by verified HTTPS also gets a hosts.toml of its own
    (``DIR/<mirror host>/hosts.toml``): admission rewrites images to the
    mirror host, and containerd must know how to reach it for those too.

``mirrorgate export cri-o --policy FILE``
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
from collections.abc import Iterable
from typing import TextIO

from mirrorgate import policy
from mirrorgate.policy.reference import DEFAULT_DOMAIN
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import EXIT_FINDINGS, EXIT_OK
from mirrorgate.webhook.errors import ConfigError

__all__ = ["CRI_O_DROP_IN", "Export", "containerd", "cri_o", "run_containerd", "run_cri_o"]

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


def _credential_notes(rules: Iterable[policy.MirrorRule], runtime: str) -> list[str]:
    needing = [r for r in rules if r.credential is not None]
    notes = [f"no credentials are written ({runtime}); {ADMISSION_HINT}"]
    notes += [
        f"{_describe(r)}: the mirror needs credential {r.credential!r}, which this "
        f"file cannot carry"
        for r in needing
    ]
    return notes


# --- containerd ------------------------------------------------------------


def containerd(mirror_policy: policy.Policy) -> Export:
    """One ``<host>/hosts.toml`` per source registry with a whole-host rule."""
    whole = {
        r.source.host: r for r in mirror_policy.rules if not r.source.wildcard and not r.source.path
    }
    warnings: list[str] = []
    for rule in mirror_policy.rules:
        if rule.source.wildcard:
            warnings.append(
                f"{_describe(rule)}: not exported: containerd has one hosts.toml "
                "per registry host and no wildcard hosts"
            )
        elif rule.source.path:
            warnings.append(_partial_warning(rule, whole.get(rule.source.host)))
    files = {f"{host}/hosts.toml": _hosts_toml(rule) for host, rule in sorted(whole.items())}
    mirror_files, mirror_warnings = _mirror_hosts(mirror_policy, whole)
    files.update(sorted(mirror_files.items()))
    warnings += mirror_warnings
    notes = _credential_notes(
        whole.values(), "containerd no longer supports plain-text credentials in hosts.toml"
    )
    return Export(files=files, warnings=warnings, notes=notes)


def _partial_warning(rule: policy.MirrorRule, whole: policy.MirrorRule | None) -> str:
    text = (
        f"{_describe(rule)}: not exported: hosts.toml configures whole registries, not "
        f"repository paths"
    )
    if whole is not None:
        text += (
            f"; with these files, {rule.source} images are pulled through "
            f"{whole.label}'s mirror {whole.mirror} instead"
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
    mirror_policy: policy.Policy, sources: Iterable[str]
) -> tuple[dict[str, str], list[str]]:
    """A hosts.toml for each mirror host reached other than by verified HTTPS.

    Rewritten images name the mirror host itself; without this file containerd
    would pull them over verified HTTPS and fail. A mirror host that is also
    a source keeps the source's file (its mirror wins), with a warning.
    """
    taken = set(sources)
    files: dict[str, str] = {}
    warnings: list[str] = []
    for rule in mirror_policy.rules:
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


def _hosts_toml(rule: policy.MirrorRule) -> str:
    url, override = mirror_url(rule)
    lines = [
        f"# containerd hosts.toml for {rule.source}",
        f"# written by `mirrorgate export containerd` from the policy's {rule.label}:",
        f"# {rule.source} → {rule.mirror}.",
        "# containerd tries the mirror first, then the server.",
        "#",
        "# No credentials are written here: containerd no longer supports plain-text",
        "# registry credentials in hosts.toml. For an authenticated mirror, use",
        "# mirrorgate's admission webhook: it rewrites the image and attaches a pull secret.",
    ]
    if rule.credential is not None:
        lines.append(f"# This mirror needs credential {rule.credential!r}.")
    lines += [
        f"server = {_toml_string(server_url(rule.source.host))}",
        "",
        f"[host.{_toml_string(url)}]",
        f"  capabilities = [{', '.join(_toml_string(c) for c in CAPABILITIES)}]",
    ]
    if override:
        lines.append("  override_path = true")
    lines += _transport_lines(rule)
    return "\n".join(lines) + "\n"


# --- CRI-O -----------------------------------------------------------------

CRI_O_DROP_IN = "/etc/containers/registries.conf.d/50-mirrorgate.conf"


def cri_o(mirror_policy: policy.Policy) -> Export:
    """A registries.conf v2 drop-in with one ``[[registry]]`` per expressible rule."""
    warnings: list[str] = []
    blocks: list[str] = []
    for rule in mirror_policy.rules:
        if rule.source.wildcard:
            warnings.append(
                f"{_describe(rule)}: not exported: a registries.conf mirror replaces the whole "
                f"host matched by {rule.source}, but mirrorgate's mirror keeps that host as "
                f"the first path component ({rule.mirror}/<host>/…)"
            )
            continue
        blocks.append(_registry_block(rule))
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


def _registry_block(rule: policy.MirrorRule) -> str:
    prefix = str(rule.source)
    credential = f" (needs credential {rule.credential!r})" if rule.credential else ""
    insecure = "insecure = true\n" if _insecure(rule) else ""
    return (
        f"# {rule.label}: {rule.source} → {rule.mirror}{credential}\n"
        f"[[registry]]\n"
        f"prefix = {_toml_string(prefix)}\n"
        f"location = {_toml_string(prefix)}\n"
        f"\n"
        f"[[registry.mirror]]\n"
        f"location = {_toml_string(str(rule.mirror))}\n"
        f"{insecure}"
    )


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


def run_containerd(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    export = containerd(policyfile.read_policy(args.policy).policy)
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


def run_cri_o(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    export = cri_o(policyfile.read_policy(args.policy).policy)
    status = _report(export, err)
    out.write(export.files["registries.conf"])
    return status
