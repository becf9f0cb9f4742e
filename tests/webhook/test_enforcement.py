"""What a tenant could slip past /mutate before issue 28: Pod updates, image volumes,
kubectl debug under deny, and every covered image left as written, counted by reason."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from mirrorgate import policy
from tests.webhook import policies
from tests.webhook.harness import Harness, make_harness
from tests.webhook.reviews import (
    HUB_IMAGE,
    HUB_MIRRORED,
    HUB_SECRET,
    PROM_IMAGE,
    PROM_MIRRORED,
    UNMATCHED_IMAGE,
    apply,
    original_images,
    patch_ops,
    pod,
    review,
)

NEW_PROM = "quay.io/prometheus/prometheus:v3.0.0"
NEW_PROM_MIRRORED = "mirror.corp.example/prometheus/prometheus:v3.0.0"
NEW_HUB = "nginx:1.28"
NEW_HUB_MIRRORED = "harbor.corp.example/dockerhub-proxy/library/nginx:1.28"


def update(old: dict[str, Any], new: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return review(new, operation="UPDATE", old=old, **kwargs)


def created(harness: Harness, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the API server stores it after mirrorgate's CREATE patch."""
    return apply(obj, patch_ops(harness.mutate(review(obj))))


def unmirrored(harness: Harness) -> dict[str, float]:
    """mirrorgate_images_left_unmirrored_total by reason, from /metrics."""
    prefix = 'mirrorgate_images_left_unmirrored_total{reason="'
    found = {}
    for line in harness.client.get("/metrics").text.splitlines():
        if line.startswith(prefix):
            reason, value = line.removeprefix(prefix).split('"} ')
            found[reason] = float(value)
    return found


# --- Pod UPDATE --------------------------------------------------------------------------------


def test_an_update_that_changes_an_image_rewrites_only_that_image(harness: Harness) -> None:
    """kubectl set image: the new image goes to the mirror, the record follows it, and a
    container that was left as written at creation stays as it is (no restart)."""
    old = created(harness, pod(PROM_IMAGE, UNMATCHED_IMAGE))
    # As if created before mirrorgate covered it: rewriting it now would restart it.
    old["spec"]["containers"][1]["image"] = "quay.io/prometheus/alertmanager:v0.27.0"
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = NEW_PROM
    response = harness.mutate(update(old, new))
    ops = patch_ops(response)
    assert [op["path"] for op in ops] == [
        "/spec/containers/0/image",
        "/metadata/annotations/mirrorgate.io~1original-images",
    ]
    patched = apply(new, ops)
    assert patched["spec"]["containers"][0]["image"] == NEW_PROM_MIRRORED
    assert patched["spec"]["containers"][1] == old["spec"]["containers"][1]
    assert original_images(patched) == {"containers/c0": NEW_PROM}
    assert "warnings" not in response


def test_an_update_of_a_label_changes_nothing(harness: Harness) -> None:
    """A Pod mirrorgate rewrote at creation is not re-patched when its labels change."""
    old = created(harness, pod(HUB_IMAGE, PROM_IMAGE))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"release": "canary"}
    harness.secrets.missing_calls.clear()
    response = harness.mutate(update(old, new))
    assert response == {"uid": review(None)["request"]["uid"], "allowed": True}
    assert harness.secrets.missing_calls == []


def test_an_update_is_never_answered_from_a_create_plan(harness: Harness) -> None:
    """The cache keeps CREATE plans by shape: an update of the same shape is planned apart."""
    obj = pod(HUB_IMAGE, PROM_IMAGE)
    assert patch_ops(harness.mutate(review(obj)))  # the shape's CREATE plan is kept
    relabelled = copy.deepcopy(obj)  # a Pod admitted before mirrorgate: left as it is
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert patch_ops(harness.mutate(update(obj, relabelled))) == []
    assert patch_ops(harness.mutate(update(obj, obj))) == []


def test_a_skip_label_added_by_the_update_does_not_switch_rewriting_off(
    harness: Harness,
) -> None:
    """The Pod was enforced at creation; labelling it skip while changing an image is no way
    around that. The label itself is kept."""
    old = created(harness, pod(PROM_IMAGE))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"mirrorgate.io/skip": "true", "app": "web"}
    new["spec"]["containers"][0]["image"] = NEW_PROM
    patched = apply(new, patch_ops(harness.mutate(update(old, new))))
    assert patched["spec"]["containers"][0]["image"] == NEW_PROM_MIRRORED
    assert patched["metadata"]["labels"] == new["metadata"]["labels"]


def test_an_update_whose_image_needs_a_pull_secret_the_pod_lacks_is_refused(
    harness: Harness,
) -> None:
    """A running Pod's imagePullSecrets cannot change: the message says to recreate it."""
    old = created(harness, pod(PROM_IMAGE))
    assert "imagePullSecrets" not in old["spec"]
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = HUB_IMAGE
    response = harness.mutate(update(old, new))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert f"containers/c0 ('{HUB_IMAGE}') needs {HUB_SECRET!r}" in message
    assert "Recreate the Pod" in message
    assert harness.secrets.ensure_calls == []


def test_an_update_whose_pull_secret_is_on_the_pod_is_rewritten(harness: Harness) -> None:
    """The pull secret the Pod was created with serves the new image too; it is ensured."""
    old = created(harness, pod(HUB_IMAGE))
    assert old["spec"]["imagePullSecrets"] == [{"name": HUB_SECRET}]
    harness.secrets.ensure_calls.clear()
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = NEW_HUB
    patched = apply(new, patch_ops(harness.mutate(update(old, new))))
    assert patched["spec"]["containers"][0]["image"] == NEW_HUB_MIRRORED
    assert patched["spec"]["imagePullSecrets"] == [{"name": HUB_SECRET}]
    assert original_images(patched) == {"containers/c0": NEW_HUB}
    assert harness.secrets.ensure_calls == [("team-a", ("harbor-pull",))]


def test_an_update_to_an_image_under_a_mirror_is_final(harness: Harness) -> None:
    """Reverting to the mirrored image (kubectl apply of the stored Pod) changes nothing."""
    old = pod(PROM_IMAGE)
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = PROM_MIRRORED
    assert patch_ops(harness.mutate(update(old, new))) == []


# --- kubectl debug -----------------------------------------------------------------------------


def debug_update() -> dict[str, Any]:
    old = pod(UNMATCHED_IMAGE)
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": HUB_IMAGE}]
    return update(old, new, sub_resource="ephemeralcontainers")


def test_an_ephemeral_container_needing_a_new_pull_secret_is_refused_under_deny(
    tmp_path: Path,
) -> None:
    made = make_harness(tmp_path, policies.policy_yaml(on_credential_error="deny"))
    with made.client:
        response = made.mutate(debug_update())
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert f"ephemeralContainers/debug ('{HUB_IMAGE}') needs {HUB_SECRET!r}" in message
    assert "onCredentialError is deny" in message
    assert "Recreate the Pod" in message


def test_an_ephemeral_container_left_as_written_under_skip_is_counted(harness: Harness) -> None:
    response = harness.mutate(debug_update())
    assert response["allowed"] is True
    assert patch_ops(response) == []
    assert unmirrored(harness)["credential-unavailable"] == 1


# --- image volumes -----------------------------------------------------------------------------


def volume_pod() -> dict[str, Any]:
    """A container and an image volume that share the name c0: their records must not."""
    obj = pod(PROM_IMAGE)
    obj["spec"]["volumes"] = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "c0", "image": {"reference": HUB_IMAGE, "pullPolicy": "IfNotPresent"}},
        {"name": "tools", "image": {"reference": PROM_IMAGE}},
    ]
    return obj


def test_an_image_volume_is_rewritten_with_its_pull_secret_and_record(harness: Harness) -> None:
    obj = volume_pod()
    ops = patch_ops(harness.mutate(review(obj)))
    patched = apply(obj, ops)
    volumes = patched["spec"]["volumes"]
    assert volumes[1]["image"] == {"reference": HUB_MIRRORED, "pullPolicy": "IfNotPresent"}
    assert volumes[2]["image"] == {"reference": PROM_MIRRORED}
    assert volumes[0] == obj["spec"]["volumes"][0]
    assert patched["spec"]["containers"][0]["image"] == PROM_MIRRORED
    assert patched["spec"]["imagePullSecrets"] == [{"name": HUB_SECRET}]
    assert original_images(patched) == {
        "containers/c0": PROM_IMAGE,
        "volumes/c0": HUB_IMAGE,
        "volumes/tools": PROM_IMAGE,
    }
    # Reinvocation on the output plans nothing.
    assert patch_ops(harness.mutate(review(patched))) == []


def test_image_volumes_are_reported_in_audit(harness: Harness) -> None:
    response = harness.post("/audit", review(volume_pod()))["response"]
    assert "patch" not in response
    assert set(json.loads(response["auditAnnotations"]["rewrites"])) == {
        "containers/c0",
        "volumes/c0",
        "volumes/tools",
    }
    assert unmirrored(harness)["audit"] == 3


@pytest.mark.parametrize(
    ("volume", "warning"),
    [
        ({"name": "v", "image": "nginx"}, "volumes/v: image is not a mapping; left as written"),
        (
            {"name": "v", "image": {"reference": 7}},
            "volumes/v: image.reference is not a string; left as written",
        ),
        ({"image": {"reference": "nginx"}}, "spec.volumes[0] has no name; left as written"),
    ],
)
def test_a_malformed_image_volume_is_named_in_a_warning(
    harness: Harness, volume: dict[str, Any], warning: str
) -> None:
    obj = pod(PROM_IMAGE)
    obj["spec"]["volumes"] = [volume]
    response = harness.mutate(review(obj))
    assert response["allowed"] is True
    assert response["warnings"] == [warning]
    assert apply(obj, patch_ops(response))["spec"]["containers"][0]["image"] == PROM_MIRRORED


# --- the unmirrored count ----------------------------------------------------------------------


def test_every_reason_is_a_series_from_the_start(harness: Harness) -> None:
    assert unmirrored(harness) == dict.fromkeys(policy.UNMIRRORED_REASONS, 0.0)


def test_a_fallback_while_a_mirror_is_down_is_counted(harness: Harness) -> None:
    harness.runtime.health = policy.Health(down={"mirror.corp.example": "refused"})
    response = harness.mutate(review(pod(PROM_IMAGE, PROM_IMAGE, HUB_IMAGE)))
    assert len(response["warnings"]) == 2
    assert unmirrored(harness)["mirror-unhealthy"] == 2


def test_audit_counts_every_covered_image(harness: Harness) -> None:
    harness.post("/audit", review(pod(HUB_IMAGE, PROM_IMAGE, UNMATCHED_IMAGE, PROM_MIRRORED)))
    assert unmirrored(harness)["audit"] == 2


NOT_GRANTED = """\
mirrors:
  - source: docker.io
    mirror: harbor.corp.example/dockerhub-proxy
    credential: harbor-pull
  - source: quay.io
    mirror: harbor.corp.example/quay/"""  # a name past 255 characters on the mirror
NOT_GRANTED += (
    "p" * 240
    + """
credentials:
  harbor-pull: {namespaces: [other]}
"""
)


def test_images_not_granted_or_invalid_on_the_mirror_are_counted(tmp_path: Path) -> None:
    made = make_harness(tmp_path, NOT_GRANTED)
    with made.client:
        response = made.mutate(review(pod(HUB_IMAGE, "quay.io/prometheus/" + "x" * 20)))
        counts = unmirrored(made)
    assert len(response["warnings"]) == 2
    assert (counts["not-granted"], counts["invalid"]) == (1, 1)
