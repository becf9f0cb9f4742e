"""`explain`: what admission would do with one image, offline.

It asks the functions admission itself decides with (:mod:`policy.decision`),
so what it prints is what admission would do (minus pull-secret creation,
which needs a cluster).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from mirrorgate import policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import EXIT_FINDINGS, EXIT_OK
from mirrorgate.webhook.commands.offline import ENFORCE, dumps_json
from mirrorgate.webhook.errors import ConfigError

__all__ = ["explain_image", "render_explain_table", "run_explain"]


def explain_image(
    image: str,
    *,
    mirror_policy: policy.Policy | None,
    namespace: str,
    labels: Mapping[str, str] | None = None,
    mode: str = ENFORCE,
    namespace_labels: Mapping[str, str] | None = None,
    health: policy.Health = policy.HEALTHY,
    pull_policy: str | None = None,
) -> dict[str, Any]:
    """What admission would do with ``image`` in a Pod of ``namespace``, as a JSON-ready object.

    Every key is always present (null when it does not apply). ``outcome`` and
    ``warning`` come from the functions admission itself decides with
    (:mod:`policy.decision`); without a policy there is no outcome. ``mode``
    is the effective one (see :data:`MODES`): under audit, ``result`` is the
    image as written and a rewrite is only reported. ``namespace_labels`` are
    the namespace's (``--namespace-label``), for grants by ``namespaceSelector``;
    none given, it has none. ``pull_policy`` is the container's ``imagePullPolicy``.
    ``chain`` lists the rules tried and passed over before the deciding one
    (``onNotGranted: next``), each with why; ``denied`` is whether the Pod would
    be refused (``onNotGranted: deny``, enforce only). ``health`` is what probes
    found (``--probe``; all up without it): of a rule's mirrors, ``mirrors`` shows
    each and which one serves.
    """
    explained: dict[str, Any] = {
        "image": image,
        "mode": mode,
        "valid": True,
        "error": None,
        "reference": None,
        "outcome": None,
        "reason": None,
        "rule": None,
        "result": None,
        "credential": None,
        "credentialRegistry": None,
        "delivery": None,
        "match": None,
        "warning": None,
        "chain": [],
        "denied": False,
        "mirrors": None,
    }
    try:
        ref = policy.parse_normalized(image)
    except policy.InvalidReferenceError as error:
        explained.update(valid=False, error=error.reason)
    else:
        explained["reference"] = {
            "domain": ref.domain,
            "path": ref.path,
            "tag": ref.tag,
            "digest": ref.digest,
            "name": ref.name,
            "normalized": str(ref),
        }
    if mirror_policy is None:
        return explained
    explained["result"] = image
    exemption = policy.exempt_pod(
        namespace=namespace, labels=labels or {}, annotations={}, mirror_policy=mirror_policy
    )
    if exemption is not None:
        explained.update(outcome=exemption.outcome, reason=exemption.reason)
        return explained
    found = mirror_policy.resolve(image)
    decision = policy.decide_image(
        found,
        namespace=namespace,
        mirror_policy=mirror_policy,
        labels=namespace_labels if namespace_labels is not None else {},
        pull_never=pull_policy == policy.NEVER,
    )
    explained.update(
        outcome=decision.outcome,
        reason=decision.reason,
        warning=decision.warning,
        match=_match(decision.resolution),
        chain=[
            {"rule": rule.label, "source": str(rule.source), "reason": why}
            for rule, why in decision.passed
        ],
        denied=decision.denial is not None and mode == ENFORCE,
    )
    rule = decision.resolution.rule
    result = decision.resolution.new_image
    credential = decision.credential
    if decision.outcome == "rewrite":
        choice = policy.choose_mirror(
            decision.resolution,
            health=health,
            mirror_policy=mirror_policy,
            namespace=namespace,
            labels=namespace_labels if namespace_labels is not None else {},
        )
        assert choice is not None  # decide_image said rewrite: some mirror is granted
        rule, result, credential = choice.rule, choice.new_image, choice.credential
        explained.update(
            _health_verdict(image, choice), mirrors=_mirrors(decision.resolution, choice)
        )
    if rule is not None:
        explained.update(
            rule={
                "index": rule.index,
                "source": str(rule.source),
                "mirror": str(rule.mirror),
                "scheme": rule.scheme,
                "credentials": list(rule.credentials),
                # The object it is in, when it is in one (a policy file's is not).
                **({"object": rule.origin} if rule.origin else {}),
            },
            # The one the namespace would use; where none can be, the rule's only one.
            credential=credential or (rule.credentials[0] if len(rule.credentials) == 1 else None),
        )
        credential = explained["credential"]
        grant = mirror_policy.grants.get(credential) if credential is not None else None
        if grant is not None:
            # pullSecret: a copy in the namespace; kubelet: the node's plugin, no copy.
            explained["delivery"] = grant.delivery
        if grant is not None and grant.registry is not None:
            # The key of the generated .dockerconfigjson; null: the store entry's own.
            explained["credentialRegistry"] = str(grant.registry)
    if explained["outcome"] == "rewrite" and mode == ENFORCE:
        explained["result"] = result
    return explained


def _health_verdict(image: str, choice: policy.Choice) -> dict[str, Any]:
    """The outcome, reason and warning admission gives under the probes' health."""
    verdict: dict[str, Any] = {}
    warning = policy.health_warning(image, choice)
    if warning is not None:
        verdict["warning"] = warning
    if choice.problem is not None and choice.rule.on_mirror_down == "fallback":
        verdict.update(outcome="mirror-unhealthy", reason=choice.problem)
    return verdict


def _mirrors(found: policy.Resolution, choice: policy.Choice) -> list[dict[str, Any]]:
    """Each mirror of the rule in order: the one chosen, those passed over and why, and
    those after it, not tried."""
    assert found.rule is not None
    reasons = {p.rule.label: p.reason for p in choice.passed}
    rows = []
    for rule in (found.rule, *(s.rule for s in found.standbys)):
        if rule == choice.rule and (choice.problem is None or rule.on_mirror_down == "keep"):
            status = "chosen"
        else:
            status = "passed-over" if rule.label in reasons else "not-tried"
        rows.append(
            {
                "rule": rule.label,
                "mirror": str(rule.mirror),
                "credentials": list(rule.credentials),
                "status": status,
                "reason": reasons.get(rule.label),
            }
        )
    return rows


def _match(found: policy.Resolution) -> dict[str, str | None] | None:
    """Which spelling of the image's host met which host of the policy, and as what.

    Hosts are compared as the network sees them (lower case; no ``:443`` over
    HTTPS; Docker Hub's aliases are docker.io): ``comparedAs`` is that form.
    """
    if found.host is None or found.reference is None:
        return None
    rule = found.rule
    if found.outcome == "excluded" or rule is None:
        field, configured = "exclude.images", None
    elif found.outcome == "on-mirror":
        field, configured = rule.field("mirror"), rule.mirror.host
    else:
        field, configured = rule.field("source"), str(rule.source).partition("/")[0]
    return {
        "host": found.reference.domain,
        "comparedAs": found.host,
        "field": field,
        "ruleHost": configured,
    }


def _label(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise ConfigError(f"--label {text!r}: write KEY=VALUE")
    return key, value


def _explain_detail(explained: Mapping[str, Any]) -> str:
    match = explained["match"]
    detail = _outcome_detail(explained)
    if match is None or match["host"] == match["comparedAs"]:
        return detail
    against = f"{match['field']} {match['ruleHost']}" if match["ruleHost"] else match["field"]
    return f"{detail} (host {match['host']} met {against} as {match['comparedAs']})"


def _outcome_detail(explained: Mapping[str, Any]) -> str:
    if explained["outcome"] == "rewrite":
        credential = (
            f" (credential {explained['credential']}, delivery {explained['delivery']})"
            if explained["credential"]
            else ""
        )
        if explained["result"] == explained["image"]:
            return f"audit mode: not rewritten (would go to {explained['rule']['mirror']})"
        return f"→ {explained['result']}{credential}{_passed_over(explained['mirrors'])}"
    if not explained["valid"]:
        return str(explained["error"])
    if explained["outcome"] is None:
        return str(explained["reference"]["normalized"])
    return str(explained["reason"])


def _passed_over(mirrors: Sequence[Mapping[str, Any]] | None) -> str:
    """The mirrors of a list passed over before the one chosen, for the table."""
    passed = [
        f"{m['mirror']}: {m['reason']}" for m in mirrors or () if m["status"] == "passed-over"
    ]
    return f"; passed over {'; '.join(passed)}" if passed else ""


def render_explain_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One row per image: IMAGE, OUTCOME, then the new image or why it stays; warnings
    on a line of their own below their image."""
    width = max(len("IMAGE"), *(len(row["image"]) for row in rows))
    outcomes = [row["outcome"] or ("invalid" if not row["valid"] else "valid") for row in rows]
    column = max(16, *map(len, outcomes))
    lines = [f"{'IMAGE':<{width}}  {'OUTCOME':<{column}}  DETAIL"]
    for row, outcome in zip(rows, outcomes, strict=True):
        lines.append(f"{row['image']:<{width}}  {outcome:<{column}}  {_explain_detail(row)}")
        for passed in row["chain"]:
            lines.append(f"{'':<{width}}  passed over {passed['rule']}: {passed['reason']}")
        if row["warning"] is not None:
            lines.append(f"{'':<{width}}  warning: {row['warning']}")
    return "\n".join(lines) + "\n"


def _probe(mirror_policy: policy.Policy, images: Sequence[str]) -> policy.Health:
    """One probe of each mirror the images could go to: what ``--probe`` chooses with."""
    from mirrorgate.webhook.mirrorhealth import monitor

    hosts = {
        rule.mirror.host
        for found in map(mirror_policy.resolve, images)
        if found.outcome == "rewrite" and found.rule is not None
        for rule in (found.rule, *(s.rule for s in found.standbys))
    }
    return monitor.probe_mirrors(mirror_policy, sorted(hosts))


def run_explain(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    labels = dict(_label(text) for text in args.label)
    namespace_labels = dict(_label(text) for text in args.namespace_label)
    # A MirrorPolicy granted by namespaceSelector is judged with the labels given.
    mirror_policy = (
        policyfile.read_policy(
            args.policy, namespace_labels={args.namespace: namespace_labels}
        ).composition.policy_for(args.namespace)
        if args.policy
        else None
    )
    health = (
        _probe(mirror_policy, args.images)
        if args.probe and mirror_policy is not None
        else policy.HEALTHY
    )
    rows = [
        explain_image(
            image,
            mirror_policy=mirror_policy,
            namespace=args.namespace,
            labels=labels,
            mode=args.mode,
            namespace_labels=namespace_labels,
            health=health,
            pull_policy=args.pull_policy,
        )
        for image in args.images
    ]
    if args.output == "table":
        out.write(render_explain_table(rows))
    else:
        for explained in rows:
            print(dumps_json(explained), file=out)
    findings = any(not row["valid"] or row["warning"] is not None for row in rows)
    return EXIT_FINDINGS if findings else EXIT_OK
