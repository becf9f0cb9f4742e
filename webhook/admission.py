"""The admission decision for one review: plan, make sure pull secrets exist, answer.

This is the only orchestration on the request path. It does no network I/O
in steady state: the policy is in memory, the plans of the Pod shapes seen
are kept (:mod:`webhook.admissioncache`), and the pull-secret check is a
lookup in memory; the API is called only when a generated Secret is missing
or stale. Planning is final: what the cluster answers is applied to the plan
(:meth:`policy.RewritePlan.without`), never planned again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import orjson

from mirrorgate import policy
from mirrorgate.dnsnames import DNS_LABEL_RE
from mirrorgate.webhook import patch, podupdate, review
from mirrorgate.webhook.admissioncache import AdmissionCache, Admitted, AuditReport

__all__ = ["Decision", "PullSecrets", "Target", "admit", "for_planning", "screen"]

ReviewOutcome = Literal["patched", "allowed", "denied", "skipped", "ignored"]
Operation = Literal["create", "update", "ephemeral"]
"""A Pod's CREATE, its UPDATE, or an UPDATE of its ephemeralcontainers subresource
(kubectl debug): the three operations admission plans."""
EPHEMERAL: tuple[policy.SiteField, ...] = ("ephemeralContainers",)
# A namespace name is a DNS label (RFC 1123). The API server sends only
# names of namespaces that exist; anything else is not a review from it.
NAMESPACE_RE = DNS_LABEL_RE
POD_NAME_LOG_LIMIT = 253
MAX_CONTAINERS = 1000
"""Images of one Pod (its containers of every list, and its image volumes) that admission
plans: the default of `serve --max-containers`. Planning costs in proportion to them, on the
event loop that every admission shares; a Pod with more is refused in an enforce namespace
and reported in an audit one, never planned."""


class PullSecrets(Protocol):
    """Makes sure generated pull secrets exist and are current in a namespace."""

    def missing(self, namespace: str, credentials: Sequence[str]) -> list[str]:
        """The credentials whose Secret is not known to be current (memory only, no I/O)."""
        ...

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels as mirrorgate's own cache holds them (memory only); None
        while not known. Grants by ``namespaceSelector`` read them."""
        ...

    async def ensure(self, namespace: str, credentials: Sequence[str]) -> dict[str, str]:
        """Create or update their Secrets; return ``{credential: reason}`` for failures.

        Must finish well inside the webhook timeout, failing rather than waiting.
        """
        ...


class Decision(NamedTuple):
    """The response body plus what the logs and metrics need to know about it."""

    body: review.AdmissionReview
    mode: policy.Mode
    outcome: ReviewOutcome
    namespace: str = ""
    name: str = ""
    rewrites: int = 0
    warnings: int = 0
    unmirrored: tuple[tuple[policy.UnmirroredReason, int], ...] = ()
    """Images a rule covers (or, past --max-containers, that were not checked) admitted as
    written, counted by why."""
    plan: policy.RewritePlan | None = None
    """The plan decided on, with each image's outcome (None for reviews not about a Pod)."""


def _pod_name(metadata: object) -> str:
    if not isinstance(metadata, Mapping):
        return ""
    name = metadata.get("name") or metadata.get("generateName") or ""
    # For the log line: a Pod reaches admission before its name is validated.
    return policy.prefix(name, limit=POD_NAME_LOG_LIMIT) if isinstance(name, str) else ""


def _audit_log_annotations(plan: policy.RewritePlan, *, health: bool = False) -> dict[str, str]:
    """The rewrites for the API server's audit log; ``health`` adds each mirror's health."""
    # The API server prefixes each key with the webhook's name.
    if not plan.rewrites:
        return {}
    return {
        "rewrites": orjson.dumps(
            {
                r.site.key: {"from": r.site.image, "to": r.new_image, "rule": r.rule_label}
                | ({"health": r.health} if health else {})
                for r in plan.rewrites
            }
        ).decode()
    }


def _audit_mode_report(plan: policy.RewritePlan) -> AuditReport:
    """Audit mode's warnings and audit annotations for ``plan``."""
    return (
        (*plan.warnings, *(policy.audit_mode_line(r, health=True) for r in plan.rewrites)),
        _audit_log_annotations(plan, health=True),
    )


def _planned(
    request: review.AdmissionRequest,
    obj: dict[str, Any],
    *,
    namespace: str,
    mirror_policy: policy.Policy,
    operation: Operation,
    health: policy.Health,
    cache: AdmissionCache,
    labels: Mapping[str, str] | None,
) -> Admitted:
    if operation == "create":
        return cache.admitted(
            obj,
            namespace=namespace,
            mirror_policy=mirror_policy,
            health=health,
            namespace_labels=labels,
        )
    # An update is planned against its old object, never answered from the cache's
    # CREATE plans: only the images it changes are planned, and a running Pod's
    # imagePullSecrets cannot change. An ephemeral-container update may only add
    # containers, and the API server ignores any other change, annotations
    # included: the record of an original goes to the user as a warning and to
    # the audit log instead (see admit).
    fields = EPHEMERAL if operation == "ephemeral" else policy.SITE_FIELDS
    return Admitted(
        policy.plan(
            podupdate.as_it_was_labelled(obj, request.get("oldObject")),
            namespace=namespace,
            mirror_policy=mirror_policy,
            fields=fields,
            previous=podupdate.previous_images(request, fields),
            can_add_pull_secrets=False,
            can_annotate=operation == "update",
            health=health,
            resolve=cache.resolver(mirror_policy),
            namespace_labels=labels,
        )
    )


def _container_count(
    request: review.AdmissionRequest, obj: dict[str, Any], *, operation: Operation
) -> int:
    """The images planning would walk: every site, or an update's ephemeral ones (old too).

    An UPDATE counts the larger of the Pod before and after it: the Pod was
    admitted under the limit, and an update may not push it over.
    """
    old = request.get("oldObject")
    old_spec = old.get("spec") if type(old) is dict else None
    if operation == "ephemeral":
        return policy.container_count(obj.get("spec"), EPHEMERAL) + policy.container_count(
            old_spec, EPHEMERAL
        )
    count = policy.container_count(obj.get("spec"))
    return max(count, policy.container_count(old_spec)) if operation == "update" else count


_REQUEST_KEYS = ("uid", "kind", "operation", "subResource", "namespace", "dryRun")


def for_planning(rev: review.Review) -> review.Review:
    """``rev`` reduced to what :func:`admit` and the endpoint read of it: the same
    decision, from a review small enough to hand from a worker process to the loop."""
    whole: Mapping[str, object] = rev.request
    request = {key: whole[key] for key in _REQUEST_KEYS if key in whole}
    for key in ("object", "oldObject"):
        if key in whole:
            request[key] = policy.planning_view(whole[key])
    return review.Review(rev.api_version, request)  # type: ignore[arg-type]


class Target(NamedTuple):
    """A review :func:`screen` passed on to planning: the Pod and where it is going."""

    obj: dict[str, Any]
    namespace: str
    name: str
    operation: Operation


def _operation(request: review.AdmissionRequest) -> Operation | None:
    """Which planned operation ``request`` is, or None: a review admission lets pass."""
    kind = request["kind"]
    if kind.get("group") != "" or kind.get("kind") != "Pod":
        # Only Pods are mutated, never the templates operators and GitOps tools diff.
        return None
    operation, subresource = request["operation"], request.get("subResource", "")
    if operation == "CREATE" and not subresource:
        return "create"
    if operation == "UPDATE" and not subresource:
        return "update"
    if operation == "UPDATE" and subresource == "ephemeralcontainers":
        return "ephemeral"
    return None  # status, binding, resize...: no image changes there


def _too_wide(
    rev: review.Review, mode: policy.Mode, namespace: str, name: str, count: int, limit: int
) -> Decision:
    """The answer for a Pod past ``--max-containers``: refused to enforce, reported to audit."""
    what = (
        f"mirrorgate: the Pod names {count:,} images (containers and image volumes), more "
        f"than the {limit:,} it checks (serve --max-containers)"
    )
    if mode == policy.ENFORCE:
        message = f"{what}; refused, as every image must be on a mirror here"
        return Decision(review.denied(rev, message), mode, "denied", namespace, name)
    warning = f"{what}; its images are left as written, unchecked"
    return Decision(
        review.allowed(rev, warnings=[warning], audit_annotations={"too-many-containers": what}),
        mode,
        "skipped",
        namespace,
        name,
        0,
        1,
        (("too-many-containers", count),),
    )


def screen(
    rev: review.Review, *, mode: policy.Mode, max_containers: int = MAX_CONTAINERS
) -> Decision | Target:
    """What can be decided without the policy: a review that is not about a Pod to mutate,
    or a Pod of more than ``max_containers`` images (refused under ``enforce``, admitted as
    written under ``audit``, saying so either way).

    Raises :class:`review.BadReview` for malformed requests. Pure: a worker
    process runs it on large reviews (see :mod:`webhook.edge.offload`).
    """
    request = rev.request
    operation = _operation(request)
    if operation is None:
        return Decision(review.allowed(rev), mode, "ignored")

    obj = request.get("object")
    if type(obj) is not dict:
        raise rev.bad("request.object is missing or not an object")
    metadata = obj.get("metadata")
    namespace = (metadata.get("namespace") if type(metadata) is dict else None) or request.get(
        "namespace"
    )
    if not isinstance(namespace, str) or not namespace:
        raise rev.bad("neither request.namespace nor the Pod's metadata.namespace is set")
    if NAMESPACE_RE.fullmatch(namespace) is None:
        raise rev.bad(f"namespace {policy.quote(namespace, limit=64)} is not a namespace name")
    name = _pod_name(metadata)
    count = _container_count(request, obj, operation=operation)
    if count > max_containers:
        return _too_wide(rev, mode, namespace, name, count, max_containers)
    return Target(obj, namespace, name, operation)


def _counted(
    plan: policy.RewritePlan, mode: policy.Mode
) -> tuple[tuple[policy.UnmirroredReason, int], ...]:
    """The images ``plan`` leaves as written although a rule covers them, by why.

    In an audit namespace every one is, for the namespace's own reason: the
    rewrites audit does not make and the images enforce would leave too.
    """
    if mode == policy.AUDIT:
        covered = len(plan.rewrites) + len(plan.unmirrored)
        return (("audit", covered),) if covered else ()
    counts: dict[policy.UnmirroredReason, int] = {}
    for reason in plan.unmirrored.values():
        counts[reason] = counts.get(reason, 0) + 1
    return tuple(counts.items())


def _unattachable_message(plan: policy.RewritePlan, operation: Operation) -> str:
    """Why an update whose new images need a pull secret the running Pod lacks is refused."""
    needs = "; ".join(
        f"{site.shown} ({policy.quote(site.image)}) needs {secret!r}"
        for site, secret in plan.unattachable
    )
    if operation == "ephemeral":
        return (
            f"mirrorgate: {needs}, which the Pod's imagePullSecrets lack and an ephemeral "
            "container cannot add; onCredentialError is deny. Recreate the Pod to use "
            "this image, or debug with an image whose mirror needs no new pull secret"
        )
    return (
        f"mirrorgate: {needs}, which the Pod's imagePullSecrets lack and cannot gain on a "
        "running Pod. Recreate the Pod (delete it, or roll its workload) to use this image"
    )


async def admit(
    rev: review.Review,
    *,
    mirror_policy: policy.Policy | Callable[[str], policy.Policy],
    mode: policy.Mode,
    secrets: PullSecrets,
    health: policy.Health = policy.HEALTHY,
    max_containers: int = MAX_CONTAINERS,
    cache: AdmissionCache | None = None,
) -> Decision:
    """Decide on one review. Raises :class:`review.BadReview` for malformed requests only.

    ``mirror_policy`` is the policy, or what gives the Pod's namespace its own (in a
    cluster, a namespace with a MirrorPolicy has one: ``LoadedPolicy.policy_for``).

    ``health`` is the probes' last conclusion, passed in: deciding never waits
    for the network. A Pod of more than ``max_containers`` images is not
    planned (see :func:`screen`). ``cache`` keeps CREATE plans between calls
    (the server's one :class:`AdmissionCache`); without it each review is
    planned afresh. An update whose changed image needs a pull secret the Pod
    lacks is refused (a running Pod's imagePullSecrets cannot change); for an
    ephemeral container, only under ``onCredentialError: deny``.
    """
    screened = screen(rev, mode=mode, max_containers=max_containers)
    if isinstance(screened, Decision):
        return screened
    request = rev.request
    obj, namespace, name, operation = screened
    chosen = mirror_policy(namespace) if callable(mirror_policy) else mirror_policy

    admitted = _planned(
        request,
        obj,
        namespace=namespace,
        mirror_policy=chosen,
        operation=operation,
        health=health,
        cache=AdmissionCache() if cache is None else cache,
        # Read only where a grant selects by label: memory, never the API.
        labels=secrets.namespace_labels(namespace) if chosen.has_selectors else None,
    )
    plan = admitted.plan
    if plan.skipped is not None:
        return Decision(
            review.allowed(rev, warnings=plan.warnings),
            mode,
            "skipped",
            namespace,
            name,
            0,
            len(plan.warnings),
            plan=plan,
        )

    if mode == policy.AUDIT:
        lines, annotations = admitted.audit_report(lambda: _audit_mode_report(plan))
        return Decision(
            review.allowed(rev, warnings=lines, audit_annotations=annotations),
            mode,
            "allowed",
            namespace,
            name,
            len(plan.rewrites),
            len(lines),
            _counted(plan, mode),
            plan,
        )

    if plan.denials:  # onNotGranted: deny; audit has warned of them above
        message = "mirrorgate: " + "; ".join(plan.denials)
        return Decision(review.denied(rev, message), mode, "denied", namespace, name, plan=plan)

    if plan.unattachable and (operation == "update" or chosen.on_credential_error == "deny"):
        return Decision(
            review.denied(rev, _unattachable_message(plan, operation)),
            mode,
            "denied",
            namespace,
            name,
            plan=plan,
        )

    if plan.credentials and not request.get("dryRun", False):
        stale = secrets.missing(namespace, plan.credentials)
        failures = await secrets.ensure(namespace, stale) if stale else {}
        if failures:
            if chosen.on_credential_error == "deny":
                reasons = "; ".join(
                    f"pull secret {policy.pull_secret_name(c)!r}: {why}"
                    for c, why in sorted(failures.items())
                )
                return Decision(
                    review.denied(
                        rev,
                        f"mirrorgate: the Pod needs mirror credentials that "
                        f"could not be provided in namespace {namespace!r} "
                        f"({reasons}); onCredentialError is deny",
                    ),
                    mode,
                    "denied",
                    namespace,
                    name,
                    plan=plan,
                )
            plan = plan.without(failures)
            admitted = Admitted(plan)

    warnings = plan.warnings
    ephemeral = operation == "ephemeral"
    if ephemeral:
        warnings += tuple(
            f"mirrorgate: {r.site.shown} uses {r.new_image} (was {r.site.image})"
            for r in plan.rewrites
        )
    encoded = admitted.patch(lambda: patch.encoded_patch(obj, plan))
    # The rewrites are in the patch itself, which the API server's audit log
    # records at RequestResponse level; audit annotations are for audit mode.
    return Decision(
        review.patched(
            rev,
            encoded,
            warnings=warnings,
            audit_annotations=_audit_log_annotations(plan) if ephemeral else None,
        ),
        mode,
        "patched" if encoded else "allowed",
        namespace,
        name,
        len(plan.rewrites),
        len(warnings),
        _counted(plan, mode),
        plan,
    )
