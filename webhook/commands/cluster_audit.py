"""`mirrorgate audit`: what the policy would make of the Pods a cluster already runs.

Read-only: it lists Pods and Namespaces (``list`` on both; with ``-n NS``,
``list`` Pods in each NS and ``get`` on each Namespace) and runs every
container image through the same policy engine as admission
(:func:`policy.decide_image` and :func:`policy.exempt_pod`), with the
namespace's labels as admission's Namespace cache holds them, for grants by
``namespaceSelector``. The Namespaces are read once, before the Pods, so that
each page of Pods is judged as it arrives. Nothing is written to the cluster.

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

__all__ = ["FAIL_ON", "Report", "audit_cluster", "run"]

PAGE_SIZE = 500


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
            "(audit needs list on pods and namespaces; -n NS needs list on "
            "pods in NS)"
        )
    if isinstance(error, kubeapi.Unavailable):
        return ConfigError(f"cannot reach the API server: {error}")
    return ConfigError(f"cannot {verb} {resource} {where}: {error}")


def audit_cluster(
    kube: Kube,
    mirror_policy: policy.Policy,
    *,
    namespaces: Sequence[str] | None,
    policy_path: str,
    err: TextIO,
    fail_on: str | None = None,
) -> Report:
    """List the Pods (of ``namespaces``, or all) and judge every image."""
    from mirrorgate.webhook.cluster import kube as kubeapi

    report = Report(policy_path=policy_path, scope=namespaces, namespaces={}, fail_on=fail_on)
    progress = Progress(err)
    # Namespaces first, once: each page of Pods is judged as it is read, and grants by
    # namespaceSelector need the labels then. A misspelt -n name is an error, not an
    # empty report.
    if namespaces is None:
        try:
            labels = _all_namespace_labels(kube)
        except kubeapi.KubeError as error:
            raise _explain(error, "list", "namespaces", "at the cluster scope") from None
        _add_pods(
            report,
            kube,
            kubeapi.pods_path(),
            "at the cluster scope",
            mirror_policy,
            labels,
            progress,
        )
    else:
        labels = _namespace_labels(kube, namespaces, err)
        for name in namespaces:
            _namespace(report, name, mirror_policy, labels)  # reported even without Pods
        for name in namespaces:
            _add_pods(
                report,
                kube,
                kubeapi.pods_path(name),
                f"in namespace {name!r}",
                mirror_policy,
                labels,
                progress,
            )
    return report


def add_mirror_health(report: Report, mirror_policy: policy.Policy) -> None:
    """Probe, once each, the mirrors of the planned rewrites (every mirror of their rules);
    judge those images again with what was found, the health beside each."""
    from mirrorgate.webhook.mirrorhealth import monitor

    by_label = {rule.label: rule for rule in mirror_policy.rules}
    tallies = [
        (ns, key, t)
        for ns in report.namespaces.values()
        for key, t in ns.images.items()
        if t.verdict.outcome == "rewrite" and t.verdict.rule in by_label
    ]
    hosts = sorted(
        {
            r.mirror.host
            for _, _, t in tallies
            for r in mirror_policy.mirror_list(by_label[str(t.verdict.rule)])
        }
    )
    health = monitor.probe_mirrors(mirror_policy, hosts)
    for ns, (image, pull_never), tally in tallies:
        tally.verdict = judge(
            mirror_policy, image, ns.name, health, labels=ns.labels, pull_never=pull_never
        )


def _add_pods(
    report: Report,
    kube: Kube,
    path: str,
    scope: str,
    mirror_policy: policy.Policy,
    labels: Mapping[str, Mapping[str, str] | None],
    progress: Progress,
) -> None:
    from mirrorgate.webhook.cluster import kube as kubeapi

    try:
        for page in _pod_pages(kube, path):
            for pod in page:
                name = str((pod.get("metadata") or {}).get("namespace") or "")
                _namespace(report, name, mirror_policy, labels).add_pod(pod, mirror_policy)
            progress.add(len(page))
    except kubeapi.KubeError as error:
        raise _explain(error, "list", "pods", scope) from None
    finally:
        progress.done()  # a later page or namespace writes the line again


def _namespace(
    report: Report,
    name: str,
    mirror_policy: policy.Policy,
    labels: Mapping[str, Mapping[str, str] | None],
) -> NamespaceReport:
    found = report.namespaces.get(name)
    if found is None:
        # A namespace made after the Namespaces were read has no labels we know of: as in
        # admission before its cache holds it, its mode is unknown and only names grant.
        known = labels.get(name)
        mode, mode_label = namespace_mode(known)
        found = report.namespaces[name] = NamespaceReport(
            name=name,
            mode=mode,
            mode_label=mode_label,
            excluded=mirror_policy.is_namespace_excluded(name),
            labels=known,
        )
    return found


# --- the command -----------------------------------------------------------


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.cluster import kube as kubeapi

    mirror_policy = policyfile.read_policy(args.policy).policy
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
            mirror_policy,
            namespaces=namespaces,
            policy_path=args.policy,
            err=err,
            fail_on=args.fail_on,
        )
    finally:
        kube.close()
    if args.health:
        add_mirror_health(report, mirror_policy)
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2), file=out)
    else:
        out.write(render_table(report))
    return EXIT_FINDINGS if report.failed else EXIT_OK
