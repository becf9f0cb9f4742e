"""The offline commands read ClusterMirrorPolicy and MirrorPolicy documents, several at
once, both kinds together, as they read a policy file."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirrorgate.webhook import cli

HARBOR = "harbor.example"
CLUSTER = {
    "apiVersion": "mirrorgate.io/v1alpha1",
    "kind": "ClusterMirrorPolicy",
    "metadata": {"name": "base"},
    "spec": {
        "credentials": {
            "shared": {"namespaces": ["team-a", "team-b"]},
            "robot-a": {"namespaces": [], "namespaceSelector": {"matchLabels": {"team": "a"}}},
        },
        "mirrors": [
            {"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "shared"},
            {"source": "quay.io", "mirror": f"{HARBOR}/quay", "fixed": True},
        ],
    },
}
TEAM: dict[str, Any] = {
    "apiVersion": "mirrorgate.io/v1alpha1",
    "kind": "MirrorPolicy",
    "metadata": {"name": "ghcr", "namespace": "team-a"},
    "spec": {
        "mirrors": [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr", "credential": "robot-a"}]
    },
}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def write(tmp_path: Path, *documents: Any, name: str = "objects.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def explained(path: str, namespace: str, *labels: str) -> dict[str, Any]:
    flags = [f"--namespace-label={label}" for label in labels]
    status, out, _ = run("explain", "--policy", path, "-n", namespace, *flags, "ghcr.io/org/app:1")
    assert status == 0, out
    return dict(json.loads(out))


def test_explain_plans_each_namespace_with_its_own_rules(tmp_path: Path) -> None:
    path = write(tmp_path, CLUSTER, TEAM)
    mine = explained(path, "team-a", "team=a")
    assert mine["result"] == f"{HARBOR}/ghcr/org/app:1"
    assert mine["rule"]["object"] == "MirrorPolicy team-a/ghcr"
    assert mine["match"]["field"] == "MirrorPolicy team-a/ghcr spec.mirrors[0].source"
    assert mine["credential"] == "robot-a"
    theirs = explained(path, "team-b")
    assert theirs["rule"] == {
        "index": 0,
        "source": "ghcr.io",
        "mirror": f"{HARBOR}/ghcr",
        "scheme": "https",
        "credentials": ["shared"],
        "object": "ClusterMirrorPolicy base",
    }
    assert theirs["credential"] == "shared"


def test_a_mirror_policy_whose_grant_is_not_met_is_an_invalid_policy(tmp_path: Path) -> None:
    """Without the label that grants robot-a, the MirrorPolicy is refused: said, not run."""
    path = write(tmp_path, CLUSTER, TEAM)
    status, out, err = run("explain", "--policy", path, "-n", "team-a", "ghcr.io/x:1")
    assert (status, out) == (2, "")
    assert err.splitlines()[:2] == [
        f"mirrorgate: error: {path}: invalid policy (1 error):",
        "  MirrorPolicy team-a/ghcr: spec.mirrors[0].credential: credential 'robot-a' of "
        "MirrorPolicy team-a/ghcr spec.mirrors[0] is not granted to namespace 'team-a'",
    ]


def test_rewrite_plans_each_pod_in_its_namespace(tmp_path: Path) -> None:
    named = {**TEAM, "spec": {"mirrors": [{"source": "ghcr.io", "mirror": f"{HARBOR}/ghcr-a"}]}}
    policy_path = write(tmp_path, CLUSTER, named, name="policy.yaml")
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "ghcr.io/org/app:1"}]},
        }
        for namespace in ("team-a", "team-b")
    ]
    status, out, _ = run("rewrite", "--policy", policy_path, "-f", write(tmp_path, *pods))
    assert status == 0
    images = [d["spec"]["containers"][0]["image"] for d in yaml.safe_load_all(out)]
    assert images == [f"{HARBOR}/ghcr-a/org/app:1", f"{HARBOR}/ghcr/org/app:1"]


def test_policy_check_counts_the_objects_and_lists_each_refusal(tmp_path: Path) -> None:
    named = {**TEAM, "spec": {"mirrors": [{"source": "docker.io", "mirror": f"{HARBOR}/hub"}]}}
    status, out, _ = run("policy", "check", write(tmp_path, CLUSTER, named))
    assert status == 0
    assert ", 2 objects, 3 mirror rules, 2 credential grants; delivery pullSecret: " in out
    fixed = {**TEAM, "spec": {"mirrors": [{"source": "quay.io/org", "mirror": f"{HARBOR}/q"}]}}
    late = {**CLUSTER, "metadata": {"name": "late"}}
    path = write(tmp_path, CLUSTER, fixed, late)
    status, out, _ = run("policy", "check", path)
    assert status == 1
    assert out.splitlines()[0] == f"{path}: invalid policy (5 errors):"
    assert (
        "  ClusterMirrorPolicy late: spec.credentials.shared: is already defined by "
        "ClusterMirrorPolicy base"
    ) in out.splitlines()
    assert out.splitlines()[-1] == (
        '  MirrorPolicy team-a/ghcr: spec.mirrors[0].source: "quay.io/org" would take images '
        'from ClusterMirrorPolicy base spec.mirrors[1] ("quay.io"), which the cluster policy '
        "marks fixed: a MirrorPolicy may not override it"
    )


def test_policy_check_cannot_judge_a_grant_by_label_and_says_so(tmp_path: Path) -> None:
    """Offline, a namespace's labels are not known: the MirrorPolicy is not refused, and
    not in force; the warning says how to judge it."""
    status, out, _ = run("policy", "check", write(tmp_path, CLUSTER, TEAM))
    assert status == 0
    assert out.splitlines()[1] == (
        "  warning: MirrorPolicy team-a/ghcr: not judged: spec.mirrors[0].credential: "
        "credential 'robot-a' of MirrorPolicy team-a/ghcr spec.mirrors[0] is not granted to "
        "namespace 'team-a' (its labels, which credentials.robot-a.namespaceSelector reads, "
        "are not known yet); explain -n NAMESPACE --namespace-label judges it with them"
    )


def test_export_leaves_a_namespaces_rules_out_and_says_so(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        CLUSTER,
        {**TEAM, "spec": {"mirrors": [{"source": "docker.io", "mirror": f"{HARBOR}/hub"}]}},
    )
    status, out, err = run("export", "cri-o", "--policy", path)
    assert status == 0
    assert 'prefix = "ghcr.io"' in out
    assert 'prefix = "docker.io"' not in out
    assert (
        "warning: MirrorPolicy team-a/ghcr spec.mirrors[0]: not exported: a namespace's rule "
        "cannot be node configuration (admission applies it)"
    ) in err.splitlines()


@pytest.mark.parametrize(
    ("documents", "message"),
    [
        (
            [CLUSTER, {"mirrors": []}],
            "document 2: not a ClusterMirrorPolicy or MirrorPolicy: a file holds one policy "
            "document, or only objects",
        ),
        ([CLUSTER, CLUSTER], "document 2: ClusterMirrorPolicy base is already document 1"),
        (
            [
                {
                    **TEAM,
                    "metadata": {"name": "x"},
                    "spec": {"mirrors": [{**TEAM["spec"]["mirrors"][0], "credential": "nope"}]},
                },
                CLUSTER,
            ],
            'MirrorPolicy default/x: spec.mirrors[0].credential: "nope" is not a credential '
            "of the cluster policy: a MirrorPolicy names credentials a ClusterMirrorPolicy "
            "grants to its namespace",
        ),
    ],
)
def test_a_file_of_objects_says_what_is_wrong_with_each(
    tmp_path: Path, documents: list[Any], message: str
) -> None:
    status, out, _ = run("policy", "check", write(tmp_path, *documents))
    assert status == 1
    assert f"  {message}" in out.splitlines()
