"""The planning view of a Pod: planning, its shape and its patch are the same as for the Pod.

A large review is decoded once, in the worker process, which hands the loop
only this view of its Pod (webhook/edge/offload.py); a field that planning
reads and the view dropped would change an admission.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.webhook import patch
from tests.policy import strategies

Scenario = tuple[dict[str, Any], str, policy.Policy]


def assert_plans_alike(pod: Any, namespace: str, rules: policy.Policy) -> None:
    view = policy.planning_view(copy.deepcopy(pod))
    assert policy.shape_key(view, namespace, policy.HEALTHY) == policy.shape_key(
        pod, namespace, policy.HEALTHY
    )
    planned = policy.plan(pod, namespace=namespace, mirror_policy=rules)
    assert policy.plan(view, namespace=namespace, mirror_policy=rules) == planned
    if planned.rewrites or planned.pull_secrets or planned.original_images is not None:
        assert patch.build_patch(view, planned) == patch.build_patch(pod, planned)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenario=strategies.scenarios(),
    extra=st.dictionaries(st.sampled_from(["env", "volumes", "x"]), st.text(), max_size=2),
)
def test_the_view_plans_as_the_pod_does(scenario: Scenario, extra: dict[str, Any]) -> None:
    pod, namespace, rules = scenario
    pod = copy.deepcopy(pod)
    if isinstance(pod.get("spec"), dict):
        pod["spec"].update(extra)
        for container in pod["spec"].get("containers") or []:
            if isinstance(container, dict):
                container.update(extra)
    assert_plans_alike(pod, namespace, rules)


RULES = policy.load({"mirrors": [{"source": "docker.io", "mirror": "m.example/hub"}]})


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param({"metadata": {"labels": ["not", "a", "map"]}, "spec": {}}, id="labels-list"),
        pytest.param(
            {
                "metadata": {"annotations": None},
                "spec": {"containers": [{"name": "c", "image": "a"}]},
            },
            id="annotations-null",
        ),
        pytest.param(
            {"metadata": {"annotations": {"other": "x"}}, "spec": {"containers": ["nginx"]}},
            id="container-not-a-map",
        ),
        pytest.param({"metadata": "m", "spec": []}, id="metadata-and-spec-wrong"),
        pytest.param(
            {
                "metadata": {"labels": {"mirrorgate.io/skip": "true", "app": "x"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]},
            },
            id="skipped",
        ),
        pytest.param(
            {
                "metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}},
                "spec": {"containers": [{"name": "c", "image": "nginx", "env": [1]}]},
            },
            id="static",
        ),
        pytest.param(
            {
                "metadata": {
                    "annotations": {"mirrorgate.io/original-images": '{"containers/c":"nginx"}'}
                },
                "spec": {
                    "containers": [{"name": "c", "image": "busybox", "ports": [{"x": 1}]}],
                    "imagePullSecrets": "not-a-list",
                },
            },
            id="originals-and-bad-secrets",
        ),
        pytest.param({"spec": {"initContainers": [{"name": 5, "image": "a"}]}}, id="no-metadata"),
    ],
)
def test_the_view_keeps_what_odd_pods_are_judged_by(pod: dict[str, Any]) -> None:
    assert_plans_alike(pod, "ns", RULES)
