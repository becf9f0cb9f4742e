"""Which rule and which credential an image gets in a namespace: per-team credentials,
onNotGranted, pull policy Never, and the catch-all source."""

from __future__ import annotations

from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.webhook import patch

HARBOR = "harbor.corp.example"
CACHE = "cache.corp.example/all"
TEAMS = policy.load(
    {
        "mirrors": [
            {
                "source": "ghcr.io/team-a",
                "mirror": f"{HARBOR}/team-a",
                "credential": "robot-a",
                "onNotGranted": "next",
            },
            {
                "source": "ghcr.io",
                "mirror": f"{HARBOR}/ghcr",
                "credential": ["robot-a", "robot-b"],
                "onNotGranted": "next",
            },
            {"source": "*", "mirror": CACHE},
            {
                "source": "quay.io/locked",
                "mirror": f"{HARBOR}/locked",
                "credential": "robot-a",
                "onNotGranted": "deny",
            },
            {"source": "quay.io/kept", "mirror": f"{HARBOR}/kept", "credential": "robot-a"},
        ],
        "credentials": {
            "robot-a": {"namespaces": ["team-a"]},
            "robot-b": {"namespaces": ["team-b"]},
        },
        "exclude": {"images": ["docker.io/library/busybox"]},
    }
)


def _pod(*containers: dict[str, Any], volumes: list[Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": f"c{i}", **c} for i, c in enumerate(containers)]
    }
    if volumes is not None:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def _plan(
    namespace: str, *images: str, mirror_policy: policy.Policy = TEAMS, **extra: Any
) -> policy.RewritePlan:
    return policy.plan(
        _pod(*({"image": i} for i in images)),
        namespace=namespace,
        mirror_policy=mirror_policy,
        **extra,
    )


def _decide(namespace: str, image: str, **extra: Any) -> policy.ImageDecision:
    return policy.decide_image(
        TEAMS.resolve(image), namespace=namespace, mirror_policy=TEAMS, **extra
    )


# --- per-team credentials ----------------------------------------------------------------


def test_each_team_pulls_one_source_with_its_own_robot() -> None:
    for namespace, secret in (("team-a", "mirrorgate-robot-a"), ("team-b", "mirrorgate-robot-b")):
        plan = _plan(namespace, "ghcr.io/org/app:1")
        assert [r.new_image for r in plan.rewrites] == [f"{HARBOR}/ghcr/org/app:1"]
        assert plan.pull_secrets == (secret,)
        assert plan.credentials == (secret.removeprefix("mirrorgate-"),)


def test_a_credential_granted_by_label_to_a_second_team_is_no_choice() -> None:
    """A namespace granted two of a rule's credentials (possible only by label) keeps its
    images as written, says which two, and counts them: mirrorgate never guesses."""
    loaded = policy.load(
        {
            "mirrors": [
                {"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": ["ra", "rb"]}
            ],
            "credentials": {
                "ra": {"namespaces": ["team-a"]},
                "rb": {"namespaceSelector": {"matchLabels": {"team": "b"}}},
            },
        }
    )
    plan = _plan(
        "team-a", "ghcr.io/org/app:1", mirror_policy=loaded, namespace_labels={"team": "b"}
    )
    assert plan.rewrites == ()
    assert plan.pull_secrets == ()
    assert plan.outcomes == {"containers/c0": "not-granted"}
    assert plan.unmirrored == {"containers/c0": "credential-ambiguous"}
    (warning,) = plan.warnings
    assert "credentials 'ra' and 'rb' of mirrors[0] are both granted" in warning
    assert "credentials.rb.namespaceSelector" in warning
    # Without the label, only the name grants: one credential, rewritten.
    alone = _plan("team-a", "ghcr.io/org/app:1", mirror_policy=loaded, namespace_labels={})
    assert alone.pull_secrets == ("mirrorgate-ra",)


# --- onNotGranted ----------------------------------------------------------------------------


def test_next_falls_through_to_the_broader_rule_with_its_credential() -> None:
    """team-b has no robot for ghcr.io/team-a: the ghcr.io rule takes the image, with
    team-b's robot, and the decision names the rule passed over and why."""
    plan = _plan("team-b", "ghcr.io/team-a/app:1")
    assert [(r.new_image, r.rule_label) for r in plan.rewrites] == [
        (f"{HARBOR}/ghcr/team-a/app:1", "mirrors[1]")
    ]
    assert plan.pull_secrets == ("mirrorgate-robot-b",)
    decision = _decide("team-b", "ghcr.io/team-a/app:1")
    ((passed, why),) = decision.passed
    assert passed.label == "mirrors[0]"
    assert why == "credential 'robot-a' of mirrors[0] is not granted to namespace 'team-b'"
    # The team the narrow rule is for still gets it.
    own = _plan("team-a", "ghcr.io/team-a/app:1")
    assert [r.new_image for r in own.rewrites] == [f"{HARBOR}/team-a/app:1"]
    assert own.pull_secrets == ("mirrorgate-robot-a",)


def test_next_walks_down_to_the_catch_all() -> None:
    plan = _plan("team-c", "ghcr.io/team-a/app:1")
    assert [(r.new_image, r.rule_label) for r in plan.rewrites] == [
        (f"{CACHE}/ghcr.io/team-a/app:1", "mirrors[2]")
    ]
    assert plan.pull_secrets == ()
    assert [r.label for r, _ in _decide("team-c", "ghcr.io/team-a/app:1").passed] == [
        "mirrors[0]",
        "mirrors[1]",
    ]


def test_next_with_nothing_broader_leaves_the_image_and_says_so() -> None:
    loaded = policy.load(
        {
            "mirrors": [
                {
                    "source": "ghcr.io",
                    "mirror": f"{HARBOR}/ghcr",
                    "credential": "r",
                    "onNotGranted": "next",
                }
            ],
            "credentials": {"r": {"namespaces": ["team-a"]}},
        }
    )
    plan = _plan("team-b", "ghcr.io/org/app:1", mirror_policy=loaded)
    assert plan.rewrites == ()
    assert plan.unmirrored == {"containers/c0": "not-granted"}
    (warning,) = plan.warnings
    assert warning.endswith("no broader rule covers the image (onNotGranted: next)")


def test_an_admitted_pod_that_fell_through_is_final() -> None:
    """Re-admission (reinvocation, a later update) changes nothing: the image is on the
    broader rule's mirror, and the record of its original is believed."""
    pod = _pod({"image": "ghcr.io/team-a/app:1"})
    first = policy.plan(pod, namespace="team-b", mirror_policy=TEAMS)
    admitted = jsonpatch.apply_patch(pod, patch.build_patch(pod, first))
    again = policy.plan(admitted, namespace="team-b", mirror_policy=TEAMS)
    assert again.rewrites == ()
    assert again.warnings == ()
    assert again.original_images is None
    assert again.credentials == ("robot-b",)


def test_deny_names_the_rule_and_the_credential() -> None:
    plan = _plan("team-b", "quay.io/locked/app:1", "quay.io/kept/app:1")
    assert plan.rewrites == ()
    (denial,) = plan.denials
    assert denial == (
        "containers/c0: image 'quay.io/locked/app:1': credential 'robot-a' of mirrors[3] "
        "is not granted to namespace 'team-b', and mirrors[3] says onNotGranted: deny"
    )
    # skip (the default) only leaves the image as written.
    assert plan.unmirrored == {"containers/c0": "not-granted", "containers/c1": "not-granted"}
    assert _plan("team-a", "quay.io/locked/app:1").denials == ()


# --- imagePullPolicy: Never ------------------------------------------------------------------


def test_pull_policy_never_is_left_as_written_and_counted() -> None:
    pod = _pod(
        {"image": "myapp:dev", "imagePullPolicy": "Never"},
        {"image": "myapp:dev", "imagePullPolicy": "IfNotPresent"},
        volumes=[{"name": "v", "image": {"reference": "tools:1", "pullPolicy": "Never"}}],
    )
    plan = policy.plan(pod, namespace="team-a", mirror_policy=TEAMS)
    assert [r.site.key for r in plan.rewrites] == ["containers/c1"]
    assert plan.outcomes["containers/c0"] == "pull-policy-never"
    assert plan.outcomes["volumes/v"] == "pull-policy-never"
    assert plan.unmirrored == {
        "containers/c0": "pull-policy-never",
        "volumes/v": "pull-policy-never",
    }
    assert plan.warnings == ()


def test_skip_pull_policy_never_false_rewrites_them() -> None:
    loaded = policy.load(
        {"skipPullPolicyNever": False, "mirrors": [{"source": "*", "mirror": CACHE}]}
    )
    pod = _pod({"image": "myapp:dev", "imagePullPolicy": "Never"})
    plan = policy.plan(pod, namespace="team-a", mirror_policy=loaded)
    assert [r.new_image for r in plan.rewrites] == [f"{CACHE}/docker.io/library/myapp:dev"]


def test_the_pull_policy_is_part_of_a_plan_shape() -> None:
    """Two Pods that differ only in the pull policy are planned apart (and the planning
    view keeps it), or one would be given the other's plan."""
    never = _pod({"image": "myapp:dev", "imagePullPolicy": "Never"})
    always = _pod({"image": "myapp:dev", "imagePullPolicy": "Always"})
    assert policy.shape_key(never, "team-a", policy.HEALTHY) != policy.shape_key(
        always, "team-a", policy.HEALTHY
    )
    view = policy.planning_view(never)
    assert policy.plan(view, namespace="team-a", mirror_policy=TEAMS).rewrites == ()


# --- the catch-all ---------------------------------------------------------------------------


def test_the_catch_all_keeps_the_registry_host_in_the_path() -> None:
    plan = _plan("team-a", "nginx:1.27", "registry.k8s.io/pause:3.9", "Quay.IO:443/org/app:1")
    assert [r.new_image for r in plan.rewrites] == [
        f"{CACHE}/docker.io/library/nginx:1.27",
        f"{CACHE}/registry.k8s.io/pause:3.9",
        f"{CACHE}/quay.io/org/app:1",
    ]


def test_exclusions_and_ports_are_outside_the_catch_all() -> None:
    plan = _plan("team-a", "busybox:1.36", "localhost:5000/app:1")
    assert plan.rewrites == ()
    assert plan.outcomes == {"containers/c0": "excluded", "containers/c1": "no-rule"}


def test_an_image_on_the_catch_all_mirror_is_final() -> None:
    assert _decide("team-a", f"{CACHE}/docker.io/library/nginx:1").outcome == "already-mirrored"


# --- precedence, as properties ---------------------------------------------------------------

_LABEL = st.text("abcxyz", min_size=1, max_size=3)
_HOSTS = st.lists(_LABEL, min_size=1, max_size=3).map(lambda labels: ".".join([*labels, "io"]))
_PATHS = st.lists(_LABEL, min_size=1, max_size=4).map("/".join)


@settings(max_examples=200, deadline=None)
@given(host=_HOSTS, path=_PATHS, data=st.data())
def test_the_most_specific_rule_always_wins(host: str, path: str, data: st.DataObject) -> None:
    """Of the sources that cover an image (each prefix of its path, its host, each wildcard
    suffix of its host, and ``*``), the longest path prefix wins, then the host, then the
    longest wildcard suffix, then ``*``; each of them only where it is in the policy."""
    parts = path.split("/")
    labels = host.split(".")
    candidates = [f"{host}/{'/'.join(parts[:n])}" for n in range(len(parts), 0, -1)]
    candidates += [host]
    candidates += ["*." + ".".join(labels[n:]) for n in range(1, len(labels) - 1)]
    candidates += ["*"]
    chosen = data.draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True))
    loaded = policy.load(
        {
            "mirrors": [
                {"source": source, "mirror": f"m{i}.example/r{i}"}
                for i, source in enumerate(chosen)
            ]
        }
    )
    found = loaded.resolve(f"{host}/{path}:1")
    expected = min(chosen, key=candidates.index)
    assert found.rule is not None
    assert str(found.rule.source) == expected
    assert found.outcome == "rewrite"


@settings(max_examples=100, deadline=None)
@given(host=_HOSTS, path=_PATHS)
def test_a_more_specific_rule_that_falls_through_reaches_the_catch_all(
    host: str, path: str
) -> None:
    """``next`` on every rule: an ungranted namespace goes down the whole chain, in order."""
    sources = [f"{host}/{path}", host, "*"]
    loaded = policy.load(
        {
            "mirrors": [
                {
                    "source": source,
                    "mirror": f"m.example/r{i}",
                    "credential": "r",
                    "onNotGranted": "next",
                }
                for i, source in enumerate(sources[:2])
            ]
            + [{"source": "*", "mirror": "m.example/all"}],
            "credentials": {"r": {"namespaces": ["team-a"]}},
        }
    )
    decision = policy.decide_image(
        loaded.resolve(f"{host}/{path}:1"), namespace="team-b", mirror_policy=loaded
    )
    assert [str(r.source) for r, _ in decision.passed] == sources[:2]
    assert decision.resolution.new_image == f"m.example/all/{host}/{path}:1"
