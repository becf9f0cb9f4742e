"""/mutate, explain, audit and export on per-team credentials, onNotGranted, pull policy
Never and the catch-all source."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirrorgate import policy
from mirrorgate.webhook import cli
from mirrorgate.webhook.commands import audit_report, export, export_crio
from tests.webhook.harness import Harness, make_harness
from tests.webhook.reviews import apply, patch_ops, pod, review
from tests.webhook.test_enforcement import unmirrored

HARBOR = "harbor.corp.example"
CACHE = "cache.corp.example/all"
POLICY = f"""\
mirrors:
  - source: ghcr.io/team-a
    mirror: {HARBOR}/team-a
    credential: robot-a
    onNotGranted: next
  - source: ghcr.io
    mirror: {HARBOR}/ghcr
    credential: [robot-a, robot-b, robot-c]
  - source: quay.io/locked
    mirror: {HARBOR}/locked
    credential: robot-a
    onNotGranted: deny
  - source: "*"
    mirror: {CACHE}
credentials:
  robot-a: {{namespaces: [team-a]}}
  robot-b: {{namespaces: [team-b]}}
  robot-c: {{namespaceSelector: {{matchLabels: {{team: c}}}}}}
"""
TEAM_A_IMAGE = "ghcr.io/team-a/app:1"


@pytest.fixture
def teams(tmp_path: Path) -> Harness:
    return make_harness(tmp_path, POLICY)


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    path = tmp_path / "teams.yaml"
    path.write_text(POLICY)
    return path


def _with_pull_policy(obj: dict[str, Any], value: str) -> dict[str, Any]:
    for container in obj["spec"]["containers"]:
        container["imagePullPolicy"] = value
    return obj


# --- /mutate ---------------------------------------------------------------------------------


def test_each_team_gets_its_own_robot_for_one_source(teams: Harness) -> None:
    for namespace, secret in (("team-a", "mirrorgate-robot-a"), ("team-b", "mirrorgate-robot-b")):
        admitted = apply(
            pod("ghcr.io/org/app:1"),
            patch_ops(teams.mutate(review(pod("ghcr.io/org/app:1"), namespace=namespace))),
        )
        assert admitted["spec"]["containers"][0]["image"] == f"{HARBOR}/ghcr/org/app:1"
        assert admitted["spec"]["imagePullSecrets"] == [{"name": secret}]
    assert teams.secrets.ensure_calls == [
        ("team-a", ("robot-a",)),
        ("team-b", ("robot-b",)),
    ]


def test_next_falls_through_to_the_broader_rule(teams: Harness) -> None:
    response = teams.mutate(review(pod(TEAM_A_IMAGE), namespace="team-b"))
    admitted = apply(pod(TEAM_A_IMAGE), patch_ops(response))
    assert admitted["spec"]["containers"][0]["image"] == f"{HARBOR}/ghcr/team-a/app:1"
    assert admitted["spec"]["imagePullSecrets"] == [{"name": "mirrorgate-robot-b"}]
    assert "warnings" not in response


def test_deny_refuses_the_pod_in_enforce_naming_rule_and_credential(teams: Harness) -> None:
    response = teams.mutate(review(pod("quay.io/locked/app:1"), namespace="team-b"))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "mirrorgate: containers/c0: image 'quay.io/locked/app:1': credential 'robot-a' of "
        "mirrors[2] is not granted to namespace 'team-b', and mirrors[2] says onNotGranted: deny"
    )
    assert teams.secrets.ensure_calls == []


def test_deny_only_warns_in_audit(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, POLICY, audit_only=True)
    response = harness.mutate(review(pod("quay.io/locked/app:1"), namespace="team-b"))
    assert response["allowed"] is True
    assert "patch" not in response
    (warning,) = response["warnings"]
    assert "mirrors[2] says onNotGranted: deny" in warning
    assert "credential 'robot-a'" in warning


def test_pull_policy_never_is_left_as_written_and_counted(teams: Harness) -> None:
    obj = _with_pull_policy(pod("myapp:dev", name="local"), "Never")
    response = teams.mutate(review(obj, namespace="team-a"))
    assert response["allowed"] is True
    assert patch_ops(response) == []
    assert "warnings" not in response
    assert unmirrored(teams)["pull-policy-never"] == 1.0


def test_two_credentials_granted_by_label_are_counted_as_ambiguous(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, POLICY)
    harness.secrets.labels["team-a"] = {"team": "c"}
    response = harness.mutate(review(pod("ghcr.io/org/app:1"), namespace="team-a"))
    assert patch_ops(response) == []
    (warning,) = response["warnings"]
    assert "credentials 'robot-a' and 'robot-c' of mirrors[1] are both granted" in warning
    assert unmirrored(harness)["credential-ambiguous"] == 1.0
    assert harness.secrets.ensure_calls == []


# --- explain ---------------------------------------------------------------------------------


def _explain(policy_path: Path, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["explain", "--policy", str(policy_path), *args], out=out, err=err)
    return code, out.getvalue()


def test_explain_shows_the_chain_it_walked(policy_path: Path) -> None:
    code, out = _explain(policy_path, "-n", "team-b", TEAM_A_IMAGE)
    explained = json.loads(out)
    assert code == 0
    assert explained["outcome"] == "rewrite"
    assert explained["result"] == f"{HARBOR}/ghcr/team-a/app:1"
    assert explained["rule"]["index"] == 1
    assert explained["rule"]["credentials"] == ["robot-a", "robot-b", "robot-c"]
    assert explained["credential"] == "robot-b"
    assert explained["chain"] == [
        {
            "rule": "mirrors[0]",
            "source": "ghcr.io/team-a",
            "reason": "credential 'robot-a' of mirrors[0] is not granted to namespace 'team-b'",
        }
    ]
    _, table = _explain(policy_path, "-n", "team-b", "-o", "table", TEAM_A_IMAGE)
    assert (
        "passed over mirrors[0]: credential 'robot-a' of mirrors[0] is not granted to "
        "namespace 'team-b'" in table
    )


def test_explain_says_a_deny_refuses(policy_path: Path) -> None:
    code, out = _explain(policy_path, "-n", "team-b", "quay.io/locked/app:1")
    explained = json.loads(out)
    assert code == 1
    assert explained["outcome"] == "not-granted"
    assert explained["denied"] is True
    assert explained["reason"].endswith("mirrors[2] says onNotGranted: deny")
    _, audit = _explain(policy_path, "-n", "team-b", "--mode", "audit", "quay.io/locked/app:1")
    assert json.loads(audit)["denied"] is False


def test_explain_the_pull_policy_and_the_catch_all(policy_path: Path) -> None:
    _, out = _explain(policy_path, "-n", "team-a", "--pull-policy", "Never", "myapp:dev")
    never = json.loads(out)
    assert never["outcome"] == "pull-policy-never"
    assert never["result"] == "myapp:dev"
    assert "pull policy is Never" in never["reason"]
    _, out = _explain(policy_path, "-n", "team-a", "myapp:dev")
    caught = json.loads(out)
    assert caught["result"] == f"{CACHE}/docker.io/library/myapp:dev"
    assert caught["rule"]["source"] == "*"
    assert caught["match"]["field"] == "mirrors[3].source"


# --- audit -----------------------------------------------------------------------------------


def test_the_audit_report_gives_the_reason() -> None:
    loaded = policy.load(yaml.safe_load(POLICY))
    report = audit_report.NamespaceReport("team-b", "enforce", "enforce", excluded=False)
    report.add_pod(
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "local", "image": "myapp:dev", "imagePullPolicy": "Never"},
                    {"name": "pulled", "image": "myapp:dev"},
                    {"name": "fell", "image": TEAM_A_IMAGE},
                    {"name": "denied", "image": "quay.io/locked/app:1"},
                ]
            },
        },
        loaded,
    )
    rows = {(image, t.verdict.outcome): t.verdict for image, t in report.rows()}
    assert "pull policy is Never" in str(rows[("myapp:dev", "pull-never")].reason)
    assert rows[("myapp:dev", "rewrite")].new_image == f"{CACHE}/docker.io/library/myapp:dev"
    fell = rows[(TEAM_A_IMAGE, "rewrite")]
    assert fell.credential == "robot-b"
    assert fell.reason == (
        "passed over mirrors[0]: credential 'robot-a' of mirrors[0] is not granted to "
        "namespace 'team-b'"
    )
    denied = rows[("quay.io/locked/app:1", "not-granted")]
    assert str(denied.reason).endswith("onNotGranted: deny; refused in enforce")
    counts = report.counts()
    assert counts["pull-never"] == 1
    assert "pull-never" not in audit_report.UNMIRRORED


# --- export ----------------------------------------------------------------------------------


def test_export_says_what_it_cannot_express_of_the_catch_all() -> None:
    loaded = policy.load(yaml.safe_load(POLICY))
    containerd = export.containerd(loaded)
    (caught,) = [w for w in containerd.warnings if w.startswith("mirrors[3]")]
    assert "not exported" in caught
    assert "_default" in caught
    assert not any(path.startswith("_default") for path in containerd.files)
    cri_o = export_crio.cri_o(loaded)
    (caught,) = [w for w in cri_o.warnings if w.startswith("mirrors[3]")]
    assert "not exported" in caught
    assert '"*"' not in cri_o.files["registries.conf"]
    assert any("'robot-a' or 'robot-b' or 'robot-c'" in note for note in cri_o.notes)
