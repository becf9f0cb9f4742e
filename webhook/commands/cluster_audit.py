"""`mirrorgate audit`: what the policy would make of the Pods a cluster already runs.

Read-only: it lists Pods and Namespaces (``list`` on both; with ``-n NS``,
``list`` Pods in each NS and ``get`` on each Namespace) and runs every
container image through the same policy engine as admission
(:func:`policy.decide_image` and :func:`policy.exempt_pod`), with the
namespace's labels as admission's Namespace cache holds them, for grants by
``namespaceSelector``. The Namespaces are read once, before the Pods, so that
each page of Pods is judged as it arrives. Nothing is written to the cluster.

The policy is ``--policy FILE`` when given (the file alone, as ``explain`` reads it).
Without it, the one the server serves: the ClusterMirrorPolicy and MirrorPolicy
objects (``list`` on both; with ``-n NS``, the MirrorPolicies of each NS only), read
once after the Namespaces and composed with their labels by the server's own
:func:`~mirrorgate.webhook.cluster.policyobjects.compose_stored`, so each
namespace is judged with its accepted MirrorPolicies' rules.

The outcomes and the JSON are those of :mod:`.audit_report`; the table is
:mod:`.audit_table`.

Exit codes: 0 done; 1 ``--fail-on unmirrored`` and some container is
unmirrored, or ``--fail-on rewrites`` and some container would be rewritten;
2 usage or configuration error, an unreadable policy, an unreachable API
server or a missing permission (the message names the verb and resource).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from mirrorgate import policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import EXIT_FINDINGS, EXIT_OK
from mirrorgate.webhook.commands.audit_report import (
    FAIL_ON,
    NamespaceReport,
    Report,
    judge,
    namespace_mode,
)
from mirrorgate.webhook.commands.audit_table import render_table, thousands
from mirrorgate.webhook.errors import ConfigError

if TYPE_CHECKING:
    from mirrorgate.webhook.cluster.kube import Kube, KubeError

__all__ = ["CLUSTER_OBJECTS", "FAIL_ON", "Report", "add_mirror_health", "audit_cluster", "run"]

PAGE_SIZE = 500
CLUSTER_OBJECTS = "cluster objects"
"""The report's policy without ``--policy``: the ClusterMirrorPolicy and MirrorPolicy
objects, as the server names them."""


# --- reading the cluster ---------------------------------------------------


class Progress:
    """``listed N pods`` on stderr, rewritten in place; silent unless stderr is a terminal."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.enabled = _isatty(err)
        self.count = 0

    def add(self, count: int) -> None:
        self.count += count
        if self.enabled:
            self.err.write(f"\rmirrorgate audit: listed {thousands(self.count)} pods…")
            self.err.flush()

    def done(self) -> None:
        if self.enabled and self.count:
            self.err.write("\r\x1b[K")  # erase the line: the report follows
            self.err.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _pod_pages(kube: Kube, path: str) -> Iterator[list[dict[str, Any]]]:
    """Pages of :data:`PAGE_SIZE` Pods, one at a time.

    Not ``Kube.list``: that returns every item at the end, and we want a
    progress tick per page and to aggregate each page before the next one is
    read, so that memory holds one page of Pods, never the whole cluster's.
    """
    query: dict[str, Any] = {"limit": PAGE_SIZE}
    while True:
        page = kube.get(path, **query)
        yield page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return
        query["continue"] = token


def _all_namespace_labels(kube: Kube) -> dict[str, dict[str, str] | None]:
    from mirrorgate.webhook.cluster import kube as kubeapi
    from mirrorgate.webhook.cluster.optin import labels_of

    items, _ = kube.list(kubeapi.namespaces_path(), limit=PAGE_SIZE)
    return {item["metadata"]["name"]: labels_of(item) for item in items}


def _namespace_labels(
    kube: Kube, names: Sequence[str], err: TextIO
) -> dict[str, dict[str, str] | None]:
    """Each namespace's labels; one the user may not ``get`` is reported as unknown."""
    from mirrorgate.webhook.cluster import kube as kubeapi
    from mirrorgate.webhook.cluster.optin import labels_of

    found: dict[str, dict[str, str] | None] = {}
    for name in names:
        try:
            found[name] = labels_of(kube.get(kubeapi.namespaces_path(name)))
        except kubeapi.NotFound:
            raise ConfigError(f"namespace {name!r} not found") from None
        except kubeapi.Forbidden as error:
            # Namespace-scoped roles often cannot read the Namespace object;
            # the Pods alone still make a useful report.
            print(
                f"warning: not allowed to get namespace {name!r}; its mode is reported "
                f"as unknown: {error.message}",
                file=err,
            )
            found[name] = None
    return found


def _explain(error: KubeError, verb: str, resource: str, where: str) -> ConfigError:
    from mirrorgate.webhook.cluster import kube as kubeapi

    if isinstance(error, kubeapi.Forbidden):
        return ConfigError(
            f"not allowed to {verb} {resource} {where}: {error.message} "
            "(audit needs list on pods and namespaces, and without --policy on "
            "clustermirrorpolicies and mirrorpolicies; -n NS needs list on pods and "
            "mirrorpolicies in NS)"
        )
    if isinstance(error, kubeapi.Unavailable):
        return ConfigError(f"cannot reach the API server: {error}")
    return ConfigError(f"cannot {verb} {resource} {where}: {error}")


def _stored_objects(
    kube: Kube, namespaces: Sequence[str] | None
) -> dict[policy.ObjectKey, dict[str, Any]]:
    """The ClusterMirrorPolicies and the MirrorPolicies (of ``namespaces``, or all), listed
    once. A kind the API server does not serve (its CRD not installed) has none."""
    from mirrorgate.webhook.cluster import kube as kubeapi
    from mirrorgate.webhook.cluster import policyobjects

    cluster, namespaced = policy.CLUSTER_KIND, policy.NAMESPACED_KIND
    reads = [(cluster, None), *((namespaced, ns) for ns in namespaces or ())]
    if namespaces is None:
        reads.append((namespaced, None))
    stored: dict[policy.ObjectKey, dict[str, Any]] = {}
    for kind, namespace in reads:
        try:
            items, _ = kube.list(policyobjects.objects_path(kind, namespace), limit=PAGE_SIZE)
        except kubeapi.NotFound:
            continue
        except kubeapi.KubeError as error:
            where = "at the cluster scope" if namespace is None else f"in namespace {namespace!r}"
            raise _explain(error, "list", policyobjects.RESOURCES[kind], where) from None
        for item in items:
            stored[policyobjects.key_of(item)] = item
    return stored


def _composition(
    kube: Kube,
    source: policy.Policy | policyfile.LoadedPolicy | None,
    namespaces: Sequence[str] | None,
    labels: Mapping[str, Mapping[str, str] | None],
) -> policy.Composition:
    """What each namespace is judged with: the policy given, the policy file's (a file of
    objects composed with the labels read, as ``explain`` composes it with those given),
    or (``source`` None) the cluster's objects composed with the labels, as the server
    composes them."""
    if isinstance(source, policy.Policy):
        return policy.from_policy(source)
    known = {name: found for name, found in labels.items() if found is not None}
    if source is not None:
        if not source.composition.verdicts:
            return source.composition  # a policy document: one policy everywhere
        return policyfile.read_policy(
            source.path, data=source.data, namespace_labels=known
        ).composition
    from mirrorgate.webhook.cluster import policyobjects

    stored = _stored_objects(kube, namespaces)
    return policyobjects.compose_stored(stored, known).loaded.composition


def audit_cluster(
    kube: Kube,
    mirror_policy: policy.Policy | policyfile.LoadedPolicy | None,
    *,
    namespaces: Sequence[str] | None,
    policy_path: str,
    err: TextIO,
    fail_on: str | None = None,
) -> Report:
    """List the Pods (of ``namespaces``, or all) and judge every image: with
    ``mirror_policy`` (a policy file's), or, None, with each namespace's policy composed
    from the ClusterMirrorPolicy and MirrorPolicy objects as the server composes it
    (listed once, after the Namespaces: those of ``namespaces`` only)."""
    from mirrorgate.webhook.cluster import kube as kubeapi

    report = Report(policy_path=policy_path, scope=namespaces, namespaces={}, fail_on=fail_on)
    progress = Progress(err)
    # Namespaces first, once, then the policy objects, once: each page of Pods is judged
    # as it is read, and grants by namespaceSelector need the labels then. A misspelt -n
    # name is an error, not an empty report.
    if namespaces is None:
        try:
            labels = _all_namespace_labels(kube)
        except kubeapi.KubeError as error:
            raise _explain(error, "list", "namespaces", "at the cluster scope") from None
        composition = _composition(kube, mirror_policy, namespaces, labels)
        _add_pods(
            report,
            kube,
            kubeapi.pods_path(),
            "at the cluster scope",
            composition,
            labels,
            progress,
        )
    else:
        labels = _namespace_labels(kube, namespaces, err)
        composition = _composition(kube, mirror_policy, namespaces, labels)
        for name in namespaces:
            _namespace(report, name, composition, labels)  # reported even without Pods
        for name in namespaces:
            _add_pods(
                report,
                kube,
                kubeapi.pods_path(name),
                f"in namespace {name!r}",
                composition,
                labels,
                progress,
            )
    return report


def add_mirror_health(report: Report) -> None:
    """Probe, once each, the mirrors of the planned rewrites (every mirror of their rules);
    judge those images again with what was found, the health beside each. Each namespace's
    rewrites are those of its own policy."""
    from mirrorgate.webhook.mirrorhealth import monitor

    tallies = [
        (ns, key, t)
        for ns in report.namespaces.values()
        for key, t in ns.images.items()
        if t.verdict.outcome == "rewrite"
    ]
    hosts: dict[int, tuple[policy.Policy, set[str]]] = {}
    for ns, _, tally in tallies:
        assert ns.mirror_policy is not None  # audit_cluster's namespaces have theirs
        by_label = {rule.label: rule for rule in ns.mirror_policy.rules}
        rule = by_label.get(str(tally.verdict.rule))
        if rule is not None:
            _, found = hosts.setdefault(id(ns.mirror_policy), (ns.mirror_policy, set()))
            found.update(r.mirror.host for r in ns.mirror_policy.mirror_list(rule))
    down: dict[str, str] = {}
    probed: set[str] = set()
    for mirror_policy, found in hosts.values():
        # A host is probed once, with the first policy that names it (its transport).
        todo = sorted(found - probed)
        probed.update(todo)
        if todo:
            down.update(monitor.probe_mirrors(mirror_policy, todo).down)
    health = policy.Health(down=down)
    for ns, (image, pull_never), tally in tallies:
        assert ns.mirror_policy is not None
        tally.verdict = judge(
            ns.mirror_policy, image, ns.name, health, labels=ns.labels, pull_never=pull_never
        )


def _add_pods(
    report: Report,
    kube: Kube,
    path: str,
    scope: str,
    composition: policy.Composition,
    labels: Mapping[str, Mapping[str, str] | None],
    progress: Progress,
) -> None:
    from mirrorgate.webhook.cluster import kube as kubeapi

    try:
        for page in _pod_pages(kube, path):
            for pod in page:
                name = str((pod.get("metadata") or {}).get("namespace") or "")
                _namespace(report, name, composition, labels).add_pod(pod)
            progress.add(len(page))
    except kubeapi.KubeError as error:
        raise _explain(error, "list", "pods", scope) from None
    finally:
        progress.done()  # a later page or namespace writes the line again


def _namespace(
    report: Report,
    name: str,
    composition: policy.Composition,
    labels: Mapping[str, Mapping[str, str] | None],
) -> NamespaceReport:
    found = report.namespaces.get(name)
    if found is None:
        # A namespace made after the Namespaces were read has no labels we know of: as in
        # admission before its cache holds it, its mode is unknown and only names grant.
        known = labels.get(name)
        mode, mode_label = namespace_mode(known)
        mirror_policy = composition.policy_for(name)
        found = report.namespaces[name] = NamespaceReport(
            name=name,
            mode=mode,
            mode_label=mode_label,
            excluded=mirror_policy.is_namespace_excluded(name),
            labels=known,
            mirror_policy=mirror_policy,
        )
    return found


# --- the command -----------------------------------------------------------


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.cluster import kube as kubeapi

    # The file, when given, is the whole policy: the cluster's objects are not read.
    loaded = policyfile.read_policy(args.policy) if args.policy else None
    try:
        kube = kubeapi.Kube.connect(kubeconfig=args.kubeconfig, context=args.context, timeout=30.0)
    except kubeapi.KubeError as error:
        raise ConfigError(str(error)) from None
    try:
        namespaces = (
            None
            if args.all_namespaces or not args.namespaces
            else list(dict.fromkeys(args.namespaces))
        )
        report = audit_cluster(
            kube,
            loaded,
            namespaces=namespaces,
            policy_path=args.policy or CLUSTER_OBJECTS,
            err=err,
            fail_on=args.fail_on,
        )
    finally:
        kube.close()
    if args.health:
        add_mirror_health(report)
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2), file=out)
    else:
        out.write(render_table(report))
    return EXIT_FINDINGS if report.failed else EXIT_OK
