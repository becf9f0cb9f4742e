"""Admission of the policy ConfigMap: a bad policy is refused when it is applied.

The API server sends mirrorgate every write of its policy ConfigMap (the
webhook ``policy.mirrorgate.io``, matched by the label :data:`POLICY_LABEL`
in mirrorgate's own namespace, failurePolicy Fail). The policy under
``data."policy.yaml"`` is judged by the very code ``mirrorgate policy check``
and the server's loader use, so ``kubectl apply`` or ``helm upgrade`` of an
invalid policy fails with the same field-path errors, and the policy in
force stays. A valid policy comes back with ``policy check``'s warnings.
"""

from __future__ import annotations

import re

from mirrorgate.webhook import review
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.policyfile import parse_policy

__all__ = ["POLICY_KEY", "POLICY_LABEL", "Judged", "judge", "judge_body", "refusal_kind"]

POLICY_LABEL = "mirrorgate.io/policy"
"""On the ConfigMap whose writes the API server sends to /validate-policy."""
POLICY_KEY = "policy.yaml"
"""The key of the ConfigMap's data that holds the policy (the file the server reads)."""
MAX_REVIEWED_POLICY_BYTES = 128 * 1024
"""A policy judged at admission is at most this long (a policy file may be longer:
:data:`webhook.policyfile.MAX_POLICY_BYTES`): a thousand rules take about 70 KiB,
and reading this much takes some 35 ms of one core (/validate-policy answers whoever
reaches the port: :mod:`webhook.edge.offload` judges long ones in its worker process)."""

Judged = tuple[review.AdmissionReview, str | None]
"""The answer to a policy review, and who wrote the ConfigMap (for the log)."""


def judge_body(body: bytes) -> Judged:
    """Decode a review and :func:`judge` it (in the server, or in its worker process).

    Raises :class:`review.BadReview` for a malformed review.
    """
    rev = review.decode(body)
    user = rev.request.get("userInfo")
    return judge(rev), user.get("username") if isinstance(user, dict) else None


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
