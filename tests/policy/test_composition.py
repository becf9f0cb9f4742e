"""ClusterMirrorPolicy and MirrorPolicy objects composed into each namespace's policy."""

from __future__ import annotations

from typing import Any

import pytest

from mirrorgate import policy

HARBOR = "harbor.example"


def cluster(name: str, spec: dict[str, Any], created: str = "2026-01-01T00:00:00Z") -> Any:
    return policy.parse_object(
        {
            "apiVersion": "mirrorgate.io/v1alpha1",
            "kind": "ClusterMirrorPolicy",
            "metadata": {"name": name, "creationTimestamp": created, "generation": 3},
            "spec": spec,
        }
    )


def team(namespace: str, name: str, mirrors: list[dict[str, Any]], created: str = "") -> Any:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "generation": 1}
    if created:
        metadata["creationTimestamp"] = created
    return policy.parse_object(
        {
            "apiVersion": "mirrorgate.io/v1alpha1",
            "kind": "MirrorPolicy",
            "metadata": metadata,
            "spec": {"mirrors": mirrors},
        }
    )


BASE = cluster(
    "base",
    {
        "credentials": {
            "shared": {"namespaces": ["team-a", "team-b"]},
            "robot-a": {"namespaces": ["team-a"]},
            "robot-b": {"namespaces": [], "namespaceSelector": {"matchLabels": {"team": "b"}}},
        },
        "mirrors": [
            {"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "shared"},
            {"source": "quay.io", "mirror": f"{HARBOR}/quay", "fixed": True},
            {"source": "*.gcr.io", "mirror": f"{HARBOR}/gcr", "fixed": True},
        ],
    },
)
LABELS = {"team-a": {"team": "a"}, "team-b": {"team": "b"}}


def pod(image: str) -> dict[str, Any]:
    return {"metadata": {}, "spec": {"containers": [{"name": "c", "image": image}]}}


def planned(composition: policy.Composition, namespace: str, image: str) -> tuple[str, ...]:
    plan = policy.plan(
        pod(image),
        namespace=namespace,
        mirror_policy=composition.policy_for(namespace),
        namespace_labels=LABELS.get(namespace),
    )
    return (*(r.new_image for r in plan.rewrites), *plan.pull_secrets)


def verdict(composition: policy.Composition, obj: Any) -> tuple[bool, str, str]:
    found = composition.verdicts[obj.key]
    return found.accepted, found.reason, found.message


def test_each_team_pulls_through_its_own_robot_for_one_source() -> None:
    """Two teams share one Harbor proxy project, each with its robot; a third namespace
    keeps the cluster's rule and its shared login."""
    a = team(
        "team-a",
        "ghcr",
        [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "robot-a"}],
    )
    b = team(
        "team-b",
        "ghcr",
        [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "robot-b"}],
    )
    composition = policy.compose([BASE, a, b], LABELS)
    assert [v.reason for v in composition.verdicts.values()] == ["Accepted"] * 3
    image = "ghcr.io/org/app:1"
    assert planned(composition, "team-a", image) == (
        f"{HARBOR}/ghcr/org/app:1",
        "mirrorgate-robot-a",
    )
    assert planned(composition, "team-b", image) == (
        f"{HARBOR}/ghcr/org/app:1",
        "mirrorgate-robot-b",
    )
    assert planned(composition, "other", image) == ()  # shared is not granted there
    assert composition.policy_for("other") is composition.cluster
    rule = composition.policy_for("team-a").resolve(image).rule
    assert rule is not None
    assert rule.label == "MirrorPolicy team-a/ghcr spec.mirrors[0]"


def test_a_team_rule_applies_only_in_its_namespace() -> None:
    a = team("team-a", "docker", [{"source": "docker.io", "mirror": f"{HARBOR}/hub-a"}])
    composition = policy.compose([BASE, a], LABELS)
    assert planned(composition, "team-a", "nginx:1") == (f"{HARBOR}/hub-a/library/nginx:1",)
    assert planned(composition, "team-b", "nginx:1") == ()


def test_the_most_specific_source_wins_whichever_object_holds_it() -> None:
    """A team's broader rule does not take images from the cluster's narrower one."""
    base = cluster(
        "base", {"mirrors": [{"source": "docker.io/library", "mirror": f"{HARBOR}/lib"}]}
    )
    a = team("team-a", "hub", [{"source": "docker.io", "mirror": f"{HARBOR}/hub-a"}])
    composition = policy.compose([base, a], LABELS)
    assert planned(composition, "team-a", "nginx:1") == (f"{HARBOR}/lib/nginx:1",)
    assert planned(composition, "team-a", "bitnami/redis:7") == (f"{HARBOR}/hub-a/bitnami/redis:7",)


def test_a_credential_not_granted_to_the_namespace_is_refused() -> None:
    b = team(
        "team-b",
        "ghcr",
        [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "robot-a"}],
    )
    composition = policy.compose([BASE, b], LABELS)
    assert verdict(composition, b) == (
        False,
        "NotGranted",
        "spec.mirrors[0].credential: credential 'robot-a' of MirrorPolicy team-b/ghcr "
        "spec.mirrors[0] is not granted to namespace 'team-b'",
    )
    # Its rules apply nowhere: team-b keeps the cluster's rule.
    assert planned(composition, "team-b", "ghcr.io/x:1") == (
        f"{HARBOR}/ghcr/x:1",
        "mirrorgate-shared",
    )


def test_a_grant_by_label_follows_the_namespace_labels() -> None:
    """Granted while the label is there; refused once it is gone, or not known."""
    b = team(
        "team-b",
        "ghcr",
        [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "robot-b"}],
    )
    assert policy.compose([BASE, b], LABELS).verdicts[b.key].accepted
    unlabelled: list[dict[str, dict[str, str]]] = [{"team-b": {}}, {}]
    for labels in unlabelled:
        composition = policy.compose([BASE, b], labels)
        assert verdict(composition, b)[:2] == (False, "NotGranted")
        assert "team-b" not in composition.namespaced


def test_an_unknown_credential_is_named_as_the_cluster_policys() -> None:
    a = team(
        "team-a", "x", [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "nope"}]
    )
    assert verdict(policy.compose([BASE, a], LABELS), a) == (
        False,
        "Invalid",
        'spec.mirrors[0].credential: "nope" is not a credential of the cluster policy: a '
        "MirrorPolicy names credentials a ClusterMirrorPolicy grants to its namespace",
    )


@pytest.mark.parametrize(
    ("source", "fixed"),
    [
        ("quay.io", '"quay.io"'),
        ("quay.io/org/app", '"quay.io"'),
        ("eu.gcr.io", '"*.gcr.io"'),
        ("*.eu.gcr.io", '"*.gcr.io"'),
        ("*.gcr.io", '"*.gcr.io"'),
    ],
)
def test_a_team_cannot_take_images_from_a_fixed_rule(source: str, fixed: str) -> None:
    a = team("team-a", "fix", [{"source": source, "mirror": f"{HARBOR}/mine"}])
    accepted, reason, message = verdict(policy.compose([BASE, a], LABELS), a)
    assert (accepted, reason) == (False, "FixedRule")
    assert message.startswith(f'spec.mirrors[0].source: "{source}" would take images from ')
    assert (
        f"({fixed}), which the cluster policy marks fixed: a MirrorPolicy may not override it"
        in message
    )


@pytest.mark.parametrize("source", ["gcr.io", "quay.example", "docker.io"])
def test_a_source_beside_a_fixed_rule_is_the_teams(source: str) -> None:
    a = team("team-a", "fix", [{"source": source, "mirror": f"{HARBOR}/mine"}])
    assert policy.compose([BASE, a], LABELS).verdicts[a.key].accepted


def test_a_team_cannot_mark_a_rule_fixed() -> None:
    a = team("team-a", "x", [{"source": "docker.io", "mirror": f"{HARBOR}/x", "fixed": False}])
    assert verdict(policy.compose([BASE, a], LABELS), a) == (
        False,
        "Invalid",
        "spec.mirrors[0].fixed: only a ClusterMirrorPolicy's rule can be fixed; a "
        "MirrorPolicy's rules are its own namespace's",
    )


def test_a_team_mirror_may_not_collide_with_a_cluster_mirror() -> None:
    a = team("team-a", "x", [{"source": "docker.io", "mirror": f"{HARBOR}/quay"}])
    b = team("team-b", "x", [{"source": "docker.io", "mirror": f"{HARBOR}/quay/nested"}])
    composition = policy.compose([BASE, a, b], LABELS)
    assert verdict(composition, a) == (
        False,
        "Conflict",
        'MirrorPolicy team-a/x spec.mirrors[0].mirror: "harbor.example/quay" is already the '
        "mirror of ClusterMirrorPolicy base spec.mirrors[1]; give each source its own mirror path",
    )
    assert verdict(composition, b)[:2] == (False, "Conflict")
    assert "lies under" in verdict(composition, b)[2]


def two_team_objects() -> tuple[Any, Any]:
    """Two MirrorPolicies of team-a for one source, the first the older."""
    return tuple(
        team("team-a", name, [{"source": "docker.io", "mirror": f"{HARBOR}/{name}"}], created)
        for name, created in (("first", "2026-01-02T00:00:00Z"), ("second", "2026-01-03T00:00:00Z"))
    )


def test_two_team_objects_for_one_source_the_newer_is_refused() -> None:
    first, second = two_team_objects()
    composition = policy.compose([second, BASE, first], LABELS)
    assert composition.verdicts[first.key].accepted
    assert verdict(composition, second) == (
        False,
        "Conflict",
        'spec.mirrors[0].source: "docker.io" is already the source of MirrorPolicy '
        "team-a/first spec.mirrors[0]",
    )


def test_cluster_objects_merge_and_the_newer_of_two_on_one_source_is_refused() -> None:
    extra = cluster(
        "extra",
        {
            "exclude": {"images": ["registry.k8s.io/pause:*"]},
            "mirrors": [{"source": "docker.io", "mirror": f"{HARBOR}/hub", "credential": "shared"}],
        },
        "2026-01-02T00:00:00Z",
    )
    late = cluster(
        "late",
        {"mirrors": [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr2"}]},
        "2026-01-03T00:00:00Z",
    )
    composition = policy.compose([late, extra, BASE], LABELS)
    assert composition.verdicts[extra.key].accepted  # names base's credential
    assert verdict(composition, late) == (
        False,
        "Conflict",
        'spec.mirrors[0].source: "ghcr.io" is already the source of ClusterMirrorPolicy '
        "base spec.mirrors[0]",
    )
    merged = composition.cluster
    assert [r.label for r in merged.rules] == [
        "ClusterMirrorPolicy base spec.mirrors[0]",
        "ClusterMirrorPolicy base spec.mirrors[1]",
        "ClusterMirrorPolicy base spec.mirrors[2]",
        "ClusterMirrorPolicy extra spec.mirrors[0]",
    ]
    assert merged.exclude_images == ("registry.k8s.io/pause:*",)
    assert planned(composition, "team-a", "nginx:1") == (
        f"{HARBOR}/hub/library/nginx:1",
        "mirrorgate-shared",
    )


def test_cluster_wide_settings_and_credentials_are_set_once() -> None:
    first = cluster(
        "first", {"onCredentialError": "deny", "credentials": {"c": {"namespaces": ["x"]}}}
    )
    second = cluster(
        "second",
        {
            "health": {"interval": "5s"},
            "onCredentialError": "skip",
            "credentials": {"c": {"namespaces": ["y"]}},
        },
        "2026-01-02T00:00:00Z",
    )
    composition = policy.compose([first, second])
    assert verdict(composition, second) == (
        False,
        "Conflict",
        "spec.onCredentialError: is already set by ClusterMirrorPolicy first: one "
        "ClusterMirrorPolicy sets it for the cluster\n"
        "spec.credentials.c: is already defined by ClusterMirrorPolicy first",
    )
    assert composition.cluster.on_credential_error == "deny"
    alone = cluster("second", {"health": {"interval": "5s"}}, "2026-01-02T00:00:00Z")
    assert policy.compose([first, alone]).cluster.health.interval == 5


def test_a_rule_naming_a_refused_objects_credential_is_refused_too() -> None:
    creds = cluster(
        "creds",
        {"credentials": {"c": {"namespaces": ["x"]}}, "onCredentialError": "deny"},
        "2026-01-03T00:00:00Z",
    )
    rules = cluster(
        "rules",
        {"mirrors": [{"source": "ghcr.io", "mirror": f"{HARBOR}/g", "credential": "c"}]},
        "2026-01-04T00:00:00Z",
    )
    setter = cluster("setter", {"onCredentialError": "skip"}, "2026-01-02T00:00:00Z")
    composition = policy.compose([creds, rules, setter])
    assert verdict(composition, creds)[:2] == (False, "Conflict")
    assert verdict(composition, rules) == (
        False,
        "Invalid",
        'spec.mirrors[0].credential: "c" is defined by a ClusterMirrorPolicy that is not accepted',
    )
    assert composition.cluster.rules == ()


def test_an_invalid_spec_is_refused_with_every_error_under_spec() -> None:
    bad = cluster(
        "bad", {"mirrors": [{"source": "Docker.io", "mirror": "m.example/x"}], "mode": "enforce"}
    )
    accepted, reason, message = verdict(policy.compose([bad]), bad)
    assert (accepted, reason) == (False, "Invalid")
    assert message.splitlines()[0].startswith("spec.mode: the policy no longer sets the mode")
    assert message.splitlines()[1].startswith(
        'spec.mirrors[0].source: "Docker.io" is not a valid registry host'
    )


def test_judging_an_object_at_apply_time_refuses_it_not_a_stored_one() -> None:
    """The applied object is judged as the newest; a stored object that is itself refused
    blocks nothing, and an update is judged without its stored version."""
    other = cluster(
        "other",
        {"mirrors": [{"source": "ghcr.io", "mirror": f"{HARBOR}/g2"}]},
        "2026-01-05T00:00:00Z",
    )
    assert policy.judge(BASE, [other]).reason == "Conflict"  # created after other
    assert policy.judge(BASE, [BASE, other]).accepted  # an update: other stands refused
    changed = team(
        "team-a", "t", [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "robot-b"}]
    )
    assert policy.judge(changed, [BASE], LABELS).reason == "NotGranted"
    assert policy.judge(changed, [BASE], {"team-a": {"team": "b"}}).accepted


def test_a_policy_file_is_a_composition_of_one() -> None:
    loaded = policy.load({"mirrors": [{"source": "docker.io", "mirror": "m.example/hub"}]})
    composition = policy.from_policy(loaded)
    assert composition.policy_for("any") is loaded
    assert composition.verdicts == {}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {
                "kind": "MirrorPolicy",
                "apiVersion": "mirrorgate.io/v1alpha1",
                "metadata": {"name": "x"},
                "spec": {},
            },
            "metadata.namespace: is required: a MirrorPolicy is namespaced",
        ),
        (
            {
                "kind": "ClusterMirrorPolicy",
                "apiVersion": "mirrorgate.io/v1",
                "metadata": {"name": "x"},
                "spec": {},
            },
            'apiVersion: "mirrorgate.io/v1" is not mirrorgate.io/v1alpha1 '
            "(the version this mirrorgate reads)",
        ),
        (
            {
                "kind": "Policy",
                "apiVersion": "mirrorgate.io/v1alpha1",
                "metadata": {"name": "x"},
                "spec": {},
            },
            'kind: "Policy" is not one of: ClusterMirrorPolicy, MirrorPolicy',
        ),
        (
            {
                "kind": "ClusterMirrorPolicy",
                "apiVersion": "mirrorgate.io/v1alpha1",
                "metadata": {"name": "X_"},
                "spec": {},
            },
            'metadata.name: "X_" is not an object name (a DNS subdomain)',
        ),
        (
            {
                "kind": "MirrorPolicy",
                "apiVersion": "mirrorgate.io/v1alpha1",
                "metadata": {"name": "x", "namespace": "a"},
                "spec": {"mirrors": [], "credentials": {}},
            },
            "spec.credentials: unknown field (expected one of: mirrors)",
        ),
        (
            {
                "kind": "ClusterMirrorPolicy",
                "apiVersion": "mirrorgate.io/v1alpha1",
                "metadata": {"name": "x"},
            },
            "spec: is required",
        ),
    ],
)
def test_a_bad_envelope_names_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(policy.PolicyError) as caught:
        policy.parse_object(document)
    assert str(caught.value) == message


def test_every_namespace_reaches_a_mirror_host_alike() -> None:
    """Mirrors are probed and exported per host: a team may not reach one over plain
    HTTP that the cluster or another team reaches over HTTPS."""
    a = team("team-a", "x", [{"source": "docker.io", "mirror": f"https://{HARBOR}/hub-a"}])
    b = team("team-b", "x", [{"source": "docker.io", "mirror": f"http://{HARBOR}/hub-b"}])
    composition = policy.compose([BASE, a, b], LABELS)
    assert composition.verdicts[a.key].accepted
    accepted, reason, message = verdict(composition, b)
    assert (accepted, reason) == (False, "Conflict")
    assert message == (
        'MirrorPolicy team-b/x spec.mirrors[0].mirror: "http://" differs from '
        'ClusterMirrorPolicy base spec.mirrors[0].mirror ("https://") on the same mirror '
        'host "harbor.example"'
    )


def test_a_credential_named_from_another_object_is_warned_of_once() -> None:
    """An object's warnings are about its own credentials, not those it names elsewhere."""
    globbed = cluster("globbed", {"credentials": {"wide": {"namespaces": ["team-*"]}}})
    user = cluster(
        "user",
        {"mirrors": [{"source": "ghcr.io", "mirror": f"{HARBOR}/g", "credential": "wide"}]},
        "2026-01-02T00:00:00Z",
    )
    composition = policy.compose([globbed, user])
    assert composition.verdicts[user.key].warnings == ()
    assert [w.path for w in composition.cluster.warnings] == [
        "ClusterMirrorPolicy globbed: spec.credentials.wide.namespaces"
    ]


def test_judging_a_mirror_policy_at_apply_time() -> None:
    """Against its namespace's objects that stand: a new one conflicting with a stored
    one is refused; the stored one's update is not blocked by one that stands refused."""
    first, second = two_team_objects()
    elsewhere = team("team-b", "other", [{"source": "docker.io", "mirror": f"{HARBOR}/b"}])
    assert policy.judge(second, [BASE, first, elsewhere], LABELS).reason == "Conflict"
    changed = team(
        "team-a",
        "first",
        [{"source": "docker.io", "mirror": f"{HARBOR}/a3"}],
        "2026-01-02T00:00:00Z",
    )
    assert policy.judge(changed, [BASE, first, second], LABELS).accepted
