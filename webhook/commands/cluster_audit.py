"""`mirrorgate audit`: what the policy would make of the Pods a cluster already runs.

Read-only: it lists Pods and Namespaces (``list`` on both; with ``-n NS``,
``list`` Pods in each NS and ``get`` on each Namespace) and runs every
container image through the same policy engine as admission
(:func:`policy.decide_image` and :func:`policy.exempt_pod`).
Nothing is written to the cluster.

Outcomes, per container image and namespace
-------------------------------------------
``rewrite``      a rule covers it; admission would replace it by ``new_image``
``not-granted``  a rule covers it, but the rule's credential is not granted to
                 the namespace: admission would leave it as written
``unmatched``    no rule covers it
``invalid``      not a valid image reference (or its mirror name would not be)
``on-mirror``    already under a rule's mirror prefix (``reason`` is set when
                 that rule's credential is not granted to the namespace: the
                 Pod would get no pull secret for it)
``excluded``     matched by ``exclude.images``

Pods labelled ``mirrorgate.io/skip=true`` and static-Pod mirrors (owned by the
kubelet) are counted as *skipped* and their images are not examined; nor are
those of namespaces the policy excludes (``exclude.namespaces``, and always
``kube-system``). The namespace's ``mirrorgate.io/mode`` label is reported as
``none``, ``audit`` or ``enforce`` (any other value is ``none``: the webhook
ignores it), or ``unknown`` when the Namespace could not be read.
Outcomes are those of the policy, whatever the label: the report shows what
opting a namespace in would change.

"Unmirrored" (``--fail-on unmirrored``, ``summary.unmirrored``) counts the
containers whose image is not already on a mirror: outcomes ``rewrite``,
``not-granted``, ``unmatched`` and ``invalid``. Excluded images, excluded
namespaces and skipped Pods never count.

Exit codes: 0 done; 1 ``--fail-on unmirrored`` and some container is
unmirrored, or ``--fail-on rewrites`` and some container would be rewritten;
2 usage or configuration error, an unreadable policy, an unreachable API
server or a missing permission (the message names the verb and resource).

JSON output (``-o json``), version 1
------------------------------------
One object; every key is always present (``null`` when it does not apply),
lists are sorted, and new keys may be added within version 1::

    {
      "version": 1,
      "policy": "policy.yaml",                   # the --policy argument
      "scope": {"all_namespaces": true, "namespaces": []},   # or false and the -n list
      "fail_on": null,                           # or "unmirrored" / "rewrites"
      "failed": false,                           # whether --fail-on tripped (exit 1)
      "summary": {
        "namespaces": 3,                         # namespaces reported (below)
        "excluded_namespaces": 1,
        "pods": 2005,                            # every Pod listed, skipped included
        "skipped_pods": 1,
        "unmirrored": 2003,                      # containers, as defined above
        "containers": {"rewrite": 2000, "not-granted": 1, "unmatched": 1,
                       "invalid": 1, "on-mirror": 1, "excluded": 1},
        "images": {...same keys...}              # distinct image strings per outcome
      },
      "namespaces": [                            # by name; with -A only those with Pods
        {
          "name": "team-a",
          "mode": "enforce",                     # none | audit | enforce | unknown
          "mode_label": "enforce",               # the label's raw value, or null
          "excluded": false,                     # excluded namespaces list no images
          "pods": 2003, "skipped_pods": 1,
          "containers": {...outcome counts...},
          "images": [                            # by outcome (order above), then most
            {                                    # Pods first, then image
              "image": "nginx:1.27",             # exactly as written in the Pod
              "outcome": "rewrite",
              "pods": 2000,                      # Pods using it (skipped ones aside)
              "containers": 2000,                # containers using it
              "new_image": "harbor.corp.example/dockerhub-proxy/library/nginx:1.27",
              "rule": "mirrors[0]",              # the deciding rule, or null
              "credential": "harbor-pull",       # that rule's credential, or null
              "reason": null,                    # why, for not-granted / invalid / on-mirror
              "health": "up"                     # rewrite only: "up" or why the mirror cannot
            }                                    # be used now (null: --no-health)
          ]
        }
      ]
    }
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TextIO, cast

from mirrorgate import policy
from mirrorgate.policy.model import MODES
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import EXIT_FINDINGS, EXIT_OK
from mirrorgate.webhook.policyfile import ConfigError

if TYPE_CHECKING:
    from mirrorgate.webhook.cluster.kube import Kube, KubeError

__all__ = ["FAIL_ON", "JSON_VERSION", "OUTCOMES", "UNMIRRORED", "Report", "audit_cluster", "run"]

JSON_VERSION = 1
PAGE_SIZE = 500

AuditOutcome = Literal["rewrite", "not-granted", "unmatched", "invalid", "on-mirror", "excluded"]
# Display order: what needs attention first.
OUTCOMES: tuple[AuditOutcome, ...] = (
    "rewrite",
    "not-granted",
    "unmatched",
    "invalid",
    "on-mirror",
    "excluded",
)
UNMIRRORED: frozenset[AuditOutcome] = frozenset({"rewrite", "not-granted", "unmatched", "invalid"})
FAIL_ON: dict[str, frozenset[AuditOutcome]] = {
    "unmirrored": UNMIRRORED,
    "rewrites": frozenset({"rewrite"}),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What the policy does with one image string in one namespace."""

    outcome: AuditOutcome
    new_image: str | None = None
    rule: str | None = None
    credential: str | None = None
    reason: str | None = None
    health: str | None = None
    """For ``rewrite``: ``up``, or why the mirror cannot be used now (None: not probed)."""


# Version 1 of the JSON names two of admission's outcomes as it always has.
_V1_NAMES: dict[str, AuditOutcome] = {"no-rule": "unmatched", "already-mirrored": "on-mirror"}


def judge(rules: policy.Policy, image: str, namespace: str) -> Verdict:
    """The audit outcome of ``image`` in ``namespace``: admission's own decision."""
    decision = policy.decide_image(rules.resolve(image), namespace=namespace, mirror_policy=rules)
    outcome = _V1_NAMES.get(decision.outcome, cast("AuditOutcome", decision.outcome))
    rule = decision.resolution.rule
    label, credential = (rule.label, rule.credential) if rule is not None else (None, None)
    if outcome in ("excluded", "unmatched"):
        return Verdict(outcome)
    if outcome == "rewrite":
        return Verdict(
            outcome, new_image=decision.resolution.new_image, rule=label, credential=credential
        )
    # A reason only where admission would warn: the Pod would not get what it needs.
    reason = decision.reason if decision.warning is not None else None
    if outcome == "not-granted":
        reason = f"{reason}; left as written"
    return Verdict(outcome, rule=label, credential=credential, reason=reason)


@dataclasses.dataclass(slots=True)
class ImageTally:
    verdict: Verdict
    pods: int = 0
    containers: int = 0


@dataclasses.dataclass
class NamespaceReport:
    """Every image of one namespace's Pods, grouped by image string."""

    name: str
    mode: str
    mode_label: str | None
    excluded: bool
    pods: int = 0
    skipped_pods: int = 0
    images: dict[str, ImageTally] = dataclasses.field(default_factory=dict)

    def add_pod(self, pod: Mapping[str, Any], rules: policy.Policy) -> None:
        self.pods += 1
        if self.excluded:
            return
        metadata = pod.get("metadata") or {}
        if (
            policy.exempt_pod(
                namespace=self.name,
                labels=metadata.get("labels") or {},
                annotations=metadata.get("annotations") or {},
                mirror_policy=rules,
            )
            is not None
        ):
            self.skipped_pods += 1
            return
        sites, _ = policy.find_image_sites(pod)  # malformed containers: the API rejects them
        seen: set[str] = set()
        for site in sites:
            tally = self.images.get(site.image)
            if tally is None:
                # Judged once per image and namespace: 300 replicas cost one lookup.
                tally = self.images[site.image] = ImageTally(judge(rules, site.image, self.name))
            tally.containers += 1
            if site.image not in seen:
                seen.add(site.image)
                tally.pods += 1

    def counts(self) -> dict[AuditOutcome, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for tally in self.images.values():
            counts[tally.verdict.outcome] += tally.containers
        return counts

    def rows(self) -> list[tuple[str, ImageTally]]:
        """Images by outcome, then most Pods first, then name: stable for diffs."""
        order = {outcome: i for i, outcome in enumerate(OUTCOMES)}
        return sorted(
            self.images.items(),
            key=lambda item: (order[item[1].verdict.outcome], -item[1].pods, item[0]),
        )


def namespace_mode(labels: Mapping[str, str] | None) -> tuple[str, str | None]:
    """(mode, raw label): an unreadable Namespace is ``unknown``."""
    if labels is None:
        return "unknown", None
    raw = labels.get(policy.MODE_LABEL)
    return (raw if raw in MODES else "none"), raw


@dataclasses.dataclass
class Report:
    """The whole audit: per-namespace reports plus what was asked."""

    policy_path: str
    scope: Sequence[str] | None
    """The -n namespaces, or None for all."""
    namespaces: dict[str, NamespaceReport]
    fail_on: str | None = None

    def totals(self) -> tuple[dict[AuditOutcome, int], dict[AuditOutcome, int]]:
        """(containers, distinct images) per outcome, over every namespace."""
        containers = dict.fromkeys(OUTCOMES, 0)
        images: dict[AuditOutcome, set[str]] = {o: set() for o in OUTCOMES}
        for ns in self.namespaces.values():
            for image, tally in ns.images.items():
                containers[tally.verdict.outcome] += tally.containers
                images[tally.verdict.outcome].add(image)
        return containers, {o: len(s) for o, s in images.items()}

    @property
    def failed(self) -> bool:
        if self.fail_on is None:
            return False
        containers, _ = self.totals()
        return any(containers[o] for o in FAIL_ON[self.fail_on])

    def ordered(self) -> list[NamespaceReport]:
        return [self.namespaces[name] for name in sorted(self.namespaces)]

    def to_json(self) -> dict[str, Any]:
        containers, images = self.totals()
        spaces = self.ordered()
        return {
            "version": JSON_VERSION,
            "policy": self.policy_path,
            "scope": {"all_namespaces": self.scope is None, "namespaces": sorted(self.scope or ())},
            "fail_on": self.fail_on,
            "failed": self.failed,
            "summary": {
                "namespaces": len(spaces),
                "excluded_namespaces": sum(ns.excluded for ns in spaces),
                "pods": sum(ns.pods for ns in spaces),
                "skipped_pods": sum(ns.skipped_pods for ns in spaces),
                "unmirrored": sum(containers[o] for o in OUTCOMES if o in UNMIRRORED),
                "containers": containers,
                "images": images,
            },
            "namespaces": [_namespace_json(ns) for ns in spaces],
        }


def _namespace_json(ns: NamespaceReport) -> dict[str, Any]:
    return {
        "name": ns.name,
        "mode": ns.mode,
        "mode_label": ns.mode_label,
        "excluded": ns.excluded,
        "pods": ns.pods,
        "skipped_pods": ns.skipped_pods,
        "containers": ns.counts(),
        "images": [
            {
                "image": image,
                "outcome": t.verdict.outcome,
                "pods": t.pods,
                "containers": t.containers,
                "new_image": t.verdict.new_image,
                "rule": t.verdict.rule,
                "credential": t.verdict.credential,
                "reason": t.verdict.reason,
                "health": t.verdict.health,
            }
            for image, t in ns.rows()
        ],
    }


# --- the table -------------------------------------------------------------

COUNT_WIDTH, OUTCOME_WIDTH = 7, 11
# Continuation lines (the new image, the reason) start under the IMAGE column.
DETAIL_INDENT = " " * (2 + COUNT_WIDTH + 2 + OUTCOME_WIDTH + 2)


def _n(value: int) -> str:
    return f"{value:,}"


def _plural(count: int, word: str) -> str:
    return f"{_n(count)} {word}{'' if count == 1 else 's'}"


def render_table(report: Report) -> str:
    """Fits 80 columns except for long image names, which are never cut."""
    spaces = report.ordered()
    lines = [
        f"mirrorgate audit: {_plural(len(spaces), 'namespace')}, "
        f"{_plural(sum(ns.pods for ns in spaces), 'pod')}",
        f"policy: {report.policy_path}",
    ]
    for ns in spaces:
        lines.append("")
        lines.extend(_namespace_lines(ns))
    lines.append("")
    lines.extend(_summary_lines(report, spaces))
    return "\n".join(lines) + "\n"


def _namespace_lines(ns: NamespaceReport) -> Iterator[str]:
    head = f"NAMESPACE {ns.name}  mode: {ns.mode}  pods: {_n(ns.pods)}"
    if ns.skipped_pods:
        head += f" ({_n(ns.skipped_pods)} skipped)"
    if ns.excluded:
        yield head + "  excluded by the policy"
        return
    yield head
    if not ns.images:
        yield "  (no images to examine)"
        return
    yield f"  {'PODS':>{COUNT_WIDTH}}  {'STATUS':<{OUTCOME_WIDTH}}  IMAGE"
    for image, tally in ns.rows():
        verdict = tally.verdict
        yield f"  {_n(tally.pods):>{COUNT_WIDTH}}  {verdict.outcome:<{OUTCOME_WIDTH}}  {image}"
        if verdict.new_image is not None:
            yield f"{DETAIL_INDENT}→ {verdict.new_image}"
            if verdict.credential is not None:
                # With several credentials on one mirror host, which one a
                # rewritten image gets is part of the answer.
                yield f"{DETAIL_INDENT}  with credential {verdict.credential}"
        for note in (
            verdict.reason,
            None if verdict.health is None else f"health: {verdict.health}",
        ):
            if note is None:
                continue
            # Notes wrap at 80 columns; image names never do (they are copied).
            for line in textwrap.wrap(
                f"({note})",
                width=80 - len(DETAIL_INDENT),
                break_long_words=False,
                break_on_hyphens=False,
            ):
                yield DETAIL_INDENT + line


def _summary_lines(report: Report, spaces: Sequence[NamespaceReport]) -> Iterator[str]:
    containers, images = report.totals()
    yield f"SUMMARY  {'':<{OUTCOME_WIDTH}}  {'CONTAINERS':>10}  {'IMAGES':>8}"
    for outcome in OUTCOMES:
        yield (
            f"  {outcome:<{OUTCOME_WIDTH + 7}}  {_n(containers[outcome]):>10}  "
            f"{_n(images[outcome]):>8}"
        )
    excluded = [ns for ns in spaces if ns.excluded]
    skipped = sum(ns.skipped_pods for ns in spaces)
    yield (
        f"  skipped pods: {_n(skipped)}   excluded namespaces: {_n(len(excluded))} "
        f"({_plural(sum(ns.pods for ns in excluded), 'pod')})"
    )
    unmirrored = sum(containers[o] for o in UNMIRRORED)
    yield (
        f"  unmirrored: {_plural(unmirrored, 'container')} (rewrite, not-granted, "
        "unmatched, invalid)"
    )
    if report.fail_on is not None:
        verdict = "FAILED" if report.failed else "passed"
        yield f"--fail-on {report.fail_on}: {verdict}"


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
            self.err.write(f"\rmirrorgate audit: listed {_n(self.count)} pods…")
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
    """Pages of ``limit=500`` Pods, one at a time.

    Not ``Kube.list``: that returns every item at the end, and we want a
    progress tick per page and to aggregate each page while the next one is
    on its way to memory (10,000 Pods are ~100 MB of dicts at once).
    """
    query: dict[str, Any] = {"limit": PAGE_SIZE}
    while True:
        page = kube.get(path, **query)
        yield page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return
        query["continue"] = token


def _labels(item: Mapping[str, Any]) -> dict[str, str]:
    return dict((item.get("metadata") or {}).get("labels") or {})


def _cluster_namespaces(kube: Kube) -> dict[str, dict[str, str] | None]:
    from mirrorgate.webhook.cluster import kube as kubeapi

    items, _ = kube.list(kubeapi.namespaces_path(), limit=PAGE_SIZE)
    return {item["metadata"]["name"]: _labels(item) for item in items}


def _named_namespaces(
    kube: Kube, names: Sequence[str], err: TextIO
) -> dict[str, dict[str, str] | None]:
    """Each namespace's labels; one the user may not ``get`` is reported as unknown."""
    from mirrorgate.webhook.cluster import kube as kubeapi

    found: dict[str, dict[str, str] | None] = {}
    for name in names:
        try:
            found[name] = _labels(kube.get(kubeapi.namespaces_path(name)))
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
    rules: policy.Policy,
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
    if namespaces is None:
        _add_pods(report, kube, kubeapi.pods_path(), "at the cluster scope", rules, progress)
        try:
            labels = _cluster_namespaces(kube)
        except kubeapi.KubeError as error:
            raise _explain(error, "list", "namespaces", "at the cluster scope") from None
    else:
        # Namespaces first: a misspelt name is an error, not an empty report.
        labels = _named_namespaces(kube, namespaces, err)
        for name in namespaces:
            _namespace(report, name, rules)  # reported even when it has no Pods
        for name in namespaces:
            _add_pods(
                report, kube, kubeapi.pods_path(name), f"in namespace {name!r}", rules, progress
            )
    for ns in report.namespaces.values():
        # A namespace made after the Pods were listed has no labels we know of.
        ns.mode, ns.mode_label = namespace_mode(labels.get(ns.name))
    return report


def add_mirror_health(report: Report, rules: policy.Policy) -> None:
    """Probe, once each, the mirrors of the planned rewrites; note their health beside them."""
    from mirrorgate.webhook.mirrorhealth import monitor

    by_label = {rule.label: rule for rule in rules.rules}
    tallies = [
        t
        for ns in report.namespaces.values()
        for t in ns.images.values()
        if t.verdict.outcome == "rewrite" and t.verdict.rule in by_label
    ]
    hosts = sorted({by_label[str(t.verdict.rule)].mirror.host for t in tallies})
    found = monitor.probe_mirrors(rules, hosts)
    for tally in tallies:
        tally.verdict = dataclasses.replace(
            tally.verdict, health=found.status(by_label[str(tally.verdict.rule)])
        )


def _add_pods(
    report: Report, kube: Kube, path: str, scope: str, rules: policy.Policy, progress: Progress
) -> None:
    from mirrorgate.webhook.cluster import kube as kubeapi

    try:
        for page in _pod_pages(kube, path):
            for pod in page:
                name = str((pod.get("metadata") or {}).get("namespace") or "")
                _namespace(report, name, rules).add_pod(pod, rules)
            progress.add(len(page))
    except kubeapi.KubeError as error:
        raise _explain(error, "list", "pods", scope) from None
    finally:
        progress.done()  # a later page or namespace writes the line again


def _namespace(report: Report, name: str, rules: policy.Policy) -> NamespaceReport:
    found = report.namespaces.get(name)
    if found is None:
        found = report.namespaces[name] = NamespaceReport(
            name=name, mode="unknown", mode_label=None, excluded=rules.is_namespace_excluded(name)
        )
    return found


# --- the command -----------------------------------------------------------


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.cluster import kube as kubeapi

    rules = policyfile.read_policy(args.policy).policy
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
            rules,
            namespaces=namespaces,
            policy_path=args.policy,
            err=err,
            fail_on=args.fail_on,
        )
    finally:
        kube.close()
    if args.health:
        add_mirror_health(report, rules)
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2), file=out)
    else:
        out.write(render_table(report))
    return EXIT_FINDINGS if report.failed else EXIT_OK
