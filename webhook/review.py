"""AdmissionReview v1: the wire types, decoding, and the response vocabulary.

Two error channels, as the API server sees them: a malformed webhook call
(empty body, not JSON, wrong kind) is :class:`BadReview` and becomes HTTP
400; a Pod that policy refuses is an ordinary 200 response with
``allowed: false``. Every response echoes the request's ``apiVersion`` and
``uid``, even on errors.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypedDict

import orjson

from mirrorgate.policy import quote

__all__ = [
    "AdmissionRequest",
    "AdmissionResponse",
    "BadReview",
    "Review",
    "allowed",
    "decode",
    "denied",
    "patched",
]

SUPPORTED_VERSIONS = ("admission.k8s.io/v1",)
# The API server's uids are UUIDs (36 characters). A longer one is not from
# an API server, and is neither echoed nor logged.
UID_LENGTH_MAX = 128

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class AdmissionRequest(TypedDict, total=False):
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: str
    requestKind: GroupVersionKind
    name: str
    namespace: str
    operation: Operation
    userInfo: dict[str, Any]
    object: dict[str, Any]
    oldObject: dict[str, Any]
    dryRun: bool
    options: dict[str, Any]


class Status(TypedDict, total=False):
    code: int
    message: str
    reason: str


class AdmissionResponse(TypedDict, total=False):
    uid: str
    allowed: bool
    status: Status
    patch: str
    patchType: Literal["JSONPatch"]
    warnings: list[str]
    auditAnnotations: dict[str, str]


class AdmissionReview(TypedDict, total=False):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest
    response: AdmissionResponse


class BadReview(ValueError):
    """The webhook call itself is malformed; ``uid`` is echoed when it could be read."""

    def __init__(self, message: str, *, uid: str = "", api_version: str = SUPPORTED_VERSIONS[0]):
        super().__init__(message)
        self.uid = uid
        self.api_version = api_version

    def __reduce__(self) -> tuple[Any, ...]:
        # As it was made: a worker process raises these too (webhook.edge.offload).
        return functools.partial(BadReview, uid=self.uid, api_version=self.api_version), (
            str(self),
        )

    def review(self) -> AdmissionReview:
        """The error as an AdmissionReview body, so that the uid still reaches the caller."""
        return {
            "apiVersion": self.api_version,
            "kind": "AdmissionReview",
            "response": {
                "uid": self.uid,
                "allowed": False,
                "status": {"code": 400, "message": str(self)},
            },
        }


class Review(NamedTuple):
    """A decoded AdmissionReview: its version and its request (raw dicts, unknown fields kept)."""

    api_version: str
    request: AdmissionRequest

    @property
    def uid(self) -> str:
        return self.request["uid"]

    def bad(self, message: str) -> BadReview:
        """A :class:`BadReview` about this request, echoing its uid and apiVersion."""
        return BadReview(message, uid=self.uid, api_version=self.api_version)


def _describe(value: object) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), "a value")


def _show(value: object) -> str:
    """A short, safe rendering for messages: never a whole object, which could be a Pod."""
    if isinstance(value, str):
        return quote(value, limit=64, json_style=True)
    return _describe(value)


def decode(body: bytes) -> Review:
    """Parse and check an AdmissionReview request body."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        # Checked only on failure: stripping copies the body, up to megabytes.
        if not body.strip():
            raise BadReview("empty request body; expected an AdmissionReview") from None
        raise BadReview(f"request body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise BadReview(
            f"request body is {_describe(document)}; expected an AdmissionReview object"
        )
    request = document.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    uid = uid if isinstance(uid, str) else ""
    if len(uid) > UID_LENGTH_MAX:
        raise BadReview(f"request.uid is {len(uid)} characters; a uid has at most {UID_LENGTH_MAX}")
    api_version = document.get("apiVersion")
    if document.get("kind") != "AdmissionReview":
        raise BadReview(
            f'kind is {_show(document.get("kind"))}; expected "AdmissionReview"', uid=uid
        )
    if api_version not in SUPPORTED_VERSIONS:
        raise BadReview(
            f"apiVersion {_show(api_version)} is not supported; "
            f"expected one of {', '.join(SUPPORTED_VERSIONS)}",
            uid=uid,
        )
    if not isinstance(request, dict):
        raise BadReview(
            f"request is {_describe(request)}; expected an object", uid=uid, api_version=api_version
        )
    if not uid:
        raise BadReview("request.uid is missing or not a string", api_version=api_version)
    for field, kind in (("operation", str), ("kind", dict)):
        if not isinstance(request.get(field), kind):
            raise BadReview(
                f"request.{field} is {_describe(request.get(field))}; expected {_describe(kind())}",
                uid=uid,
                api_version=api_version,
            )
    return Review(api_version=api_version, request=request)  # type: ignore[arg-type]


def _review(review: Review, response: AdmissionResponse) -> AdmissionReview:
    response["uid"] = review.uid
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}


def _with_extras(
    response: AdmissionResponse,
    warnings: Sequence[str],
    audit_annotations: Mapping[str, str] | None,
) -> AdmissionResponse:
    if warnings:
        response["warnings"] = list(warnings)
    if audit_annotations:
        response["auditAnnotations"] = dict(audit_annotations)
    return response


def allowed(
    review: Review,
    *,
    warnings: Sequence[str] = (),
    audit_annotations: Mapping[str, str] | None = None,
) -> AdmissionReview:
    """Admit the object unchanged."""
    return _review(review, _with_extras({"allowed": True}, warnings, audit_annotations))


def patched(
    review: Review,
    patch: str | None,
    *,
    warnings: Sequence[str] = (),
    audit_annotations: Mapping[str, str] | None = None,
) -> AdmissionReview:
    """Admit the object with a JSON Patch, base64-encoded (``webhook.patch``), or none."""
    response: AdmissionResponse = {"allowed": True}
    if patch is not None:
        response["patch"] = patch
        response["patchType"] = "JSONPatch"
    return _review(review, _with_extras(response, warnings, audit_annotations))


def denied(
    review: Review, message: str, *, code: int = 403, warnings: Sequence[str] = ()
) -> AdmissionReview:
    """Refuse the object; ``message`` reaches the user who made the request."""
    return _review(
        review,
        _with_extras(
            {"allowed": False, "status": {"code": code, "message": message, "reason": "Forbidden"}},
            warnings,
            None,
        ),
    )
