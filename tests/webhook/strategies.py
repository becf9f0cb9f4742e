"""Hypothesis strategies for malformed AdmissionReview bodies.

Valid reviews are the seeds; the strategies then delete or replace random
fields with random JSON, add stray keys, truncate the encoding, bury deep
nesting inside, or send bytes that are not JSON at all.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import orjson
from hypothesis import strategies as st

from tests.webhook.reviews import (
    HUB_IMAGE,
    PROM_IMAGE,
    UNMATCHED_IMAGE,
    pod,
    review,
)

Path = tuple[str | int, ...]

# orjson holds integers to 64 bits; the API server sends nothing larger.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "",
            "Pod",
            "CREATE",
            "UPDATE",
            "ephemeralcontainers",
            HUB_IMAGE,
            "admission.k8s.io/v1",
            "AdmissionReview",
        ]
    )
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)

images = st.sampled_from(
    [
        HUB_IMAGE,
        PROM_IMAGE,
        UNMATCHED_IMAGE,
        "busybox",
        "quay.io/prometheus/node-exporter@sha256:" + "ab" * 32,
        "registry.k8s.io/pause:3.9",
    ]
)


@st.composite
def valid_reviews(draw: st.DrawFn) -> dict[str, Any]:
    """Reviews the webhook answers with 200: Pod CREATEs, Pod UPDATEs and ephemeral-container
    UPDATEs."""
    obj = pod(
        *draw(st.lists(images, min_size=1, max_size=3)),
        namespace=draw(st.sampled_from([None, "team-b", "excluded-ns"])),
    )
    if draw(st.booleans()):
        obj["spec"]["initContainers"] = [{"name": "init", "image": draw(images)}]
    if draw(st.booleans()):
        obj["spec"]["imagePullSecrets"] = [{"name": "existing"}]
    if draw(st.booleans()):
        obj["metadata"]["annotations"] = {"a": "b"}
    if draw(st.booleans()):
        obj["spec"]["volumes"] = [{"name": "tools", "image": {"reference": draw(images)}}]
    operation = draw(st.sampled_from(["create", "update", "ephemeral"]))
    if operation == "ephemeral":
        old = copy.deepcopy(obj)
        obj["spec"]["ephemeralContainers"] = [{"name": "debug", "image": draw(images)}]
        return review(
            obj,
            operation="UPDATE",
            sub_resource="ephemeralcontainers",
            old=old,
            uid=draw(st.uuids()).hex,
        )
    if operation == "update":  # kubectl set image: the first container's image changes
        # With the pull secret its mirror needs (a running Pod cannot gain one: refused).
        obj["spec"]["imagePullSecrets"] = [{"name": "mirrorgate-harbor-pull"}]
        old = copy.deepcopy(obj)
        old["spec"]["containers"][0]["image"] = draw(images)
        return review(obj, operation="UPDATE", old=old, uid=draw(st.uuids()).hex)
    return review(obj, uid=draw(st.uuids()).hex, dry_run=draw(st.sampled_from([None, True])))


def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every location in a JSON document, the root included."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


def _parent(document: Any, path: Path) -> Any:
    for step in path[:-1]:
        document = document[step]
    return document


def mutate(document: Any, path: Path, action: str, value: Any) -> Any:
    """``document`` with ``action`` done at ``path`` (the document itself may be replaced)."""
    if not path:
        return (
            value
            if action != "add" or not isinstance(document, dict)
            else {**document, "stray": value}
        )
    try:
        parent = _parent(document, path)
        target = parent[path[-1]]
    except (KeyError, IndexError, TypeError):
        return document  # an earlier mutation removed this place
    if action == "delete":
        del parent[path[-1]]
    elif action == "add" and isinstance(target, dict):
        target["stray"] = value
    else:
        parent[path[-1]] = value
    return document


@st.composite
def mutated_reviews(draw: st.DrawFn) -> bytes:
    """A valid review with one to four fields deleted, replaced or added to."""
    document: Any = draw(valid_reviews())
    for _ in range(draw(st.integers(1, 4))):
        places = list(paths(document))
        path = draw(st.sampled_from(places))
        action = draw(st.sampled_from(["delete", "replace", "add"]))
        document = mutate(document, path, action, draw(json_values))
    return orjson.dumps(document)


@st.composite
def truncated_reviews(draw: st.DrawFn) -> bytes:
    raw = orjson.dumps(draw(valid_reviews()))
    return raw[: draw(st.integers(0, len(raw) - 1))]


@st.composite
def deeply_nested_reviews(draw: st.DrawFn) -> bytes:
    """Nesting up to well past any parser's recursion limit, in place of a random field."""
    document = draw(valid_reviews())
    path = draw(st.sampled_from(list(paths(document))[1:]))
    document = mutate(document, path, "replace", "__nest__")
    depth = draw(st.integers(1, 5000))
    opening, closing = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    core = "1" if opening == "[" else "null"
    nest = opening * depth + core + closing * depth
    return orjson.dumps(document).replace(b'"__nest__"', nest.encode(), 1)


@st.composite
def corrupted_reviews(draw: st.DrawFn) -> bytes:
    """A valid encoding with a few bytes overwritten at random."""
    raw = bytearray(orjson.dumps(draw(valid_reviews())))
    for _ in range(draw(st.integers(1, 3))):
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw)


any_json_documents = json_values.map(orjson.dumps)
