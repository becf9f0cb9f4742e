"""The admission cache: plans shared by Pod shape, never by Pods of different structure,
and everything it keeps bounded by one budget.

The cache keys Pods by everything a plan reads (:func:`policy.shape_key`). A
key that flattened field names and container (name, image) pairs into one token stream once let a
Pod whose containers were named like fields receive another Pod's plan, and
a patch that failed to apply (issue 10, item 3).
"""

from __future__ import annotations

import copy
import functools
import json
import weakref
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.policy import reference
from mirrorgate.webhook import admissioncache, patch, policyfile
from mirrorgate.webhook.admissioncache import AdmissionCache
from mirrorgate.webhook.edge import app
from tests.webhook.fakes import RecordingPullSecrets

POLICY_DOCUMENT = {
    "mirrors": [
        {"source": "docker.io", "mirror": "mirror.corp.example/hub"},
        {"source": "quay.io", "mirror": "mirror.corp.example/quay"},
    ],
}
FIELDS = policy.CONTAINER_FIELDS


def fresh_policy() -> policy.Policy:
    return policy.load(POLICY_DOCUMENT)


def full_plan(
    pod: dict[str, Any], namespace: str, mirror_policy: policy.Policy
) -> policy.RewritePlan:
    """The plan computed from scratch: policy.plan is pure."""
    return policy.plan(pod, namespace=namespace, mirror_policy=mirror_policy)


def cached_plan(
    cache: AdmissionCache,
    pod: dict[str, Any],
    namespace: str,
    mirror_policy: policy.Policy,
    health: policy.Health = policy.HEALTHY,
) -> policy.RewritePlan:
    return cache.admitted(pod, namespace=namespace, mirror_policy=mirror_policy, health=health).plan


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
    mirror_policy, cache = fresh_policy(), AdmissionCache()
    cached_plan(cache, three_lists, "ns", mirror_policy)
    shared = cached_plan(cache, one_list, "ns", mirror_policy)
    assert shared == full_plan(one_list, "ns", mirror_policy)
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
    """Planned in turn through one cache: each plan is its own, and its patch applies."""
    mirror_policy, cache = fresh_policy(), AdmissionCache()
    for pod, namespace in zip(pods, namespaces, strict=False):
        found = cached_plan(cache, pod, namespace, mirror_policy)
        assert found == full_plan(pod, namespace, mirror_policy)
        jsonpatch.apply_patch(copy.deepcopy(pod), patch.build_patch(pod, found))
    keys = [
        policy.shape_key(pod, ns, policy.HEALTHY) for pod, ns in zip(pods, namespaces, strict=False)
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
    found = policy.plan(pod, namespace="ns", mirror_policy=fresh_policy())
    assert found.original_images == {
        "containers[0]/app": "nginx:1",
        "containers[1]/app": "quay.io/x/y:2",
        "containers/side": "nginx:3",
    }
    patched = jsonpatch.apply_patch(copy.deepcopy(pod), patch.build_patch(pod, found))
    # Admitted again (reinvocation): nothing more to do, the record stays.
    assert (
        policy.plan(patched, namespace="ns", mirror_policy=fresh_policy()).original_images is None
    )


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
    found = policy.plan(pod, namespace="ns", mirror_policy=fresh_policy())
    assert [r.new_image for r in found.rewrites] == ["mirror.corp.example/hub/library/nginx"]


LONGEST_VALID = "h" * 253 + ":65535/" + "p" * 255 + ":" + "t" * 128 + "@sha512:" + "0" * 128


def test_the_longest_valid_reference_is_exactly_the_bound() -> None:
    assert len(LONGEST_VALID) == reference.REFERENCE_LENGTH_MAX
    assert reference.parse_normalized(LONGEST_VALID).domain == "h" * 253 + ":65535"
    mirror_policy = fresh_policy()
    assert mirror_policy.resolve(LONGEST_VALID).outcome == "unmatched"
    assert mirror_policy.resolve("x" + LONGEST_VALID).outcome == "invalid"


@pytest.mark.parametrize("size", [reference.REFERENCE_LENGTH_MAX + 1, 2_500_000])
def test_an_image_longer_than_any_reference_is_not_kept(size: int) -> None:
    mirror_policy, cache = fresh_policy(), AdmissionCache()
    image = "docker.io/library/" + "a" * (size - 18)
    pod = spec_pod({"containers": [{"name": "c", "image": image}]})
    found = cached_plan(cache, pod, "ns", mirror_policy)
    (warning,) = found.warnings
    assert f"{size} characters" in warning
    assert len(warning) < 2_000
    assert not cache.resolved(image)
    assert cache.shapes == 0
    assert len(cache) == 0


def test_the_cache_is_bounded_by_bytes_as_well_as_entries() -> None:
    """Unique 760-character images: the byte bound empties the cache before the entry bound."""
    mirror_policy, cache = fresh_policy(), AdmissionCache()
    images = [f"quay.io/{i:06d}/" + "a" * 740 for i in range(4000)]
    for image in images:
        cached_plan(
            cache, spec_pod({"containers": [{"name": "c", "image": image}]}), "ns", mirror_policy
        )
        assert cache.held <= admissioncache.MAX_BYTES
        assert len(cache) <= admissioncache.MAX_ENTRIES
    resolutions = sum(map(cache.resolved, images))
    assert 0 < resolutions < 3000 < admissioncache.MAX_ENTRIES
    # What is charged is close to what is held: strings dominate.
    assert cache.held >= resolutions * 3 * 760


def test_plans_are_shared_under_a_health_state_and_never_across_two() -> None:
    """A mirror down is shared by every Pod planned while it lasts, and only by them."""
    mirror_policy, cache = fresh_policy(), AdmissionCache()
    pod = spec_pod(
        {"containers": [{"name": "a", "image": "nginx"}, {"name": "b", "image": "quay.io/x/y"}]}
    )
    down = policy.Health(down={"mirror.corp.example": "refused"})
    healthy = cached_plan(cache, pod, "ns", mirror_policy)
    under_down = cached_plan(cache, pod, "ns", mirror_policy, down)
    assert under_down == policy.plan(pod, namespace="ns", mirror_policy=mirror_policy, health=down)
    assert (len(healthy.rewrites), under_down.fallbacks) == (2, 2)
    # The same state, published again as another value, finds the same plan.
    again = policy.Health(down=dict(down.down))
    assert cached_plan(cache, copy.deepcopy(pod), "ns", mirror_policy, again) is under_down
    assert cached_plan(cache, copy.deepcopy(pod), "ns", mirror_policy) is healthy
    elsewhere = policy.Health(down={"other.example": "refused"})
    assert cached_plan(cache, pod, "ns", mirror_policy, elsewhere) == healthy
    assert cache.shapes == 3


def test_what_callers_derive_from_a_shared_plan_is_made_once() -> None:
    """The encoded patch rides with the plan: a replica finds it; another shape does not."""
    mirror_policy, cache = fresh_policy(), AdmissionCache()
    pod = spec_pod({"containers": [{"name": "a", "image": "nginx"}]})
    replica = copy.deepcopy(pod)
    replica["metadata"]["name"] = "p-2"

    def encoded(pod: dict[str, Any]) -> str | None:
        admitted = cache.admitted(
            pod, namespace="ns", mirror_policy=mirror_policy, health=policy.HEALTHY
        )
        return admitted.patch(lambda: patch.encoded_patch(pod, admitted.plan))

    first = encoded(pod)
    assert encoded(replica) is first
    other = spec_pod({"containers": [{"name": "a", "image": "quay.io/x/y"}]})
    assert encoded(other) != first


def test_resolution_is_memoised() -> None:
    """Resolving the same string twice through the cache returns the same Resolution."""
    mirror_policy, cache = fresh_policy(), AdmissionCache()
    resolve = cache.resolver(mirror_policy)
    assert resolve("nginx") is resolve("nginx")
    assert cache.resolver(mirror_policy)("nginx") is resolve("nginx")
    assert resolve("nginx") == mirror_policy.resolve("nginx")


def test_what_is_derived_from_a_plan_is_kept_beside_it_and_goes_with_it() -> None:
    """The cache, not the frozen plan, holds the patch; a new policy served drops both."""
    mirror_policy, cache = fresh_policy(), AdmissionCache()
    pod = spec_pod({"containers": [{"name": "a", "image": "nginx"}]})
    admitted = cache.admitted(
        pod, namespace="ns", mirror_policy=mirror_policy, health=policy.HEALTHY
    )
    made: list[str | None] = []

    def make(plan: policy.RewritePlan) -> str | None:
        made.append(patch.encoded_patch(pod, plan))
        return made[-1]

    plan = admitted.plan
    encoded = admitted.patch(functools.partial(make, plan))
    assert admitted.patch(functools.partial(make, plan)) is encoded
    assert made == [encoded]
    replica = copy.deepcopy(pod)
    assert (
        cache.admitted(replica, namespace="ns", mirror_policy=mirror_policy, health=policy.HEALTHY)
        is admitted
    )
    assert (cache.shapes, cache.resolved("nginx")) == (1, True)
    gone = weakref.ref(plan)
    del admitted, plan
    newer = fresh_policy()
    cache.retain([newer])  # what the server does when it serves a new policy
    again = cache.admitted(pod, namespace="ns", mirror_policy=newer, health=policy.HEALTHY)
    assert gone() is None  # nothing of the cache keeps the old policy's plan alive
    assert again.plan == full_plan(pod, "ns", newer)
    assert cache.shapes == 1


def test_the_entry_bound_empties_the_cache() -> None:
    """Entries are bounded as well as bytes: the entry past the bound starts afresh."""
    mirror_policy, cache = fresh_policy(), AdmissionCache(max_entries=10)
    for i in range(5):
        cached_plan(
            cache, spec_pod({"containers": [{"name": "c", "image": f"n{i}"}]}), "ns", mirror_policy
        )
    assert (len(cache), cache.shapes) == (10, 5)
    cached_plan(
        cache, spec_pod({"containers": [{"name": "c", "image": "n5"}]}), "ns", mirror_policy
    )
    assert (len(cache), cache.shapes) == (2, 1)
    assert cache.resolved("n5")
    assert not cache.resolved("n0")


def test_an_entry_over_a_sixteenth_of_the_bytes_is_not_kept() -> None:
    mirror_policy, cache = fresh_policy(), AdmissionCache(max_bytes=16 * 1000)
    cached_plan(
        cache, spec_pod({"containers": [{"name": "c", "image": "nginx"}]}), "ns", mirror_policy
    )
    assert cache.resolved("nginx")
    long = "quay.io/x/" + "a" * 400
    cached_plan(
        cache, spec_pod({"containers": [{"name": "c", "image": long}]}), "ns", mirror_policy
    )
    assert not cache.resolved(long)
    assert cache.resolved("nginx")  # and nothing else was evicted for it


def team_objects(count: int, *, moved: int | None = None) -> list[policy.PolicyObject]:
    """A cluster policy and ``count`` namespaces, each with a MirrorPolicy of its own
    (``moved``'s mirror elsewhere)."""
    cluster = {
        "apiVersion": policy.API_VERSION,
        "kind": policy.CLUSTER_KIND,
        "metadata": {"name": "base"},
        "spec": POLICY_DOCUMENT,
    }
    teams = [
        {
            "apiVersion": policy.API_VERSION,
            "kind": policy.NAMESPACED_KIND,
            "metadata": {"name": "own", "namespace": f"team-{i}"},
            "spec": {
                "mirrors": [
                    {"source": "docker.io", "mirror": f"m.example/team-{i}{'-v2' * (i == moved)}"}
                ]
            },
        }
        for i in range(count)
    ]
    return [policy.parse_object(o) for o in (cluster, *teams)]


def team_policies(count: int) -> policy.Composition:
    return policy.compose(team_objects(count))


def test_pods_of_many_namespace_policies_hit_in_turn() -> None:
    """The cause of issue 30's 10.7×: a cache of one policy emptied itself for each
    namespace's. Keyed by policy, Pods of namespaces in turn are planned once each."""
    composition = team_policies(50)
    cache = AdmissionCache()
    cache.retain(composition.policies)
    namespaces = [*composition.namespaced, "plain"]
    pod = spec_pod({"containers": [{"name": "a", "image": "nginx"}]})
    first = {ns: cached_plan(cache, pod, ns, composition.policy_for(ns)) for ns in namespaces}
    for _ in range(3):
        for ns in namespaces:
            assert (
                cached_plan(cache, copy.deepcopy(pod), ns, composition.policy_for(ns))
                is (first[ns])
            )
    assert (cache.shapes, cache.policies) == (51, 51)
    (rewrite,) = first["team-7"].rewrites
    assert rewrite.new_image == "m.example/team-7/library/nginx"
    (plain,) = first["plain"].rewrites
    assert plain.new_image == "mirror.corp.example/hub/library/nginx"


def test_a_policy_not_in_force_is_answered_and_not_kept() -> None:
    """A review planned under the composition before (still in flight at the swap) gets
    its own policy's plan, and nothing of it is kept."""
    composition, stale = team_policies(2), fresh_policy()
    cache = AdmissionCache()
    cache.retain(composition.policies)
    pod = spec_pod({"containers": [{"name": "a", "image": "nginx"}]})
    assert cached_plan(cache, pod, "team-0", stale) == full_plan(pod, "team-0", stale)
    assert (len(cache), cache.policies) == (0, 0)


def test_a_changed_namespace_policy_replans_that_namespace_only() -> None:
    """Composed again with the last composition, the namespaces whose rules did not
    change keep their policy object, so the cache keeps their plans."""
    before = team_policies(3)
    cache = AdmissionCache()
    cache.retain(before.policies)
    pod = spec_pod({"containers": [{"name": "a", "image": "nginx"}]})
    kept = {ns: cached_plan(cache, pod, ns, before.policy_for(ns)) for ns in before.namespaced}
    after = policy.compose(team_objects(3, moved=1), previous=before)
    assert after.cluster is before.cluster
    assert [after.namespaced[ns] is before.namespaced[ns] for ns in before.namespaced] == [
        True,
        False,
        True,
    ]
    cache.retain(after.policies)
    assert cache.shapes == 2
    for ns in ("team-0", "team-2"):
        assert cached_plan(cache, pod, ns, after.policy_for(ns)) is kept[ns]
    (moved,) = cached_plan(cache, pod, "team-1", after.policy_for("team-1")).rewrites
    assert moved.new_image == "m.example/team-1-v2/library/nginx"


def test_the_server_keeps_nothing_for_a_policy_it_no_longer_serves() -> None:
    """The runtime tells its cache of every policy it swaps in."""
    data = json.dumps(POLICY_DOCUMENT).encode()
    old, new = (policyfile.read_policy("policy.yaml", data=data) for _ in range(2))
    runtime = app.Runtime(policy=old, secrets=RecordingPullSecrets())
    cache = runtime.admission_cache
    pod = spec_pod({"containers": [{"name": "a", "image": "nginx"}]})
    cached_plan(cache, pod, "ns", old.policy_for("ns"))
    assert (cache.policies, cache.shapes) == (1, 1)
    runtime.set_policy(new)
    assert (cache.policies, len(cache)) == (0, 0)
    cached_plan(cache, pod, "ns", old.policy_for("ns"))  # a review still in flight
    assert len(cache) == 0
    cached_plan(cache, pod, "ns", new.policy_for("ns"))
    assert (cache.policies, cache.shapes) == (1, 1)
