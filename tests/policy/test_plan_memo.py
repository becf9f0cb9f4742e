"""Plans shared by Pod shape: never shared by Pods of different structure, and bounded.

The memo keys Pods by everything a plan reads. A key that flattened field
names and container (name, image) pairs into one token stream once let a
Pod whose containers were named like fields receive another Pod's plan, and
a patch that failed to apply (issue 10, item 3).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.policy import model, planner, reference
from mirrorgate.webhook import patch

POLICY_DOCUMENT = {
    "mirrors": [
        {"source": "docker.io", "mirror": "mirror.corp.example/hub"},
        {"source": "quay.io", "mirror": "mirror.corp.example/quay"},
    ],
}
FIELDS = policy.CONTAINER_FIELDS


def fresh_policy() -> policy.Policy:
    return policy.load(POLICY_DOCUMENT)


def full_plan(pod: dict[str, Any], namespace: str, rules: policy.Policy) -> policy.RewritePlan:
    """The plan computed from scratch, bypassing the memo."""
    return planner._plan(
        pod,
        namespace=namespace,
        policy=rules,
        fields=FIELDS,
        frozen=frozenset(),
        can_add_pull_secrets=True,
        can_annotate=True,
        unavailable=None,
    )


def spec_pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def test_the_collision_from_the_issue() -> None:
    """Three single-container lists vs one list whose names and images spell the field names."""
    three_lists = spec_pod(
        {
            "containers": [{"name": "a", "image": "nginx"}],
            "initContainers": [{"name": "b", "image": "busybox"}],
            "ephemeralContainers": [{"name": "c", "image": "quay.io/x/y"}],
        }
    )
    one_list = spec_pod(
        {
            "containers": [
                {"name": "a", "image": "nginx"},
                {"name": "initContainers", "image": "b"},
                {"name": "busybox", "image": "ephemeralContainers"},
                {"name": "c", "image": "quay.io/x/y"},
            ]
        }
    )
    rules = fresh_policy()
    policy.plan(three_lists, namespace="ns", policy=rules)
    shared = policy.plan(one_list, namespace="ns", policy=rules)
    assert shared == full_plan(one_list, "ns", rules)
    patched = jsonpatch.apply_patch(copy.deepcopy(one_list), patch.build_patch(one_list, shared))
    assert [c["image"] for c in patched["spec"]["containers"]] == [
        "mirror.corp.example/hub/library/nginx",
        "mirror.corp.example/hub/library/b",
        "ephemeralContainers",
        "mirror.corp.example/quay/x/y",
    ]


# Names and images drawn from a pool that includes the field names and each
# other, so that generated Pods collide under any flattening of the key.
TOKENS = (
    "containers",
    "initContainers",
    "ephemeralContainers",
    "a",
    "b",
    "nginx",
    "quay.io/x/y",
    "imagePullSecrets",
)
_containers = st.lists(
    st.fixed_dictionaries({"name": st.sampled_from(TOKENS), "image": st.sampled_from(TOKENS)}),
    max_size=3,
)


@st.composite
def colliding_pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for field in FIELDS:
        if draw(st.booleans()):
            spec[field] = draw(_containers)
    if draw(st.booleans()):
        spec["imagePullSecrets"] = [
            {"name": n} for n in draw(st.lists(st.sampled_from(TOKENS), max_size=2))
        ]
    return spec_pod(spec)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pods=st.lists(colliding_pods(), min_size=2, max_size=4),
    namespaces=st.lists(st.sampled_from(TOKENS), min_size=4, max_size=4),
)
def test_pods_of_different_structure_never_share_a_plan(
    pods: list[dict[str, Any]], namespaces: list[str]
) -> None:
    """Planned in turn through one memo: each plan is its own, and its patch applies."""
    rules = fresh_policy()
    for pod, namespace in zip(pods, namespaces, strict=False):
        found = policy.plan(pod, namespace=namespace, policy=rules)
        assert found == full_plan(pod, namespace, rules)
        jsonpatch.apply_patch(copy.deepcopy(pod), patch.build_patch(pod, found))
    keys = [
        planner._shape(pod, ns, policy.HEALTHY) for pod, ns in zip(pods, namespaces, strict=False)
    ]
    for (pod_a, ns_a), key_a in zip(zip(pods, namespaces, strict=False), keys, strict=True):
        for (pod_b, ns_b), key_b in zip(zip(pods, namespaces, strict=False), keys, strict=True):
            if key_a is not None and key_b is not None and key_a == key_b:
                assert (json.dumps(pod_a["spec"], sort_keys=True), ns_a) == (
                    json.dumps(pod_b["spec"], sort_keys=True),
                    ns_b,
                )


def test_repeated_container_names_keep_every_original() -> None:
    """Two containers called `app`: both originals are kept, under index-qualified keys."""
    pod = spec_pod(
        {
            "containers": [
                {"name": "app", "image": "nginx:1"},
                {"name": "app", "image": "quay.io/x/y:2"},
                {"name": "side", "image": "nginx:3"},
            ]
        }
    )
    found = policy.plan(pod, namespace="ns", policy=fresh_policy())
    assert found.original_images == {
        "containers[0]/app": "nginx:1",
        "containers[1]/app": "quay.io/x/y:2",
        "containers/side": "nginx:3",
    }
    patched = jsonpatch.apply_patch(copy.deepcopy(pod), patch.build_patch(pod, found))
    # Admitted again (reinvocation): nothing more to do, the record stays.
    assert policy.plan(patched, namespace="ns", policy=fresh_policy()).original_images is None


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = {"n": [value]}
    return value


def test_a_pull_secret_name_nested_a_thousand_deep_is_ignored() -> None:
    pod = spec_pod(
        {
            "containers": [{"name": "c", "image": "nginx"}],
            "imagePullSecrets": [{"name": nested(1000)}, {"name": "regcred"}],
        }
    )
    found = policy.plan(pod, namespace="ns", policy=fresh_policy())
    assert [r.new_image for r in found.rewrites] == ["mirror.corp.example/hub/library/nginx"]


LONGEST_VALID = "h" * 253 + ":65535/" + "p" * 255 + ":" + "t" * 128 + "@sha512:" + "0" * 128


def test_the_longest_valid_reference_is_exactly_the_bound() -> None:
    assert len(LONGEST_VALID) == reference.REFERENCE_LENGTH_MAX
    assert reference.parse_normalized(LONGEST_VALID).domain == "h" * 253 + ":65535"
    rules = fresh_policy()
    assert rules.resolve(LONGEST_VALID).outcome == "unmatched"
    assert rules.resolve("x" + LONGEST_VALID).outcome == "invalid"


@pytest.mark.parametrize("size", [reference.REFERENCE_LENGTH_MAX + 1, 2_500_000])
def test_an_image_longer_than_any_reference_enters_no_memo(size: int) -> None:
    rules = fresh_policy()
    image = "docker.io/library/" + "a" * (size - 18)
    pod = spec_pod({"containers": [{"name": "c", "image": image}]})
    found = policy.plan(pod, namespace="ns", policy=rules)
    (warning,) = found.warnings
    assert f"{size} characters" in warning
    assert len(warning) < 2_000
    assert len(rules._resolutions) == 0
    assert len(rules.plans) == 0


def test_memos_are_bounded_by_bytes_as_well_as_entries() -> None:
    """Unique 760-character images: the byte bound empties the memo before the entry bound."""
    rules = fresh_policy()
    for i in range(4000):
        image = f"quay.io/{i:06d}/" + "a" * 740
        policy.plan(
            spec_pod({"containers": [{"name": "c", "image": image}]}), namespace="ns", policy=rules
        )
        assert rules._resolutions.held <= model.RESOLUTION_MEMO_BYTES
        assert rules.plans.held <= model.PLAN_MEMO_BYTES
    assert 0 < len(rules._resolutions) < 3000 < model.MEMO_ENTRIES
    # What is charged is close to what is held: strings dominate.
    assert rules._resolutions.held >= len(rules._resolutions) * 3 * 760


def test_plans_are_shared_under_a_health_state_and_never_across_two() -> None:
    """A mirror down is shared by every Pod planned while it lasts, and only by them."""
    rules = fresh_policy()
    pod = spec_pod(
        {"containers": [{"name": "a", "image": "nginx"}, {"name": "b", "image": "quay.io/x/y"}]}
    )
    down = policy.Health(down={"mirror.corp.example": "refused"})
    healthy = policy.plan(pod, namespace="ns", policy=rules)
    under_down = policy.plan(pod, namespace="ns", policy=rules, health=down)
    assert under_down == planner._plan(
        pod,
        namespace="ns",
        policy=rules,
        fields=FIELDS,
        frozen=frozenset(),
        can_add_pull_secrets=True,
        can_annotate=True,
        unavailable=None,
        health=down,
    )
    assert (len(healthy.rewrites), under_down.fallbacks) == (2, 2)
    # The same state, published again as another value, finds the same plan.
    again = policy.Health(down=dict(down.down))
    assert policy.plan(copy.deepcopy(pod), namespace="ns", policy=rules, health=again) is under_down
    assert policy.plan(copy.deepcopy(pod), namespace="ns", policy=rules) is healthy
    elsewhere = policy.Health(down={"other.example": "refused"})
    assert policy.plan(pod, namespace="ns", policy=rules, health=elsewhere) == healthy
    assert len(rules.plans) == 3


def test_what_callers_derive_from_a_shared_plan_is_made_once() -> None:
    """The encoded patch rides with the plan: a replica finds it; another shape does not."""
    rules = fresh_policy()
    pod = spec_pod({"containers": [{"name": "a", "image": "nginx"}]})
    replica = copy.deepcopy(pod)
    replica["metadata"]["name"] = "p-2"
    first = patch.encoded_patch(pod, policy.plan(pod, namespace="ns", policy=rules))
    assert patch.encoded_patch(replica, policy.plan(replica, namespace="ns", policy=rules)) is first
    other = spec_pod({"containers": [{"name": "a", "image": "quay.io/x/y"}]})
    assert patch.encoded_patch(other, policy.plan(other, namespace="ns", policy=rules)) != first
