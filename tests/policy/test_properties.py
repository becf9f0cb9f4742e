"""Properties of planning and patching over generated Pods and policies."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.policy import reference
from mirrorgate.webhook import patch
from mirrorgate.webhook.admissioncache import AdmissionCache
from tests.policy import strategies

PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
Scenario = tuple[dict[str, Any], str, policy.Policy]
ALLOWED_PATHS = re.compile(
    r"/spec/(containers|initContainers|ephemeralContainers)/\d+/image"
    r"|/spec/volumes/\d+/image/reference"
    r"|/metadata(/annotations(/mirrorgate\.io~1original-images)?)?"
    r"|/spec/imagePullSecrets(/-)?"
)


def _admit(
    pod: dict[str, Any], namespace: str, mirror_policy: policy.Policy
) -> tuple[policy.RewritePlan, list[Any], dict[str, Any]]:
    plan = policy.plan(pod, namespace=namespace, mirror_policy=mirror_policy)
    ops = patch.build_patch(pod, plan)
    return plan, ops, jsonpatch.apply_patch(pod, ops)


def _images(pod: dict[str, Any]) -> dict[str, object]:
    """Every image of ``pod`` by its pointer, less ``/spec/`` and ``/image``."""
    spec = pod.get("spec") or {}
    images = {
        f"{field}/{i}": c.get("image")
        for field in policy.CONTAINER_FIELDS
        for i, c in enumerate(spec.get(field) or [])
    }
    for i, volume in enumerate(spec.get("volumes") or []):
        if "image" in volume:
            images[f"volumes/{i}"] = volume["image"].get("reference")
    return images


def _rule(mirror_policy: policy.Policy, label: str) -> policy.MirrorRule:
    (rule,) = [r for r in mirror_policy.rules if r.label == label]
    return rule


@PROPERTY_SETTINGS
@given(strategies.scenarios())
def test_admitting_twice_changes_nothing(scenario: Scenario) -> None:
    """Planning an admitted Pod again gives no rewrites, secrets or annotation, and no patch."""
    pod, namespace, mirror_policy = scenario
    first, _, admitted = _admit(pod, namespace, mirror_policy)
    second = policy.plan(admitted, namespace=namespace, mirror_policy=mirror_policy)
    assert second.rewrites == ()
    assert second.pull_secrets == ()
    assert second.original_images is None
    assert set(first.credentials) <= set(second.credentials)
    assert patch.build_patch(admitted, second) == []


@PROPERTY_SETTINGS
@given(strategies.scenarios())
def test_tag_and_digest_never_dropped(scenario: Scenario) -> None:
    """Every rewritten image keeps the tag and digest of the original, and adds none."""
    pod, namespace, mirror_policy = scenario
    plan = policy.plan(pod, namespace=namespace, mirror_policy=mirror_policy)
    for rewrite in plan.rewrites:
        old = reference.parse_normalized(rewrite.site.image)
        new = reference.parse_normalized(rewrite.new_image)
        assert (new.tag, new.digest) == (old.tag, old.digest)
        assert rewrite.new_image.endswith(str(old)[len(old.name) :])


@PROPERTY_SETTINGS
@given(strategies.scenarios())
def test_rewritten_images_sit_under_their_mirror(scenario: Scenario) -> None:
    """Every rewritten image parses, sits under its rule's mirror, and resolves as on-mirror."""
    pod, namespace, mirror_policy = scenario
    plan = policy.plan(pod, namespace=namespace, mirror_policy=mirror_policy)
    for rewrite in plan.rewrites:
        rule = _rule(mirror_policy, rewrite.rule_label)
        new = reference.parse_normalized(rewrite.new_image)
        assert rewrite.new_image == str(new)
        assert new.domain == rule.mirror.host
        # An image named exactly the source prefix lands on the mirror path itself.
        assert new.path == rule.mirror.path or new.path.startswith(f"{rule.mirror.path}/")
        assert mirror_policy.resolve(rewrite.new_image).outcome in ("on-mirror", "excluded")


@PROPERTY_SETTINGS
@given(strategies.policies(), st.data())
def test_a_host_respelled_resolves_alike(mirror_policy: policy.Policy, data: st.DataObject) -> None:
    """Case and an explicit :443 do not change what the policy does with an image: the same
    outcome, rule and image on the mirror (its host as configured), exclusions included."""
    mirrors = [str(r.mirror) for r in mirror_policy.rules]
    sources = [str(r.source) for r in mirror_policy.rules]
    image = data.draw(strategies.images(mirrors, sources))
    respelled = data.draw(strategies.respellings(image))
    written, seen = mirror_policy.resolve(image), mirror_policy.resolve(respelled)
    assert (seen.outcome, seen.rule, seen.new_image) == (
        written.outcome,
        written.rule,
        written.new_image,
    )


@PROPERTY_SETTINGS
@given(strategies.scenarios())
def test_patch_touches_only_rewritten_images(scenario: Scenario) -> None:
    """Images not rewritten stay byte-identical, and the patch touches only the allowed paths."""
    pod, namespace, mirror_policy = scenario
    plan, ops, admitted = _admit(pod, namespace, mirror_policy)
    for op in ops:
        assert ALLOWED_PATHS.fullmatch(op["path"]), op
    rewritten = {
        r.site.pointer.removeprefix("/spec/").removesuffix("/reference").removesuffix("/image"): (
            r.new_image
        )
        for r in plan.rewrites
    }
    before, after = _images(pod), _images(admitted)
    assert after == {**before, **rewritten}
    assert admitted.get("spec", {}).keys() - {"imagePullSecrets"} == (
        pod.get("spec", {}).keys() - {"imagePullSecrets"}
    )
    old_secrets = pod.get("spec", {}).get("imagePullSecrets") or []
    new_secrets = admitted.get("spec", {}).get("imagePullSecrets") or []
    assert new_secrets == [*old_secrets, *({"name": s} for s in plan.pull_secrets)]


@PROPERTY_SETTINGS
@given(strategies.scenarios())
def test_annotation_holds_originals_of_rewritten(scenario: Scenario) -> None:
    """The annotation gains exactly the original strings of rewritten containers, and keeps
    of what was there only the entries whose container sits on the mirror of that original.

    A Pod left alone as a whole (excluded namespace, skip label) is left alone, record too.
    """
    pod, namespace, mirror_policy = scenario
    plan, _, admitted = _admit(pod, namespace, mirror_policy)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if plan.skipped is not None:
        assert (plan.original_images, admitted) == (None, pod)
        return
    existing = json.loads(annotations.get(policy.ORIGINAL_IMAGES_ANNOTATION, "{}"))
    sites, _ = policy.find_image_sites(pod)
    current = {site.key: site.image for site in sites}
    kept = {
        key: original
        for key, original in existing.items()
        if key in current and current[key] == mirror_policy.resolve(original).new_image
    }
    new_annotations = (admitted.get("metadata") or {}).get("annotations") or {}
    added = {r.site.key: r.site.image for r in plan.rewrites if r.site.key not in kept}
    if added or kept != existing:
        expected = {**kept, **added}
        assert plan.original_images == expected
        written = new_annotations.get(policy.ORIGINAL_IMAGES_ANNOTATION)
        assert (json.loads(written) if written is not None else {}) == expected
        assert (written is None) == (not expected)
    else:
        assert plan.original_images is None
        assert new_annotations.get(policy.ORIGINAL_IMAGES_ANNOTATION) == annotations.get(
            policy.ORIGINAL_IMAGES_ANNOTATION
        )
    assert {k: v for k, v in new_annotations.items() if k != policy.ORIGINAL_IMAGES_ANNOTATION} == {
        k: v for k, v in annotations.items() if k != policy.ORIGINAL_IMAGES_ANNOTATION
    }


@PROPERTY_SETTINGS
@given(strategies.scenarios())
def test_a_record_cannot_name_fake_originals(scenario: Scenario) -> None:
    """Whatever the record says, every kept entry is the original of its container's
    image: the image on the mirror is what the policy makes of it."""
    pod, namespace, mirror_policy = scenario
    plan, _, admitted = _admit(pod, namespace, mirror_policy)
    if plan.skipped is not None:
        return  # not admitted by mirrorgate: it makes no record, and reads none
    written = ((admitted.get("metadata") or {}).get("annotations") or {}).get(
        policy.ORIGINAL_IMAGES_ANNOTATION
    )
    record = json.loads(written) if written is not None else {}
    sites, _ = policy.find_image_sites(admitted)
    current = {site.key: site.image for site in sites}
    for key, original in record.items():
        assert current[key] == mirror_policy.resolve(original).new_image


@PROPERTY_SETTINGS
@given(strategies.scenarios())
def test_credentials_only_where_granted(scenario: Scenario) -> None:
    """Only credentials granted to the namespace are attached, and each at most once."""
    pod, namespace, mirror_policy = scenario
    plan, _, admitted = _admit(pod, namespace, mirror_policy)
    for credential in plan.credentials:
        assert mirror_policy.is_granted(credential, namespace)
    names = [s["name"] for s in admitted.get("spec", {}).get("imagePullSecrets") or []]
    for secret in plan.pull_secrets:
        assert names.count(secret) == 1
    for rewrite in plan.rewrites:
        needed = [
            c
            for c in _rule(mirror_policy, rewrite.rule_label).credentials
            if mirror_policy.is_granted(c, namespace)
        ]
        assert len(needed) <= 1
        assert all(policy.pull_secret_name(c) in names for c in needed)


@PROPERTY_SETTINGS
@given(strategies.scenarios(), strategies.scenarios())
def test_plans_shared_by_shape_equal_fresh_plans(first: Scenario, second: Scenario) -> None:
    """A plan looked up by Pod shape equals one computed in full, for every Pod."""
    _, _, mirror_policy = first
    cache = AdmissionCache()
    for pod, namespace, _ in (first, second, first):
        fresh = policy.plan(pod, namespace=namespace, mirror_policy=mirror_policy)

        def shared(pod: dict[str, Any], namespace: str = namespace) -> policy.RewritePlan:
            return cache.admitted(
                pod, namespace=namespace, mirror_policy=mirror_policy, health=policy.HEALTHY
            ).plan

        assert shared(pod) == fresh
        # The replica of a workload: another name and uid, the same shape.
        replica = json.loads(json.dumps(pod))
        if isinstance(replica.get("metadata"), dict):
            replica["metadata"]["name"] = "replica-x7k2p"
            replica["metadata"]["uid"] = "0000-replica"
        assert shared(replica) == fresh
