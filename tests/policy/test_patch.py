"""Turning a rewrite plan into JSON Patch operations (webhook/patch.py)."""

from __future__ import annotations

import base64
from typing import Any

import jsonpatch
import orjson
import pytest

from mirrorgate import policy
from mirrorgate.webhook import patch

KEY = policy.ORIGINAL_IMAGES_ANNOTATION
SITE = policy.ImageSite(field="containers", index=1, name="b", image="nginx")
REWRITE = policy.ImageRewrite(
    site=SITE, new_image="m.example/hub/library/nginx", rule_label="mirrors[0]"
)
PLAN = policy.RewritePlan(
    rewrites=(REWRITE,),
    pull_secrets=("mirrorgate-a", "mirrorgate-b"),
    credentials=("a", "b"),
    original_images={"containers/b": "nginx"},
)
VALUE = '{"containers/b":"nginx"}'  # the annotation as written: compact, keys sorted


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        pytest.param("mirrorgate.io/original-images", "mirrorgate.io~1original-images", id="slash"),
        pytest.param("a~b", "a~0b", id="tilde"),
        pytest.param("~/", "~0~1", id="tilde-then-slash"),
        pytest.param("~1", "~01", id="escaped-looking"),
        pytest.param("plain", "plain", id="plain"),
    ],
)
def test_escape(token: str, escaped: str) -> None:
    """Reference tokens are escaped by RFC 6901 (~ first, then /)."""
    assert patch.escape(token) == escaped


def _pod(metadata: Any = None, secrets: Any = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "nginx"}]}
    }
    if metadata is not None:
        pod["metadata"] = metadata
    if secrets is not None:
        pod["spec"]["imagePullSecrets"] = secrets
    return pod


# metadata (None: absent), annotation operation
ANNOTATION_OPS = [
    pytest.param(
        None,
        {"op": "add", "path": "/metadata", "value": {"annotations": {KEY: VALUE}}},
        id="no-metadata",
    ),
    pytest.param(
        {"generateName": "p-"},
        {"op": "add", "path": "/metadata/annotations", "value": {KEY: VALUE}},
        id="no-annotations",
    ),
    pytest.param(
        {"annotations": None},
        {"op": "add", "path": "/metadata/annotations", "value": {KEY: VALUE}},
        id="null-annotations",
    ),
    pytest.param(
        {"annotations": {"x": "y"}},
        {
            "op": "add",
            "path": "/metadata/annotations/mirrorgate.io~1original-images",
            "value": VALUE,
        },
        id="annotations-present",
    ),
    pytest.param(
        {"annotations": {KEY: "{}"}},
        {
            "op": "add",
            "path": "/metadata/annotations/mirrorgate.io~1original-images",
            "value": VALUE,
        },
        id="annotation-present",
    ),
]


@pytest.mark.parametrize(("metadata", "operation"), ANNOTATION_OPS)
def test_annotation_operation(metadata: Any, operation: dict[str, Any]) -> None:
    """The annotation is added with its parents created when absent, and the key escaped."""
    pod = _pod(metadata)
    ops = patch.build_patch(pod, PLAN)
    assert ops[1] == operation
    after = jsonpatch.apply_patch(pod, ops)
    assert after["metadata"]["annotations"][KEY] == VALUE
    for name, value in (metadata or {}).items():
        if name != "annotations":
            assert after["metadata"][name] == value
    for name, value in ((metadata or {}).get("annotations") or {}).items():
        if name != KEY:
            assert after["metadata"]["annotations"][name] == value


@pytest.mark.parametrize(
    ("secrets", "operations", "result"),
    [
        pytest.param(
            None,
            [
                {
                    "op": "add",
                    "path": "/spec/imagePullSecrets",
                    "value": [{"name": "mirrorgate-a"}, {"name": "mirrorgate-b"}],
                }
            ],
            [{"name": "mirrorgate-a"}, {"name": "mirrorgate-b"}],
            id="absent",
        ),
        pytest.param(
            [{"name": "regcred"}],
            [
                {
                    "op": "add",
                    "path": "/spec/imagePullSecrets/-",
                    "value": {"name": "mirrorgate-a"},
                },
                {
                    "op": "add",
                    "path": "/spec/imagePullSecrets/-",
                    "value": {"name": "mirrorgate-b"},
                },
            ],
            [{"name": "regcred"}, {"name": "mirrorgate-a"}, {"name": "mirrorgate-b"}],
            id="present-appended",
        ),
        pytest.param(
            [],
            [
                {
                    "op": "add",
                    "path": "/spec/imagePullSecrets/-",
                    "value": {"name": "mirrorgate-a"},
                },
                {
                    "op": "add",
                    "path": "/spec/imagePullSecrets/-",
                    "value": {"name": "mirrorgate-b"},
                },
            ],
            [{"name": "mirrorgate-a"}, {"name": "mirrorgate-b"}],
            id="empty-appended",
        ),
    ],
)
def test_pull_secret_operations(
    secrets: Any, operations: list[dict[str, Any]], result: list[dict[str, str]]
) -> None:
    """Pull secrets are appended with /- when the list exists, else the list is added."""
    pod = _pod({"name": "p"}, secrets)
    ops = patch.build_patch(pod, PLAN)
    assert ops[2:] == operations
    assert jsonpatch.apply_patch(pod, ops)["spec"]["imagePullSecrets"] == result


def test_image_operation() -> None:
    """Each rewrite replaces exactly one container's image."""
    pod = _pod({"name": "p"})
    ops = patch.build_patch(pod, PLAN)
    assert ops[0] == {
        "op": "replace",
        "path": "/spec/containers/1/image",
        "value": "m.example/hub/library/nginx",
    }
    after = jsonpatch.apply_patch(pod, ops)
    assert [c["image"] for c in after["spec"]["containers"]] == ["x", "m.example/hub/library/nginx"]


def test_empty_plan_empty_patch() -> None:
    """A plan that changes nothing gives no operations."""
    plan = policy.RewritePlan(credentials=("a",), warnings=("w",))
    assert patch.build_patch(_pod(), plan) == []


def test_patch_does_not_mutate_pod() -> None:
    """Building the patch leaves the Pod as it was."""
    pod = _pod({"annotations": {"x": "y"}}, [{"name": "regcred"}])
    before = repr(pod)
    patch.build_patch(pod, PLAN)
    assert repr(pod) == before


def _decoded(encoded: str | None) -> list[dict[str, Any]]:
    return [] if encoded is None else orjson.loads(base64.b64decode(encoded))


@pytest.mark.parametrize("metadata", [None, {"generateName": "p-"}, {"annotations": {"x": "y"}}])
@pytest.mark.parametrize("secrets", [None, [{"name": "regcred"}]])
def test_encoded_patch_is_the_built_patch_for_each_pod(metadata: Any, secrets: Any) -> None:
    """One plan shared by Pods that differ in where the patch attaches: each gets its own."""
    pod = _pod(metadata, secrets)
    for _ in range(2):  # the second answer comes from the memo
        assert _decoded(patch.encoded_patch(pod, PLAN)) == patch.build_patch(pod, PLAN)


def test_encoded_patch_of_an_empty_plan_is_none() -> None:
    assert patch.encoded_patch(_pod(), policy.RewritePlan(warnings=("w",))) is None


def test_encoded_patch_never_answers_for_another_plan() -> None:
    """Plans made and dropped one after another (ids reused) each get their own patch."""
    for index in range(50):
        site = policy.ImageSite(field="containers", index=1, name="b", image="nginx")
        plan = policy.RewritePlan(
            rewrites=(
                policy.ImageRewrite(
                    site=site, new_image=f"m.example/hub/library/nginx:{index}", rule_label="r"
                ),
            )
        )
        assert _decoded(patch.encoded_patch(_pod(), plan)) == [
            {
                "op": "replace",
                "path": "/spec/containers/1/image",
                "value": f"m.example/hub/library/nginx:{index}",
            }
        ]
