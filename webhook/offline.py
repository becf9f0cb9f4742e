"""Offline commands: `rewrite` shows Pods as they would be admitted; `explain` one image.

They run the same planner and patch builder as the admission server, so what
they print is what admission would do (minus pull-secret creation, which
needs a cluster).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jsonpatch
import yaml

import policy
from webhook import patch
from webhook.policyfile import ConfigError

__all__ = ["explain_image", "load_documents", "rewrite_documents"]

DEFAULT_NAMESPACE = "default"


def load_documents(text: str, *, source: str) -> list[Any]:
    """YAML or JSON documents from ``text`` (``kind: List`` items expanded)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        raise ConfigError(f"{where}: not valid YAML or JSON: "
                          f"{getattr(error, 'problem', None) or error}") from None
    return list(_expand_lists(documents))


def _expand_lists(documents: Sequence[Any]) -> Iterator[Any]:
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == "List" \
                and isinstance(document.get("items"), list):
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


def rewrite_documents(
        documents: Sequence[Any], *, rules: policy.Policy, namespace: str | None,
) -> tuple[list[Any], list[list[patch.Operation]], list[str]]:
    """Each document as admission would leave it, each Pod's patch, and the warnings.

    Documents that are not Pods pass through unchanged with a warning:
    mirrorgate mutates Pods only, never workload templates.
    """
    outputs: list[Any] = []
    patches: list[list[patch.Operation]] = []
    warnings: list[str] = []
    for document in documents:
        if not (isinstance(document, dict) and document.get("kind") == "Pod"):
            warnings.append(f"{_describe(document)}: not a Pod; mirrorgate mutates Pods only")
            outputs.append(document)
            continue
        pod_namespace = namespace or _metadata(document).get("namespace") or DEFAULT_NAMESPACE
        plan = policy.plan(document, namespace=str(pod_namespace), policy=rules)
        prefix = f"{_describe(document)}: "
        warnings.extend(prefix + w for w in plan.warnings)
        if rules.mode == "audit":
            warnings.extend(prefix + policy.audit_line(r) for r in plan.rewrites)
            outputs.append(document)
            patches.append([])
            continue
        ops = patch.build_patch(document, plan)
        patches.append(ops)
        outputs.append(jsonpatch.apply_patch(copy.deepcopy(document), ops) if ops else document)
    return outputs, patches, warnings


def explain_image(image: str, *, rules: policy.Policy | None, namespace: str,
                  labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What admission would do with ``image`` in a Pod of ``namespace``, as a JSON-ready object.

    Every key is always present (null when it does not apply). ``outcome`` and
    ``warning`` come from the functions admission itself decides with
    (:mod:`policy.decision`); without a policy there is no outcome.
    """
    explained: dict[str, Any] = {
        "image": image, "valid": True, "error": None, "reference": None, "outcome": None,
        "reason": None, "rule": None, "result": None, "credential": None, "warning": None,
    }
    try:
        ref = policy.parse_normalized(image)
    except policy.InvalidReferenceError as error:
        explained.update(valid=False, error=error.reason)
    else:
        explained["reference"] = {
            "domain": ref.domain, "path": ref.path, "tag": ref.tag, "digest": ref.digest,
            "name": ref.name, "normalized": str(ref)}
    if rules is None:
        return explained
    explained["result"] = image
    exemption = policy.exempt_pod(namespace=namespace, labels=labels or {}, annotations={},
                                  policy=rules)
    if exemption is not None:
        explained.update(outcome=exemption.outcome, reason=exemption.reason)
        return explained
    decision = policy.decide_image(image, namespace=namespace, policy=rules)
    explained.update(outcome=decision.outcome, reason=decision.reason, warning=decision.warning)
    rule = decision.resolution.rule
    if rule is not None:
        explained.update(rule={"index": rule.index, "source": str(rule.source),
                               "mirror": str(rule.mirror)},
                         credential=rule.credential)
    if decision.outcome == "rewrite":
        explained["result"] = decision.resolution.new_image
    return explained


def dumps_json(value: Any) -> str:
    return json.dumps(value, sort_keys=False, separators=(",", ":"))
