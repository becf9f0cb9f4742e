"""Offline commands: `rewrite` shows Pods (and workloads' Pods) as they would be admitted;
`policy check` validates a policy file (`explain`, one image, is :mod:`.explain`).

They run the same planner and patch builder as the admission server, so what
they print is what admission would do (minus pull-secret creation, which
needs a cluster).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

import jsonpatch
import yaml

from mirrorgate import policy
from mirrorgate.webhook import patch, policyfile
from mirrorgate.webhook.commands import EXIT_FINDINGS, EXIT_OK
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.policyfile import boundedyaml

__all__ = [
    "TEMPLATE_PATHS",
    "NothingToRewrite",
    "load_documents",
    "pod_of",
    "rewrite_documents",
    "run_policy_check",
    "run_rewrite",
]

DEFAULT_NAMESPACE = "default"
ENFORCE, AUDIT, MODES = policy.ENFORCE, policy.AUDIT, policy.MODES
"""The effective mode of a namespace: its mirrorgate.io/mode label, or audit for every
namespace when the server runs --audit-only."""


def load_documents(text: str, *, source: str) -> list[Any]:
    """YAML or JSON documents from ``text`` (``kind: List`` items expanded)."""
    try:
        documents = [d for d in boundedyaml.load_all(text, source=source) if d is not None]
    except boundedyaml.YAMLError as error:
        raise ConfigError(str(error)) from None
    return list(_expand_lists(documents))


def _expand_lists(documents: Sequence[Any]) -> Iterator[Any]:
    for document in documents:
        if (
            isinstance(document, dict)
            and document.get("kind") == "List"
            and isinstance(document.get("items"), list)
        ):
            yield from document["items"]
        else:
            yield document


def _metadata(document: dict[str, Any]) -> dict[str, Any]:
    metadata = document.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _describe(document: Any) -> str:
    if not isinstance(document, dict):
        return f"a {type(document).__name__}"
    metadata = _metadata(document)
    name = metadata.get("name") or metadata.get("generateName") or "<unnamed>"
    return f"{document.get('kind', '<no kind>')}/{name}"


# Where each workload kind keeps the template its controller makes Pods from.
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "PodTemplate": ("template",),
}


class NothingToRewrite(ValueError):
    """The input holds no Pod and no workload."""


def _template(document: dict[str, Any], path: Sequence[str]) -> Any:
    value: Any = document
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def pod_of(document: dict[str, Any]) -> dict[str, Any] | None:
    """The Pod ``document`` is, or the one its workload's controller would create.

    A workload's Pod carries its template's metadata and spec, the workload's
    namespace, and ``generateName`` as controllers set it. None when the
    workload has no usable template.
    """
    if document.get("kind") == "Pod":
        return document
    template = _template(document, TEMPLATE_PATHS[document["kind"]])
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        return None
    workload = _metadata(document)
    metadata = {**_metadata(template)}
    for key in ("name", "namespace"):
        metadata.pop(key, None)
    if workload.get("namespace"):
        metadata["namespace"] = workload["namespace"]
    metadata["generateName"] = f"{workload.get('name') or document['kind'].lower()}-"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": copy.deepcopy(template["spec"]),
    }


def rewrite_documents(
    documents: Sequence[Any],
    *,
    mirror_policy: policy.Policy | policy.Composition,
    namespace: str | None,
    mode: str = ENFORCE,
) -> tuple[list[Any], list[list[patch.Operation]], list[str]]:
    """Each Pod, and each workload's Pod, as admission would admit it; patches; warnings.

    ``mirror_policy`` is a policy file's, or the objects' composition: then each
    Pod is planned with its namespace's policy.

    Workloads (:data:`TEMPLATE_PATHS`) come out as the Pod their controller
    would create, mutated: mirrorgate never changes the templates themselves.
    Other objects (a Service, a ConfigMap) are passed over; an input with no
    Pod and no workload raises :class:`NothingToRewrite`. In ``audit`` mode
    (the namespace's label, or a server run with --audit-only) Pods come out
    unchanged and every planned rewrite is a warning.
    """
    composition = (
        mirror_policy
        if isinstance(mirror_policy, policy.Composition)
        else policy.from_policy(mirror_policy)
    )
    outputs: list[Any] = []
    patches: list[list[patch.Operation]] = []
    warnings: list[str] = []
    for document in documents:
        if not (
            isinstance(document, dict)
            and (document.get("kind") == "Pod" or document.get("kind") in TEMPLATE_PATHS)
        ):
            continue
        prefix = f"{_describe(document)}: "
        obj = pod_of(document)
        if obj is None:
            path = ".".join(TEMPLATE_PATHS[document["kind"]])
            warnings.append(f"{prefix}no Pod template with a spec at {path}")
            continue
        pod_namespace = namespace or _metadata(document).get("namespace") or DEFAULT_NAMESPACE
        plan = policy.plan(
            obj,
            namespace=str(pod_namespace),
            mirror_policy=composition.policy_for(str(pod_namespace)),
        )
        warnings.extend(prefix + w for w in plan.warnings)
        if mode == AUDIT:
            warnings.extend(prefix + policy.audit_mode_line(r) for r in plan.rewrites)
            outputs.append(obj)
            patches.append([])
            continue
        ops = patch.build_patch(obj, plan)
        patches.append(ops)
        outputs.append(jsonpatch.apply_patch(copy.deepcopy(obj), ops) if ops else obj)
    if not outputs and not warnings:
        found = ", ".join(_describe(d) for d in documents[:5]) or "nothing"
        raise NothingToRewrite(
            f"no Pod and no workload ({', '.join(TEMPLATE_PATHS)}) to rewrite; found {found}"
        )
    return outputs, patches, warnings


def dumps_json(value: Any) -> str:
    return json.dumps(value, sort_keys=False, separators=(",", ":"))


# --- the commands ----------------------------------------------------------


def _read_input(path: str, stdin: TextIO) -> tuple[str, str]:
    if path == "-":
        return stdin.read(), "<stdin>"
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(), path
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None


MANIFEST_SUFFIXES = (".json", ".yaml", ".yml")
"""The files `rewrite -f DIR` reads, as kubectl -f DIR does (not recursively)."""
MAX_MANIFEST_FILES = 1000
"""Files of one `rewrite -f DIR`: a directory of more is refused, not read."""


def _manifest_files(directory: str) -> list[str]:
    try:
        with os.scandir(directory) as entries:
            names = sorted(
                e.name for e in entries if e.name.endswith(MANIFEST_SUFFIXES) and e.is_file()
            )
    except OSError as error:
        raise ConfigError(f"{directory}: cannot read: {error.strerror}") from None
    if not names:
        raise ConfigError(f"{directory}: a directory without {', '.join(MANIFEST_SUFFIXES)} files")
    if len(names) > MAX_MANIFEST_FILES:
        raise ConfigError(
            f"{directory}: {len(names):,} manifest files; at most {MAX_MANIFEST_FILES:,} at once"
        )
    return [os.path.join(directory, name) for name in names]


def _read_documents(path: str, stdin: TextIO) -> tuple[list[Any], str]:
    """The documents of FILE, of stdin ('-'), or of DIR's manifest files in name order."""
    if path == "-" or not os.path.isdir(path):
        text, source = _read_input(path, stdin)
        return load_documents(text, source=source), source
    documents: list[Any] = []
    for file in _manifest_files(path):
        text, source = _read_input(file, stdin)
        documents.extend(load_documents(text, source=source))
    return documents, path


def run_rewrite(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    mirror_policy = policyfile.read_policy(args.policy).composition
    documents, source = _read_documents(args.filename, sys.stdin)
    try:
        outputs, patches, warnings = rewrite_documents(
            documents, mirror_policy=mirror_policy, namespace=args.namespace, mode=args.mode
        )
    except NothingToRewrite as error:
        raise ConfigError(f"{source}: {error}") from None
    for warning in warnings:
        print(f"warning: {warning}", file=err)
    if args.output == "patch":
        for ops in patches:
            print(dumps_json(ops), file=out)
    elif args.output == "json":
        value = (
            outputs[0]
            if len(outputs) == 1
            else {"apiVersion": "v1", "kind": "List", "items": outputs}
        )
        print(json.dumps(value, indent=2), file=out)
    else:
        yaml.safe_dump_all(outputs, out, sort_keys=False)
    return EXIT_FINDINGS if warnings else EXIT_OK


def run_policy_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    data = policyfile.read_policy_bytes(args.file)
    try:
        loaded = policyfile.read_policy(args.file, data=data)
    except ConfigError as error:
        # Here an invalid policy is the finding, not a usage error.
        print(error, file=out)
        return EXIT_FINDINGS
    mirror_policy = loaded.policy
    # The store (its key first) is read before anything is printed: a store that
    # cannot be read is a usage error (exit 2), never "valid" and then an error.
    stored = None if args.store_file is None else _read_store(args)
    verdicts = loaded.composition.verdicts
    rules = len(mirror_policy.rules) + sum(map(len, loaded.composition.team_rules.values()))
    objects = f"{len(verdicts)} object{'s' if len(verdicts) != 1 else ''}, " if verdicts else ""
    print(
        f"{args.file}: valid (version {loaded.version}, {objects}"
        f"{rules} mirror rule{'s' if rules != 1 else ''}, "
        f"{len(mirror_policy.grants)} credential grant"
        f"{'s' if len(mirror_policy.grants) != 1 else ''}{_deliveries(mirror_policy)})",
        file=out,
    )
    for warning in mirror_policy.warnings:  # valid, though rarely meant: said, not failed
        print(f"  warning: {warning}", file=out)
    for key, verdict in verdicts.items():
        if not verdict.accepted:  # only for want of its namespace's labels
            print(
                f"  warning: {key}: not judged: {verdict.message.splitlines()[0]}; "
                "explain -n NAMESPACE --namespace-label judges it with them",
                file=out,
            )
        elif key.kind != policy.CLUSTER_KIND:  # the cluster's are in the policy's warnings
            for warning in verdict.warnings:
                print(f"  warning: {key}: {warning}", file=out)
    if stored is None:
        return EXIT_OK
    from mirrorgate.webhook.mirrorhealth import monitor

    problems = monitor.credential_problems(mirror_policy, stored)
    for name, why in sorted(problems.items()):
        # The same words the server logs and lists in /readyz.
        print(f"  credential {name}: {why} ({args.store_file})", file=out)
    return EXIT_FINDINGS if problems else EXIT_OK


def _deliveries(mirror_policy: policy.Policy) -> str:
    """``; delivery pullSecret: a, b; delivery kubelet: c``: who holds each login (a copy in
    every granted namespace, or no one but the kubelet's plugin), in the one summary line."""
    groups = [
        (delivery, sorted(n for n, g in mirror_policy.grants.items() if g.delivery == delivery))
        for delivery in policy.DELIVERIES
    ]
    return "".join(f"; delivery {d}: {', '.join(names)}" for d, names in groups if names)


def _read_store(args: argparse.Namespace) -> Mapping[str, Credential]:
    from mirrorgate.webhook.commands.credentials import store_key
    from mirrorgate.webhook.credentials import filestore

    return filestore.read_store(args.store_file, store_key(args)).credentials
