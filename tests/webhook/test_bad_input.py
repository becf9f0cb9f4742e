"""Malformed webhook calls get HTTP 400 saying what is wrong; malformed Pods get a warning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from mirrorgate.webhook.edge import app
from tests.webhook.harness import Harness
from tests.webhook.reviews import (
    HUB_IMAGE,
    PROM_IMAGE,
    PROM_MIRRORED,
    apply,
    patch_ops,
    pod,
    review,
)

UID = "0c5e9f3a-bad0-4000-8000-00000000abcd"


def body(**request: Any) -> dict[str, Any]:
    """A valid review for a Pod, with ``request`` fields replaced (None deletes one)."""
    document = review(pod(PROM_IMAGE), uid=UID)
    for key, value in request.items():
        if value is None:
            del document["request"][key]
        else:
            document["request"][key] = value
    return document


def without(key: str) -> dict[str, Any]:
    document = body()
    del document[key]
    return document


def replaced(key: str, value: Any) -> dict[str, Any]:
    document = body()
    document[key] = value
    return document


JSON = {"content-type": "application/json"}

# raw body, headers, message fragment, uid the answer must carry
BAD_REQUESTS = [
    pytest.param(b"", JSON, "empty request body", "", id="empty-body"),
    pytest.param(b" \n\t", JSON, "empty request body", "", id="blank-body"),
    pytest.param(b'{"apiVersion": ', JSON, "not valid JSON", "", id="truncated-json"),
    pytest.param(b"\xff\xfe\x00garbage", JSON, "not valid JSON", "", id="binary-body"),
    pytest.param(b"[1, 2]", JSON, "request body is a list", "", id="json-list"),
    pytest.param(b'"AdmissionReview"', JSON, "request body is a string", "", id="json-string"),
    pytest.param(
        orjson.dumps(body()),
        {"content-type": "text/plain"},
        "Content-Type is 'text/plain'; expected application/json",
        "",
        id="wrong-content-type",
    ),
    pytest.param(
        orjson.dumps(body()), {}, "Content-Type is 'missing'", "", id="missing-content-type"
    ),
    pytest.param(
        orjson.dumps(replaced("kind", "Pod")),
        JSON,
        'kind is "Pod"; expected "AdmissionReview"',
        UID,
        id="wrong-kind",
    ),
    pytest.param(orjson.dumps(without("kind")), JSON, "kind is null", UID, id="missing-kind"),
    pytest.param(
        orjson.dumps(replaced("apiVersion", "admission.k8s.io/v1beta1")),
        JSON,
        'apiVersion "admission.k8s.io/v1beta1" is not supported',
        UID,
        id="v1beta1",
    ),
    pytest.param(
        orjson.dumps(without("apiVersion")),
        JSON,
        "apiVersion null is not supported",
        UID,
        id="missing-api-version",
    ),
    pytest.param(
        orjson.dumps(without("request")),
        JSON,
        "request is null; expected an object",
        "",
        id="missing-request",
    ),
    pytest.param(
        orjson.dumps(replaced("request", [UID])),
        JSON,
        "request is a list; expected an object",
        "",
        id="request-is-a-list",
    ),
    pytest.param(
        orjson.dumps(body(uid=None)), JSON, "request.uid is missing", "", id="missing-uid"
    ),
    pytest.param(orjson.dumps(body(uid="")), JSON, "request.uid is missing", "", id="empty-uid"),
    pytest.param(
        orjson.dumps(body(uid=42)),
        JSON,
        "request.uid is missing or not a string",
        "",
        id="uid-not-a-string",
    ),
    pytest.param(
        orjson.dumps(body(operation=None)),
        JSON,
        "request.operation is null",
        UID,
        id="missing-operation",
    ),
    pytest.param(
        orjson.dumps(body(kind="Pod")),
        JSON,
        "request.kind is a string; expected an object",
        UID,
        id="request-kind-not-an-object",
    ),
    pytest.param(
        orjson.dumps(body(object=None)), JSON, "request.object is missing", UID, id="missing-object"
    ),
    pytest.param(
        orjson.dumps(body(object=[pod(PROM_IMAGE)])),
        JSON,
        "request.object is missing or not an object",
        UID,
        id="object-is-a-list",
    ),
    pytest.param(
        orjson.dumps(body(namespace=None)),
        JSON,
        "neither request.namespace nor the Pod's metadata.namespace is set",
        UID,
        id="no-namespace-anywhere",
    ),
]


def assert_bad_request(response: Any, fragment: str, uid: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    assert "Traceback" not in response.text
    answer = response.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    result = answer["response"]
    assert result["uid"] == uid
    assert result["allowed"] is False
    assert result["status"]["code"] == 400
    assert fragment in result["status"]["message"]
    return dict(result)


@pytest.mark.parametrize(("raw", "headers", "fragment", "uid"), BAD_REQUESTS)
@pytest.mark.parametrize("endpoint", ["/mutate", "/audit"])
def test_malformed_calls_get_400_saying_what_is_wrong(
    harness: Harness, endpoint: str, raw: bytes, headers: dict[str, str], fragment: str, uid: str
) -> None:
    """Each malformed call is a 400 AdmissionReview naming the problem, uid echoed when known."""
    assert_bad_request(harness.client.post(endpoint, content=raw, headers=headers), fragment, uid)
    assert harness.secrets.missing_calls == []


def test_declared_oversized_body_is_refused(harness: Harness) -> None:
    """A Content-Length over the limit is refused before the body is read."""
    raw = b"{" + b" " * app.MAX_BODY_BYTES + b"}"
    response = harness.client.post("/mutate", content=raw, headers=JSON)
    assert_bad_request(response, f"exceeds the {app.MAX_BODY_BYTES}-byte limit", "")


def test_streamed_oversized_body_is_refused(harness: Harness) -> None:
    """A chunked body (no Content-Length) is cut off once it passes the limit."""
    chunk = b" " * (1024 * 1024)

    def chunks() -> Iterator[bytes]:
        for _ in range(app.MAX_BODY_BYTES // len(chunk) + 2):
            yield chunk

    response = harness.client.post("/mutate", content=chunks(), headers=JSON)
    assert_bad_request(response, f"exceeds the {app.MAX_BODY_BYTES}-byte limit", "")


def test_body_just_under_the_limit_is_read(harness: Harness) -> None:
    """A review padded to exactly the limit is still decoded and answered."""
    document = body()
    document["request"]["object"]["metadata"]["annotations"] = {"pad": ""}
    size = len(orjson.dumps(document))
    document["request"]["object"]["metadata"]["annotations"]["pad"] = "x" * (
        app.MAX_BODY_BYTES - size
    )
    raw = orjson.dumps(document)
    assert len(raw) == app.MAX_BODY_BYTES
    response = harness.client.post("/mutate", content=raw, headers=JSON)
    assert response.status_code == 200
    assert response.json()["response"]["uid"] == UID


def test_content_type_with_parameters_is_accepted(harness: Harness) -> None:
    """The API server may send `application/json; charset=utf-8`."""
    response = harness.client.post(
        "/mutate",
        content=orjson.dumps(body()),
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert response.status_code == 200
    assert response.json()["response"]["allowed"] is True


def test_bad_requests_are_counted(harness: Harness) -> None:
    """Every 400 increments mirrorgate_errors_total{reason="bad-request"} for its endpoint."""
    harness.client.post("/mutate", content=b"", headers=JSON)
    harness.client.post("/mutate", content=b"nope", headers=JSON)
    harness.client.post("/audit", content=b"", headers=JSON)
    metrics = harness.client.get("/metrics").text
    assert 'mirrorgate_errors_total{endpoint="mutate",reason="bad-request"} 2.0' in metrics
    assert 'mirrorgate_errors_total{endpoint="audit",reason="bad-request"} 1.0' in metrics


def spec_with(**fields: Any) -> dict[str, Any]:
    obj = pod(PROM_IMAGE)
    obj["spec"].update(fields)
    return obj


def annotated(value: Any) -> dict[str, Any]:
    obj = pod(PROM_IMAGE)
    obj["metadata"]["annotations"] = {"mirrorgate.io/original-images": value}
    return obj


# object, warning fragment
MALFORMED_PODS = [
    pytest.param(
        spec_with(containers="nginx"), "spec.containers is not a list", id="containers-a-string"
    ),
    pytest.param(
        spec_with(containers={"name": "c0", "image": HUB_IMAGE}),
        "spec.containers is not a list",
        id="containers-a-mapping",
    ),
    pytest.param(
        spec_with(initContainers=7),
        "spec.initContainers is not a list",
        id="init-containers-a-number",
    ),
    pytest.param(
        spec_with(containers=["nginx"]),
        "spec.containers[0] is not a mapping",
        id="container-a-string",
    ),
    pytest.param(
        spec_with(containers=[{"image": HUB_IMAGE}]),
        "spec.containers[0] has no name",
        id="container-without-name",
    ),
    pytest.param(
        spec_with(containers=[{"name": "c0", "image": 5}]),
        "containers/c0: image is not a string",
        id="image-a-number",
    ),
    pytest.param(
        spec_with(containers=[{"name": "c0", "image": ["nginx"]}]),
        "containers/c0: image is not a string",
        id="image-a-list",
    ),
    pytest.param(
        spec_with(containers=[{"name": "c0", "image": "Not A Reference"}]),
        "containers/c0: image 'Not A Reference' left as written",
        id="image-invalid",
    ),
    pytest.param(
        annotated("not json"),
        "annotation mirrorgate.io/original-images",
        id="original-images-not-json",
    ),
    pytest.param(
        annotated('{"containers/c0": 1}'),
        "annotation mirrorgate.io/original-images",
        id="original-images-not-strings",
    ),
]


@pytest.mark.parametrize(("obj", "fragment"), MALFORMED_PODS)
def test_malformed_pod_contents_are_allowed_with_a_warning(
    harness: Harness, obj: dict[str, Any], fragment: str
) -> None:
    """A Pod the API server would reject itself is not our 400: it is admitted with a warning."""
    response = harness.mutate(review(obj, uid=UID))
    assert response["uid"] == UID
    assert response["allowed"] is True
    assert any(fragment in warning for warning in response["warnings"]), response["warnings"]
    image_ops = [op for op in patch_ops(response) if op["path"].endswith("/image")]
    assert all(op["value"] == PROM_MIRRORED for op in image_ops)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("[" * 2000 + "]" * 2000, id="lists-2000-deep"),
        pytest.param('{"a":' * 2000 + '"x"' + "}" * 2000, id="objects-2000-deep"),
        # Once an internal error: JSON's \ud800 decodes, but cannot be written back.
        pytest.param('{"containers/c0": "\\ud800"}', id="lone-surrogate"),
        pytest.param(
            json.dumps({f"containers/x{i}": "y" * 100 for i in range(3000)}),
            id="longer-than-any-pod",
        ),
    ],
)
def test_a_deep_original_images_annotation_is_treated_as_absent(
    harness: Harness, value: str
) -> None:
    """No internal error: the Pod is rewritten as if it had no record, and told so."""
    obj = annotated(value)
    response = harness.mutate(review(obj, uid=UID))
    assert response["uid"] == UID
    assert response["allowed"] is True
    assert (
        "annotation mirrorgate.io/original-images is not a JSON object of strings; "
        "treated as absent and rebuilt from the images rewritten now"
    ) in response["warnings"] or (
        f"annotation mirrorgate.io/original-images is {len(value):,} characters, longer "
        "than the API server allows all of a Pod's annotations (262,144); treated as "
        "absent and rebuilt from the images rewritten now"
    ) in response["warnings"]
    patched = apply(obj, patch_ops(response))
    assert [c["image"] for c in patched["spec"]["containers"]] == [PROM_MIRRORED]
    assert json.loads(patched["metadata"]["annotations"]["mirrorgate.io/original-images"]) == {
        "containers/c0": PROM_IMAGE
    }


def test_fake_originals_are_dropped_and_the_record_rebuilt(harness: Harness) -> None:
    """A record naming fake originals does not survive admission: the record is rebuilt
    from the images rewritten, and the client is told why."""
    obj = annotated(json.dumps({"containers/c0": "registry.example/fake:1", "ghost/x": "y"}))
    response = harness.mutate(review(obj, uid=UID))
    assert response["allowed"] is True
    patched = apply(obj, patch_ops(response))
    assert [c["image"] for c in patched["spec"]["containers"]] == [PROM_MIRRORED]
    assert json.loads(patched["metadata"]["annotations"]["mirrorgate.io/original-images"]) == {
        "containers/c0": PROM_IMAGE
    }
    assert any(
        "the entries for 'containers/c0', 'ghost/x' are not the originals" in w
        for w in response["warnings"]
    ), response["warnings"]


def test_malformed_pull_secrets_still_rewrite_open_mirrors(harness: Harness) -> None:
    """imagePullSecrets that is not a list blocks credentials, not rewrites that need none."""
    obj = spec_with(imagePullSecrets="harbor")
    obj["spec"]["containers"].append({"name": "hub", "image": HUB_IMAGE})
    response = harness.mutate(review(obj))
    patched = apply(obj, patch_ops(response))
    assert [c["image"] for c in patched["spec"]["containers"]] == [PROM_MIRRORED, HUB_IMAGE]
    assert patched["spec"]["imagePullSecrets"] == "harbor"
    assert any("spec.imagePullSecrets is not a list" in w for w in response["warnings"])
    assert any("containers/hub" in w for w in response["warnings"])


def test_wrong_method_is_not_a_server_error(harness: Harness) -> None:
    """GET on an admission endpoint is refused by routing, not by a crash."""
    response = harness.client.get("/mutate")
    assert response.status_code == 405


def nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


@pytest.mark.parametrize(
    ("field", "depth", "fragment"),
    [
        pytest.param("kind", 300, 'expected "AdmissionReview"', id="kind-300-deep"),
        pytest.param("apiVersion", 300, "is not supported", id="api-version-300-deep"),
        pytest.param("kind", 2000, "not valid JSON", id="kind-past-the-parser-limit"),
    ],
)
def test_deeply_nested_envelope_fields_get_400(
    harness: Harness, field: str, depth: int, fragment: str
) -> None:
    """A kind or apiVersion nested hundreds deep is a 400 naming the field, not a 500."""
    document = body()
    document[field] = "__nested__"
    raw = orjson.dumps(document).replace(b'"__nested__"', nested(depth))
    response = harness.client.post("/mutate", content=raw, headers=JSON)
    assert_bad_request(response, fragment, "" if depth > 1000 else UID)
