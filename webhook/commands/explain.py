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
) -> dict[str, Any]:
    """What admission would do with ``image`` in a Pod of ``namespace``, as a JSON-ready object.

    Every key is always present (null when it does not apply). ``outcome`` and
    ``warning`` come from the functions admission itself decides with
    (:mod:`policy.decision`); without a policy there is no outcome. ``mode``
    is the effective one (see :data:`MODES`): under audit, ``result`` is the
    image as written and a rewrite is only reported. ``namespace_labels`` are
    the namespace's (``--namespace-label``), for grants by ``namespaceSelector``;
    none given, it has none.
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
        "match": None,
        "warning": None,
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
    )
    explained.update(
        outcome=decision.outcome,
        reason=decision.reason,
        warning=decision.warning,
        match=_match(found),
    )
    rule = decision.resolution.rule
    if rule is not None:
        explained.update(
            rule={
                "index": rule.index,
                "source": str(rule.source),
                "mirror": str(rule.mirror),
                "scheme": rule.scheme,
            },
            credential=rule.credential,
        )
        grant = mirror_policy.grants.get(rule.credential) if rule.credential is not None else None
        if grant is not None and grant.registry is not None:
            # The key of the generated .dockerconfigjson; null: the store entry's own.
            explained["credentialRegistry"] = str(grant.registry)
    if decision.outcome == "rewrite" and mode == ENFORCE:
        explained["result"] = decision.resolution.new_image
    return explained


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
        field, configured = f"{rule.label}.mirror", rule.mirror.host
    else:
        field, configured = f"{rule.label}.source", str(rule.source).partition("/")[0]
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
        credential = f" (credential {explained['credential']})" if explained["credential"] else ""
        if explained["result"] == explained["image"]:
            return f"audit mode: not rewritten (would go to {explained['rule']['mirror']})"
        return f"→ {explained['result']}{credential}"
    if not explained["valid"]:
        return str(explained["error"])
    if explained["outcome"] is None:
        return str(explained["reference"]["normalized"])
    return str(explained["reason"])


def render_explain_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One row per image: IMAGE, OUTCOME, then the new image or why it stays; warnings
    on a line of their own below their image."""
    width = max(len("IMAGE"), *(len(row["image"]) for row in rows))
    lines = [f"{'IMAGE':<{width}}  {'OUTCOME':<16}  DETAIL"]
    for row in rows:
        outcome = row["outcome"] or ("invalid" if not row["valid"] else "valid")
        lines.append(f"{row['image']:<{width}}  {outcome:<16}  {_explain_detail(row)}")
        if row["warning"] is not None:
            lines.append(f"{'':<{width}}  warning: {row['warning']}")
    return "\n".join(lines) + "\n"


def run_explain(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    mirror_policy = policyfile.read_policy(args.policy).policy if args.policy else None
    labels = dict(_label(text) for text in args.label)
    namespace_labels = dict(_label(text) for text in args.namespace_label)
    rows = [
        explain_image(
            image,
            mirror_policy=mirror_policy,
            namespace=args.namespace,
            labels=labels,
            mode=args.mode,
            namespace_labels=namespace_labels,
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
