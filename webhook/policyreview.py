"""Admission of the policy: a bad policy is refused when it is applied.

The API server sends mirrorgate every write of its policy ConfigMap (the
webhook ``policy.mirrorgate.io``, matched by the label :data:`POLICY_LABEL`
in mirrorgate's own namespace, failurePolicy Fail). The policy under
``data."policy.yaml"`` is judged by the very code ``mirrorgate policy check``
and the server's loader use, so ``kubectl apply`` or ``helm upgrade`` of an
invalid policy fails with the same field-path errors, and the policy in
force stays. A valid policy comes back with ``policy check``'s warnings.

A ClusterMirrorPolicy or MirrorPolicy (the webhook ``policies.mirrorgate.io``)
is judged by :func:`policy.judge` beside the objects stored now, as the
server's informers hold them: what the composition would refuse is refused
at apply time, with the reason. The policy file (the deprecated ConfigMap) is
not among them: where it conflicts with an object, it yields.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from mirrorgate import policy
from mirrorgate.webhook import review
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.policyfile import parse_policy

__all__ = [
    "POLICY_KEY",
    "POLICY_LABEL",
    "Judged",
    "Stored",
    "alone",
    "judge",
    "judge_body",
    "judge_in_worker",
    "judge_object",
    "refusal_kind",
]

POLICY_LABEL = "mirrorgate.io/policy"
"""On the ConfigMap whose writes the API server sends to /validate-policy."""
POLICY_KEY = "policy.yaml"
"""The key of the ConfigMap's data that holds the policy (the file the server reads)."""
MAX_REVIEWED_POLICY_BYTES = 128 * 1024
"""A policy judged at admission is at most this long (a policy file may be longer:
:data:`webhook.policyfile.MAX_POLICY_BYTES`): enough for a thousand rules, and
bounded because /validate-policy answers whoever reaches the port
(:mod:`webhook.edge.offload` judges long ones in its worker process)."""

Judged = tuple[review.AdmissionReview, str | None]
"""The answer to a policy review, and who wrote the policy (for the log)."""
Context = tuple[Sequence[policy.PolicyObject], Mapping[str, Mapping[str, str]]]
Stored = Callable[[str | None], Context]
"""The policy objects stored now (those a new one is judged beside) and the labels of
the namespace named (a MirrorPolicy's, for its grants by label): from the server's
informers, memory only."""


def alone(namespace: str | None) -> Context:
    """No cluster, so no other object: each is judged alone."""
    return (), {}


def judge_body(body: bytes, stored: Stored = alone) -> Judged:
    """Decode a review and judge it: a ConfigMap by :func:`judge`, a policy object by
    :func:`judge_object` beside the ``stored`` ones.

    Raises :class:`review.BadReview` for a malformed review.
    """
    judged = _judge_body(body, stored)
    assert judged is not None  # with the stored objects, everything is judged
    return judged


def judge_in_worker(body: bytes) -> Judged | None:
    """:func:`judge_body` in the worker process, which holds no informer: a policy object's
    review is not judged there, and None comes back."""
    return _judge_body(body, None)


def _judge_body(body: bytes, stored: Stored | None) -> Judged | None:
    rev = review.decode(body)
    user = rev.request.get("userInfo")
    who = user.get("username") if isinstance(user, dict) else None
    if _kind(rev) in (policy.CLUSTER_KIND, policy.NAMESPACED_KIND):
        return None if stored is None else (judge_object(rev, stored), who)
    return judge(rev), who


def _kind(rev: review.Review) -> object:
    kind = rev.request.get("kind")
    return kind.get("kind") if isinstance(kind, dict) else None


def judge_object(rev: review.Review, stored: Stored) -> review.AdmissionReview:
    """Allow a ClusterMirrorPolicy or MirrorPolicy the composition accepts beside the
    stored objects; refuse one it refuses, with the reason and every problem (a source
    another object claims, a credential not granted to the namespace, a fixed rule)."""
    request = rev.request
    if request["operation"] == "DELETE":
        return review.allowed(rev)
    obj = request.get("object")
    if not isinstance(obj, dict):
        raise rev.bad("request.object is not an object; expected a policy object")
    namespace = request.get("namespace") or None
    try:
        candidate = policy.parse_object(obj, namespace=namespace)
    except policy.PolicyError as error:
        problems = "\n".join(f"  {e}" for e in error.errors)
        return review.denied(rev, f"{_kind(rev)} {request.get('name')}: invalid:\n{problems}")
    others, labels = stored(candidate.namespace)
    verdict = policy.judge(candidate, others, labels)
    if not verdict.accepted:
        problems = "\n".join(f"  {line}" for line in verdict.message.splitlines())
        return review.denied(rev, f"{candidate.key}: refused ({verdict.reason}):\n{problems}")
    return review.allowed(rev, warnings=[f"{candidate.key}: {w}" for w in verdict.warnings])


_SOURCE = re.compile(r"^ConfigMap \S* data\.policy\.yaml(:\d+:\d+)?", re.MULTILINE)
_VARYING = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|\d+")


def refusal_kind(message: str) -> str:
    """What a refusal says, without what varies from one policy to the next.

    The ConfigMap's name, positions, numbers and quoted values go: an invalid
    YAML is one kind wherever it breaks, a policy too long one kind whatever
    its length. The field paths of an invalid policy's errors stay.
    """
    return _VARYING.sub("#", _SOURCE.sub("", message))[:500]


def judge(rev: review.Review) -> review.AdmissionReview:
    """Allow a ConfigMap whose policy loads; refuse one that does not, saying why."""
    request = rev.request
    if request["operation"] == "DELETE":
        return review.allowed(rev)  # nothing new to judge (the webhook asks for no DELETE)
    obj = request.get("object")
    if not isinstance(obj, dict):
        raise rev.bad("request.object is not an object; expected a ConfigMap")
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    source = f"ConfigMap {request.get('namespace')}/{name} data.{POLICY_KEY}"
    data = obj.get("data")
    text = data.get(POLICY_KEY) if isinstance(data, dict) else None
    if not isinstance(text, str):
        return review.denied(
            rev,
            f"{source}: missing; the server reads its policy from this "
            f"key (remove the {POLICY_LABEL} label from a ConfigMap that "
            "is not a policy)",
        )
    data = text.encode()
    if len(data) > MAX_REVIEWED_POLICY_BYTES:
        return review.denied(
            rev,
            f"{source}: {len(data)} bytes; a policy is at most {MAX_REVIEWED_POLICY_BYTES} bytes",
        )
    try:
        loaded = parse_policy(data, source=source)
    except ConfigError as error:
        return review.denied(rev, str(error))
    return review.allowed(rev, warnings=[f"{source}: {warning}" for warning in loaded.warnings])
