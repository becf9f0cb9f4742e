"""The policy grammar's fields, once: the reference's table and the CRDs' schema come from it.

Each :class:`Field` is one row of docs/policy-reference.md's field table and
one property of the ClusterMirrorPolicy's ``spec`` (a MirrorPolicy's
``spec.mirrors`` takes the ``mirrors`` rows). ``tests/policy/test_schema.py``
holds it equal to the loader's own field lists, so that what the API server
checks and what the loader reads are one grammar; the loader stays the judge
of everything a schema cannot say. The ``schema`` of a field is never
stricter than the loader: a policy the loader accepts is never refused by the
API server (the same test loads every example through both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mirrorgate.policy.mirrorlists import MAX_MIRRORS
from mirrorgate.policy.model import DELIVERIES
from mirrorgate.policy.rules import ON_NOT_GRANTED
from mirrorgate.policy.selectors import OPERATORS

__all__ = ["FIELDS", "LIMITS", "Field"]

# Sizes the CRDs bound, so that the API server can cost its CEL rules; each far
# above what a policy needs, and each documented in the reference.
LIMITS = {
    "mirrors": 1000,
    "team_mirrors": 200,
    "team_credentials": 100,
    "credentials": 1000,
    "globs": 1000,
    "string": 1024,
}
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Loose on purpose: no white space, no upper case; the loader judges the rest.
_HOST_OR_PATH = r"^[^\sA-Z]+$"
# A mirror as _HOST_OR_PATH, with no "://" but an http:// or https:// at its start (the
# CEL rule a string-only mirror had, as a pattern: CEL cannot see a string-or-list field).
_MIRROR = r"^(https?://)?([^:\sA-Z]|:(:|/:)*/?[^:/\sA-Z])*(:(:|/:)*/?)?$"
_DURATION = r"^[+]?(0|([0-9]*[.]?[0-9]*(ns|us|µs|μs|ms|s|m|h))+)$"


def _string(**more: object) -> dict[str, object]:
    return {"type": "string", "minLength": 1, "maxLength": LIMITS["string"], **more}


def _strings(items: int) -> dict[str, object]:
    return {"type": "array", "maxItems": items, "items": _string()}


def _string_or_list(
    *, string: Mapping[str, object], items: int, min_items: int = 1
) -> dict[str, object]:
    """A field that is a string or a list. A structural schema can type neither (a ``type``
    may not sit inside ``anyOf``), and the API server's CEL sees no field without a type,
    so the field keeps what is written (``x-kubernetes-preserve-unknown-fields``) and
    value validations say the rest: each holds only for its own type (a string's
    ``pattern`` and ``maxLength``, a list's ``minItems`` and ``maxItems``), and the
    ``not`` refuses what fails neither a never-matching pattern nor an impossible
    list size, i.e. anything but a string or a list. The loader judges the items."""
    return {
        "x-kubernetes-preserve-unknown-fields": True,
        **{key: value for key, value in string.items() if key != "type"},
        "minItems": min_items,
        "maxItems": items,
        "not": {"pattern": "^$", "minLength": 1, "minItems": 1, "maxItems": 0},
    }


_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": {
            "type": "object",
            "maxProperties": 100,
            "additionalProperties": {"type": "string", "maxLength": 63},
        },
        "matchExpressions": {
            "type": "array",
            "maxItems": 100,
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {
                    "key": _string(maxLength=317),
                    "operator": {"type": "string", "enum": list(OPERATORS)},
                    "values": {
                        "type": "array",
                        "maxItems": 100,
                        "items": {"type": "string", "maxLength": 63},
                    },
                },
            },
        },
    },
}


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One field: its row in the reference, and its schema in the CRDs."""

    path: str
    """``mirrors[].source``: ``[]`` is a list's item, ``<name>`` a mapping's value."""
    kind: str
    """The reference's type column."""
    default: str
    """The reference's default column: ``required``, or the value in backticks."""
    text: str
    """What it does: the reference's last column, and the CRD's description."""
    schema: Mapping[str, object] | None
    """Its OpenAPI schema, without the description (and the properties of a
    mapping or a list's items, which the rows under it add). None: a part of a
    string-or-list field, which has no schema of its own (the field's CEL rules
    check it)."""
    required: bool = False
    """Whether the schema requires it (``credentials.<name>.namespaces`` is required
    only without a namespaceSelector: a CEL rule says that)."""


FIELDS: tuple[Field, ...] = (
    Field(
        "onCredentialError",
        "`skip` \\| `deny`",
        "`skip`",
        "when a pull secret cannot be made: `skip` admits the Pod with those images as "
        "written, `deny` refuses it",
        {"type": "string", "enum": ["skip", "deny"]},
    ),
    Field(
        "skipPullPolicyNever",
        "boolean",
        "`true`",
        "leave the images of containers (and image volumes) whose pull policy is `Never` as "
        "written",
        {"type": "boolean"},
    ),
    Field(
        "mirrors",
        "list of rules",
        "`[]`",
        "where images come from and where they are pulled instead",
        {
            "type": "array",
            "maxItems": LIMITS["mirrors"],
            # One rule per source, the API server's check too (the loader also
            # compares sources as the network sees them).
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["source"],
            "items": {
                "type": "object",
                "x-kubernetes-validations": [
                    # Not the http:// mirror with caFile, nor a rule's credential, caFile
                    # or insecureSkipVerify next to a mirror list: CEL cannot see a
                    # string-or-list mirror (the loader judges both).
                    {
                        "rule": "!(has(self.caFile) && has(self.insecureSkipVerify) "
                        "&& self.insecureSkipVerify)",
                        "message": "insecureSkipVerify and caFile contradict each other: "
                        "verify with the CA, or do not verify",
                    },
                ],
            },
        },
    ),
    Field(
        "mirrors[].source",
        "string",
        "required",
        "`host`, `host/repository-prefix`, `*.domain`, or `*` (every registry no other rule "
        "covers)",
        _string(
            pattern=_HOST_OR_PATH,
            **{
                "x-kubernetes-validations": [
                    {
                        "rule": "!self.contains('://')",
                        "message": "write the source without a scheme such as https:// (only "
                        "mirror takes one)",
                    }
                ]
            },
        ),
        required=True,
    ),
    Field(
        "mirrors[].mirror",
        "string or list",
        "required",
        "`[http://\\|https://]host[:port][/path]` the images are rewritten to; `http://` is "
        "a plain-HTTP mirror. A list: several mirrors, the first one up is used "
        "([failover](#mirrorsmirror-several-mirrors-in-order))",
        _string_or_list(string=_string(pattern=_MIRROR), items=MAX_MIRRORS),
        required=True,
    ),
    Field(
        "mirrors[].mirror[].url",
        "string",
        "required",
        "one mirror of a list, written as a single `mirror` is (a list entry may also be just "
        "this string)",
        None,
    ),
    Field(
        "mirrors[].mirror[].credential",
        "string or list of strings",
        "`[]`",
        "that mirror's credential, or one per team (as `mirrors[].credential`)",
        None,
    ),
    Field(
        "mirrors[].mirror[].caFile",
        "string",
        "`null`",
        "that mirror's CA bundle (as `mirrors[].caFile`)",
        None,
    ),
    Field(
        "mirrors[].mirror[].insecureSkipVerify",
        "boolean",
        "`false`",
        "that mirror's TLS verification (as `mirrors[].insecureSkipVerify`)",
        None,
    ),
    Field(
        "mirrors[].credential",
        "string or list of strings",
        "`[]`",
        "a credential name, or one per team; the one granted to the Pod's namespace is "
        "attached to the Pods using this mirror",
        _string_or_list(
            string=_string(maxLength=63, pattern=_DNS_LABEL), items=LIMITS["team_credentials"]
        ),
    ),
    Field(
        "mirrors[].onNotGranted",
        "`skip` \\| `next` \\| `deny`",
        "`skip`",
        "in a namespace granted none of the rule's credentials: leave the image as written, "
        "let the next broader rule decide, or refuse the Pod (enforce)",
        {"type": "string", "enum": list(ON_NOT_GRANTED)},
    ),
    Field(
        "mirrors[].onMirrorDown",
        "`fallback` \\| `keep`",
        "`fallback`",
        "while the mirror is down or the credential cannot log in: leave images as "
        "written, or rewrite anyway",
        {"type": "string", "enum": ["fallback", "keep"]},
    ),
    Field(
        "mirrors[].caFile",
        "string",
        "`null`",
        "a PEM CA bundle the health probe trusts for this mirror instead of the system's "
        "(exported as containerd's `ca`)",
        _string(),
    ),
    Field(
        "mirrors[].insecureSkipVerify",
        "boolean",
        "`false`",
        "do not verify the mirror's TLS certificate (probes and export); `policy check` warns",
        {"type": "boolean"},
    ),
    Field(
        "mirrors[].fixed",
        "boolean",
        "`false`",
        "in a ClusterMirrorPolicy: no MirrorPolicy may take images from this rule (its "
        "source, or one under it); a MirrorPolicy's rules cannot say it",
        {"type": "boolean"},
    ),
    Field(
        "health",
        "mapping",
        "`{interval: 10s, timeout: 2s, failureThreshold: 3, successThreshold: 1}`",
        "how the mirrors and credentials are probed in the background",
        {"type": "object"},
    ),
    Field(
        "health.interval",
        "duration",
        "`10s`",
        "from the start of one probe round to the next (100ms to 1h)",
        _string(maxLength=64, pattern=_DURATION),
    ),
    Field(
        "health.timeout",
        "duration",
        "`2s`",
        "how long one probe may take (at most the interval)",
        _string(maxLength=64, pattern=_DURATION),
    ),
    Field(
        "health.failureThreshold",
        "integer",
        "`3`",
        "consecutive failures that mark a mirror down or a credential invalid (1 to 100)",
        {"type": "integer", "minimum": 1, "maximum": 100},
    ),
    Field(
        "health.successThreshold",
        "integer",
        "`1`",
        "consecutive successes that mark it up or valid again (1 to 100)",
        {"type": "integer", "minimum": 1, "maximum": 100},
    ),
    Field("exclude", "mapping", "`{}`", "what is never rewritten", {"type": "object"}),
    Field(
        "exclude.images",
        "list of globs",
        "`[]`",
        "globs on the normalised reference",
        _strings(LIMITS["globs"]),
    ),
    Field(
        "exclude.namespaces",
        "list of globs",
        "`[]`",
        "namespaces never mutated (`kube-system` always is)",
        _strings(LIMITS["globs"]),
    ),
    Field(
        "credentials",
        "mapping",
        "`{}`",
        "which namespaces may receive which credential",
        {
            "type": "object",
            "maxProperties": LIMITS["credentials"],
            "additionalProperties": {
                "type": "object",
                "x-kubernetes-validations": [
                    {
                        "rule": "has(self.namespaces) || has(self.namespaceSelector)",
                        "message": "namespaces is required (or namespaceSelector): the "
                        "namespaces whose Pods may use this credential",
                    }
                ],
            },
        },
    ),
    Field(
        "credentials.<name>.namespaces",
        "list of names",
        "required",
        "namespaces that may receive `<name>` (globs are warned of); may be left out "
        "beside a `namespaceSelector`",
        _strings(LIMITS["globs"]),
    ),
    Field(
        "credentials.<name>.namespaceSelector",
        "label selector",
        "`null`",
        "namespaces whose labels it matches may receive `<name>` too",
        _SELECTOR,
    ),
    Field(
        "credentials.<name>.registry",
        "`host[:port][/path]`",
        "`null`",
        "the key of the generated pull secret (null: the store entry's own)",
        _string(pattern=_HOST_OR_PATH),
    ),
    Field(
        "credentials.<name>.provider",
        "string",
        "`null`",
        "a kubelet credential-provider plugin that issues the login (null: the store)",
        _string(maxLength=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"),
    ),
    Field(
        "credentials.<name>.delivery",
        "`pullSecret` \\| `kubelet`",
        "`pullSecret`",
        "how Pods get the login: a `mirrorgate-<name>` copy in each granted namespace, "
        "attached as an imagePullSecret; or none anywhere, the node's "
        "`mirrorgate-credential-provider` fetching it for each pull",
        {"type": "string", "enum": list(DELIVERIES)},
    ),
)
