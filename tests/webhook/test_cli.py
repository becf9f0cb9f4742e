"""`mirrorgate rewrite`, `explain`, `policy check`: outputs, exit codes and one-line errors;
and serve's settings, each declared once (flags, Settings and the docs' table)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.metadata
import io
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirrorgate.webhook import cli
from tests.webhook import policies
from tests.webhook.harness import Harness
from tests.webhook.reviews import (
    HUB_IMAGE,
    HUB_MIRRORED,
    HUB_SECRET,
    PROM_IMAGE,
    PROM_MIRRORED,
    UNMATCHED_IMAGE,
    apply,
    patch_ops,
    pod,
    review,
)

REPOSITORY = Path(__file__).resolve().parents[2]
REFERENCE_KEYS = {"domain", "path", "tag", "digest", "name", "normalized"}
EXPLAIN_KEYS = {
    "image",
    "mode",
    "valid",
    "error",
    "reference",
    "outcome",
    "reason",
    "rule",
    "result",
    "credential",
    "credentialRegistry",
    "delivery",
    "match",
    "warning",
    "chain",
    "denied",
    "mirrors",
}


@dataclasses.dataclass
class Result:
    code: int | str | None
    out: str
    err: str


@pytest.fixture
def mirrorgate(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run ``main`` with injected streams; argparse's own exits and output are caught too."""

    def run(*argv: str) -> Result:
        out, err = io.StringIO(), io.StringIO()
        try:
            code: int | str | None = cli.main(list(argv), out=out, err=err)
        except SystemExit as exit_:  # argparse: --help and usage errors
            code = exit_.code
        captured = capsys.readouterr()
        return Result(
            code=code, out=out.getvalue() + captured.out, err=err.getvalue() + captured.err
        )

    return run


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(policies.POLICY)
    return path


def rich_pod() -> dict[str, Any]:
    obj = pod(HUB_IMAGE, PROM_IMAGE, UNMATCHED_IMAGE, namespace="team-a")
    obj["metadata"]["labels"] = {"app": "web"}
    obj["spec"]["futureField"] = {"keep": ["me"]}
    obj["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    return obj


def expected_rewrite(obj: dict[str, Any]) -> dict[str, Any]:
    expected = copy.deepcopy(obj)
    expected["spec"]["containers"][0]["image"] = HUB_MIRRORED
    expected["spec"]["containers"][1]["image"] = PROM_MIRRORED
    expected["spec"]["imagePullSecrets"] = [{"name": HUB_SECRET}]
    expected["metadata"]["annotations"] = {
        "mirrorgate.io/original-images": json.dumps(
            {"containers/c0": HUB_IMAGE, "containers/c1": PROM_IMAGE},
            sort_keys=True,
            separators=(",", ":"),
        )
    }
    return expected


def write_yaml(tmp_path: Path, *documents: Any, name: str = "pods.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


# --- rewrite -----------------------------------------------------------------------------------


def test_rewrite_yaml_output(mirrorgate: Any, tmp_path: Path, policy_file: Path) -> None:
    """The Pod comes out as admission would leave it, unknown fields and all; exit 0."""
    obj = rich_pod()
    result = mirrorgate(
        "rewrite", "--policy", str(policy_file), "-f", str(write_yaml(tmp_path, obj))
    )
    assert result.code == 0
    assert result.err == ""
    assert list(yaml.safe_load_all(result.out)) == [expected_rewrite(obj)]


def test_rewrite_json_output(mirrorgate: Any, tmp_path: Path, policy_file: Path) -> None:
    """-o json prints one object for one Pod."""
    obj = rich_pod()
    result = mirrorgate(
        "rewrite", "--policy", str(policy_file), "-o", "json", "-f", str(write_yaml(tmp_path, obj))
    )
    assert result.code == 0
    assert json.loads(result.out) == expected_rewrite(obj)


def test_rewrite_json_output_of_several_documents_is_a_list(
    mirrorgate: Any, tmp_path: Path, policy_file: Path
) -> None:
    """Several documents come out as a v1 List, in order."""
    first, second = rich_pod(), pod(PROM_IMAGE, name="two", namespace="team-a")
    result = mirrorgate(
        "rewrite",
        "--policy",
        str(policy_file),
        "-o",
        "json",
        "-f",
        str(write_yaml(tmp_path, first, second)),
    )
    assert result.code == 0
    listing = json.loads(result.out)
    assert listing["kind"] == "List"
    assert listing["apiVersion"] == "v1"
    assert [item["metadata"]["name"] for item in listing["items"]] == ["web", "two"]
    assert listing["items"][0] == expected_rewrite(first)


def test_rewrite_patch_output_applies_to_the_input(
    mirrorgate: Any, tmp_path: Path, policy_file: Path
) -> None:
    """-o patch prints one JSON Patch per Pod, which applied gives the -o yaml result."""
    obj = rich_pod()
    result = mirrorgate(
        "rewrite", "--policy", str(policy_file), "-o", "patch", "-f", str(write_yaml(tmp_path, obj))
    )
    assert result.code == 0
    [line] = result.out.splitlines()
    ops = json.loads(line)
    assert {op["path"] for op in ops} == {
        "/spec/containers/0/image",
        "/spec/containers/1/image",
        "/metadata/annotations",
        "/spec/imagePullSecrets",
    }
    assert apply(obj, ops) == expected_rewrite(obj)


def test_rewrite_reads_json_from_stdin(
    mirrorgate: Any, policy_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-f -` (the default) reads stdin, JSON as well as YAML."""
    obj = rich_pod()
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(obj)))
    result = mirrorgate("rewrite", "--policy", str(policy_file), "-o", "json")
    assert result.code == 0
    assert json.loads(result.out) == expected_rewrite(obj)


def test_rewrite_in_audit_mode_leaves_the_pod_and_warns(
    mirrorgate: Any, tmp_path: Path, policy_file: Path
) -> None:
    """`--mode audit`: the Pod is unchanged and each planned rewrite is a warning; exit 1."""
    obj = rich_pod()
    result = mirrorgate(
        "rewrite",
        "--policy",
        str(policy_file),
        "--mode",
        "audit",
        "-o",
        "json",
        "-f",
        str(write_yaml(tmp_path, obj)),
    )
    assert result.code == 1
    assert json.loads(result.out) == obj
    lines = result.err.splitlines()
    assert len(lines) == 2
    assert all(line.startswith("warning: Pod/web: ") for line in lines)
    assert "containers/c0" in lines[0]
    assert HUB_MIRRORED in lines[0]
    assert "containers/c1" in lines[1]
    assert PROM_MIRRORED in lines[1]


def template(*images: str) -> dict[str, Any]:
    """A Pod template: a Pod's metadata (no name) and spec."""
    obj = pod(*images, name=None)
    obj["metadata"]["labels"] = {"app": "web"}
    return {"metadata": obj["metadata"], "spec": obj["spec"]}


def workload(kind: str, *images: str, namespace: str | None = None) -> dict[str, Any]:
    """A ``kind`` named web whose template runs ``images``, as people write them."""
    metadata: dict[str, Any] = {"name": "web"}
    if namespace is not None:
        metadata["namespace"] = namespace
    body = {"template": template(*images)}
    if kind == "PodTemplate":
        return {"apiVersion": "v1", "kind": kind, "metadata": metadata, **body}
    if kind == "CronJob":
        spec: dict[str, Any] = {"schedule": "@hourly", "jobTemplate": {"spec": body}}
    else:
        spec = {"replicas": 2, **body}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": metadata, "spec": spec}


WORKLOAD_KINDS = [
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "ReplicationController",
    "Job",
    "CronJob",
    "PodTemplate",
]


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_rewrite_shows_a_workloads_pod_as_admission_mutates_it(
    mirrorgate: Any, tmp_path: Path, policy_file: Path, harness: Harness, kind: str
) -> None:
    """The Pod the controller would create, exactly as /mutate patches it; exit 0."""
    document = workload(kind, HUB_IMAGE, PROM_IMAGE, UNMATCHED_IMAGE, namespace="team-a")
    result = mirrorgate(
        "rewrite",
        "--policy",
        str(policy_file),
        "-o",
        "json",
        "-f",
        str(write_yaml(tmp_path, document)),
    )
    assert result.code == 0, result.err
    shown = json.loads(result.out)

    expected_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": {"app": "web"}, "namespace": "team-a", "generateName": "web-"},
        "spec": template(HUB_IMAGE, PROM_IMAGE, UNMATCHED_IMAGE)["spec"],
    }
    admitted = apply(expected_pod, patch_ops(harness.mutate(review(expected_pod))))
    assert shown == admitted
    assert [c["image"] for c in shown["spec"]["containers"]] == [
        HUB_MIRRORED,
        PROM_MIRRORED,
        UNMATCHED_IMAGE,
    ]


def test_rewrite_workload_in_an_excluded_namespace_is_unchanged(
    mirrorgate: Any, tmp_path: Path, policy_file: Path
) -> None:
    """The workload's own namespace decides, as it does for its Pods."""
    document = workload("Deployment", HUB_IMAGE, namespace="excluded-ns")
    result = mirrorgate(
        "rewrite",
        "--policy",
        str(policy_file),
        "-o",
        "json",
        "-f",
        str(write_yaml(tmp_path, document)),
    )
    assert result.code == 0
    assert json.loads(result.out)["spec"]["containers"][0]["image"] == HUB_IMAGE


def test_rewrite_passes_over_objects_that_are_not_pods_or_workloads(
    mirrorgate: Any, tmp_path: Path, policy_file: Path
) -> None:
    """A Deployment and a Service: the Deployment's Pod only, no warning, exit 0."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"ports": [{"port": 80}]},
    }
    obj = rich_pod()
    result = mirrorgate(
        "rewrite",
        "--policy",
        str(policy_file),
        "-f",
        str(write_yaml(tmp_path, workload("Deployment", PROM_IMAGE), service, obj)),
    )
    assert result.code == 0
    assert result.err == ""
    first, second = yaml.safe_load_all(result.out)
    assert (first["kind"], first["metadata"]["generateName"]) == ("Pod", "web-")
    assert first["spec"]["containers"][0]["image"] == PROM_MIRRORED
    assert second == expected_rewrite(obj)


def test_rewrite_without_pods_or_workloads_says_so_in_one_line(
    mirrorgate: Any, tmp_path: Path, policy_file: Path
) -> None:
    """Only a Service and a ConfigMap: one line naming what was found, exit 2."""
    path = write_yaml(
        tmp_path,
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}},
    )
    result = mirrorgate("rewrite", "--policy", str(policy_file), "-f", str(path))
    assert result.code == 2
    assert result.out == ""
    assert result.err.count("\n") == 1
    assert result.err.startswith(f"mirrorgate: error: {path}: no Pod and no workload")
    assert result.err.endswith("found Service/a, ConfigMap/b\n")


def test_rewrite_workload_without_a_template_is_a_warning(
    mirrorgate: Any, tmp_path: Path, policy_file: Path
) -> None:
    """A workload whose template is missing is named, with where the template should be."""
    document = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "@daily"},
    }
    result = mirrorgate(
        "rewrite", "--policy", str(policy_file), "-f", str(write_yaml(tmp_path, document))
    )
    assert result.code == 1
    assert result.err == (
        "warning: CronJob/nightly: no Pod template with a spec at spec.jobTemplate.spec.template\n"
    )


@pytest.mark.parametrize(
    ("namespace_args", "changed"),
    [
        pytest.param(("-n", "excluded-ns"), False, id="excluded-namespace"),
        pytest.param(("-n", "team-b"), True, id="other-namespace"),
    ],
)
def test_rewrite_namespace_option(
    mirrorgate: Any,
    tmp_path: Path,
    policy_file: Path,
    namespace_args: tuple[str, ...],
    changed: bool,
) -> None:
    """-n plans for that namespace instead of the Pod's own."""
    obj = rich_pod()
    result = mirrorgate(
        "rewrite",
        "--policy",
        str(policy_file),
        "-o",
        "json",
        *namespace_args,
        "-f",
        str(write_yaml(tmp_path, obj)),
    )
    assert result.code == 0
    assert (json.loads(result.out) != obj) is changed


# --- explain -----------------------------------------------------------------------------------


def explained(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.out.splitlines()]


def test_explain_without_policy_shows_the_reference_only(mirrorgate: Any) -> None:
    """Every documented field; outcome, rule, result and credential are null; no :latest added."""
    result = mirrorgate("explain", "nginx")
    assert result.code == 0
    [entry] = explained(result)
    assert set(entry) == EXPLAIN_KEYS
    assert entry == {
        "image": "nginx",
        "mode": "enforce",
        "valid": True,
        "error": None,
        "reference": {
            "domain": "docker.io",
            "path": "library/nginx",
            "tag": None,
            "digest": None,
            "name": "docker.io/library/nginx",
            "normalized": "docker.io/library/nginx",
        },
        "outcome": None,
        "reason": None,
        "rule": None,
        "result": None,
        "credential": None,
        "credentialRegistry": None,
        "delivery": None,
        "match": None,
        "warning": None,
        "chain": [],
        "denied": False,
        "mirrors": None,
    }


def test_explain_with_policy_names_rule_result_and_credential(
    mirrorgate: Any, policy_file: Path
) -> None:
    """A rewritten image shows the rule, the new image and the credential it needs."""
    result = mirrorgate(
        "explain", "--policy", str(policy_file), HUB_IMAGE, PROM_IMAGE, UNMATCHED_IMAGE
    )
    assert result.code == 0
    hub, prom, unmatched = explained(result)
    for entry in (hub, prom, unmatched):
        assert set(entry) == EXPLAIN_KEYS
        assert set(entry["reference"]) == REFERENCE_KEYS
    assert hub["rule"] == {
        "index": 0,
        "source": "docker.io",
        "mirror": "harbor.corp.example/dockerhub-proxy",
        "scheme": "https",
        "credentials": ["harbor-pull"],
    }
    assert hub["result"] == HUB_MIRRORED
    assert hub["credential"] == "harbor-pull"
    assert hub["delivery"] == "pullSecret"
    assert hub["outcome"] == "rewrite"
    # A rule of one mirror: that mirror, chosen.
    assert hub["mirrors"] == [
        {
            "rule": "mirrors[0]",
            "mirror": "harbor.corp.example/dockerhub-proxy",
            "credentials": ["harbor-pull"],
            "status": "chosen",
            "reason": None,
        }
    ]
    assert hub["reference"]["normalized"] == "docker.io/library/nginx:1.27"
    assert prom["result"] == PROM_MIRRORED
    assert prom["credential"] is None
    assert prom["delivery"] is None
    assert unmatched["outcome"] == "no-rule"
    assert unmatched["result"] == UNMATCHED_IMAGE
    assert unmatched["rule"] is None


def test_explain_digest_reference(mirrorgate: Any) -> None:
    """Tag and digest are both reported, and the normalised form keeps them."""
    digest = "sha256:" + "ab" * 32
    [entry] = explained(mirrorgate("explain", f"quay.io/prometheus/node-exporter:v1@{digest}"))
    assert entry["reference"] == {
        "domain": "quay.io",
        "path": "prometheus/node-exporter",
        "tag": "v1",
        "digest": digest,
        "name": "quay.io/prometheus/node-exporter",
        "normalized": f"quay.io/prometheus/node-exporter:v1@{digest}",
    }


def test_explain_invalid_image(mirrorgate: Any, policy_file: Path) -> None:
    """An invalid reference is valid: false with the error and a warning, exit 1; later
    images still print."""
    result = mirrorgate("explain", "--policy", str(policy_file), "Nginx", PROM_IMAGE)
    assert result.code == 1
    invalid, valid = explained(result)
    assert invalid == {
        "image": "Nginx",
        "mode": "enforce",
        "valid": False,
        "error": "repository name must be lowercase",
        "reference": None,
        "outcome": "invalid",
        "reason": "repository name must be lowercase",
        "rule": None,
        "result": "Nginx",
        "credential": None,
        "credentialRegistry": None,
        "delivery": None,
        "match": None,
        "warning": "image 'Nginx' left as written: repository name must be lowercase",
        "chain": [],
        "denied": False,
        "mirrors": None,
    }
    assert valid["valid"] is True


def test_explain_credential_not_granted(mirrorgate: Any, tmp_path: Path) -> None:
    """A namespace without the grant keeps the image as written, with a warning; exit 1."""
    path = tmp_path / "policy.yaml"
    path.write_text(policies.POLICY.replace('namespaces: ["*"]', 'namespaces: ["team-*"]'))
    result = mirrorgate("explain", "--policy", str(path), "-n", "other", HUB_IMAGE)
    assert result.code == 1
    [entry] = explained(result)
    assert entry["outcome"] == "not-granted"
    assert entry["result"] == HUB_IMAGE
    assert "harbor-pull" in entry["warning"]
    assert "other" in entry["warning"]


# --- policy check ------------------------------------------------------------------------------


def test_policy_check_valid(mirrorgate: Any, tmp_path: Path) -> None:
    """A valid policy with explicit grants: exit 0 and a one-line summary."""
    path = tmp_path / "policy.yaml"
    path.write_text(policies.POLICY.replace('["*"]', '["team-a", shop]'))
    result = mirrorgate("policy", "check", str(path))
    assert result.code == 0
    assert result.out.count("\n") == 1
    assert "valid" in result.out
    assert "2 mirror rules" in result.out


def test_explain_and_policy_check_show_a_kubelet_delivery(mirrorgate: Any, tmp_path: Path) -> None:
    """``delivery: kubelet`` is named by explain (JSON and table) and by policy check's summary."""
    path = tmp_path / "policy.yaml"
    path.write_text(
        policies.POLICY.replace('{namespaces: ["*"]}', "{namespaces: [shop], delivery: kubelet}")
    )
    assert "delivery: kubelet" in path.read_text()
    [entry] = explained(mirrorgate("explain", "--policy", str(path), "-n", "shop", HUB_IMAGE))
    assert (entry["result"], entry["delivery"]) == (HUB_MIRRORED, "kubelet")
    table = mirrorgate("explain", "--policy", str(path), "-n", "shop", "-o", "table", HUB_IMAGE)
    assert f"→ {HUB_MIRRORED} (credential harbor-pull, delivery kubelet)" in table.out
    result = mirrorgate("policy", "check", str(path))
    assert result.code == 0
    assert result.out.rstrip().endswith("1 credential grant; delivery kubelet: harbor-pull)")


@pytest.mark.parametrize(
    ("grant", "warning"),
    [
        pytest.param(
            '["*"]',
            '"*" grants this credential to every opted-in namespace: anyone who can create a '
            "Pod in one can pull with it; name the namespaces that need it, or select them by "
            "an admin-only label (namespaceSelector)",
            id="every-namespace",
        ),
        pytest.param(
            '["team-*", shop]',
            '"team-*" is a glob: whoever may create a namespace whose name it matches (Capsule, '
            "HNC, Rancher projects) gets this credential; name the namespaces, or select them "
            "by an admin-only label (namespaceSelector, docs/credentials.md)",
            id="glob",
        ),
    ],
)
def test_policy_check_warns_of_a_grant_by_glob(
    mirrorgate: Any, tmp_path: Path, grant: str, warning: str
) -> None:
    """Valid, but `"*"` lets anyone who can create a Pod anywhere use the credential, and a
    glob any namespace a tenant may create under that name."""
    path = tmp_path / "policy.yaml"
    path.write_text(policies.POLICY.replace('["*"]', grant))
    result = mirrorgate("policy", "check", str(path))
    assert result.code == 0
    assert result.out.splitlines()[1:] == [
        f"  warning: credentials.harbor-pull.namespaces: {warning}"
    ]


def test_policy_check_accepts_the_example_policy(mirrorgate: Any) -> None:
    """examples/policy.yaml, what `make serve` runs, is valid."""
    result = mirrorgate("policy", "check", str(REPOSITORY / "examples" / "policy.yaml"))
    assert result.code == 0, result.out


def test_policy_check_lists_every_error_with_its_path(mirrorgate: Any, tmp_path: Path) -> None:
    """An invalid policy: exit 1 and one line per error, each starting with the field path."""
    path = tmp_path / "bad.yaml"
    path.write_text(policies.INVALID_POLICY)
    result = mirrorgate("policy", "check", str(path))
    assert result.code == 1
    assert str(path) in result.out
    error_lines = [line.strip() for line in result.out.splitlines()[1:]]
    assert len(error_lines) == len(policies.INVALID_POLICY_PATHS)
    for field_path in policies.INVALID_POLICY_PATHS:
        assert any(line.startswith(f"{field_path}: ") for line in error_lines), field_path


def test_policy_check_warns_about_skipped_verification_and_clear_text_logins(
    mirrorgate: Any, tmp_path: Path
) -> None:
    """Valid but unsafe: exit 0, one warning line per unsafe rule, each with its field path."""
    path = tmp_path / "unsafe.yaml"
    path.write_text(
        "mirrors:\n"
        "  - {source: docker.io, mirror: 'http://cache.local:5000/hub', "
        "credential: cache}\n"
        "  - {source: quay.io, mirror: 'https://m.example/quay', "
        "insecureSkipVerify: true}\n"
        "credentials: {cache: {namespaces: [team-a]}}\n"
    )
    result = mirrorgate("policy", "check", str(path))
    assert result.code == 0
    lines = result.out.splitlines()
    assert "valid" in lines[0]
    assert [line.split(":")[0:2] for line in lines[1:]] == [
        ["  warning", " mirrors[0].mirror"],
        ["  warning", " mirrors[1].insecureSkipVerify"],
    ]
    assert "cross the network in clear" in lines[1]
    assert "are not verified" in lines[2]


def test_policy_check_reports_yaml_syntax_errors_with_position(
    mirrorgate: Any, tmp_path: Path
) -> None:
    """Broken YAML is a finding too, located by line and column."""
    path = tmp_path / "broken.yaml"
    path.write_text("onCredentialError: skip\nmirrors: [\n")
    result = mirrorgate("policy", "check", str(path))
    assert result.code == 1
    assert f"{path}:3:1: not valid YAML" in result.out


# --- usage and file errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param((), id="no-command"),
        pytest.param(("frobnicate",), id="unknown-command"),
        pytest.param(("rewrite",), id="rewrite-without-policy"),
        pytest.param(("rewrite", "--policy", "p.yaml", "-o", "xml"), id="rewrite-bad-output"),
        pytest.param(("explain",), id="explain-without-images"),
        pytest.param(("explain", "--bogus", "nginx"), id="explain-unknown-option"),
        pytest.param(("policy",), id="policy-without-subcommand"),
        pytest.param(("policy", "check"), id="policy-check-without-file"),
        pytest.param(
            ("serve", "--policy", "p", "--tls-cert", "c", "--tls-key", "k", "--port", "x"),
            id="serve-bad-port",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(mirrorgate: Any, argv: tuple[str, ...]) -> None:
    """A usage error is exit 2 and a single line naming the command, nothing on stdout."""
    result = mirrorgate(*argv)
    assert result.code == 2
    assert result.out == ""
    assert result.err.count("\n") == 1
    assert result.err.startswith("mirrorgate")
    assert "error:" in result.err
    assert "Traceback" not in result.err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        pytest.param(
            ("rewrite", "--policy", "{missing}", "-f", "{pods}"),
            "{missing}",
            id="rewrite-missing-policy",
        ),
        pytest.param(
            ("rewrite", "--policy", "{policy}", "-f", "{missing}"),
            "{missing}",
            id="rewrite-missing-input",
        ),
        pytest.param(
            ("rewrite", "--policy", "{policy}", "-f", "{directory}"),
            "{directory}",
            id="rewrite-input-is-a-directory",
        ),
        pytest.param(
            ("rewrite", "--policy", "{policy}", "-f", "{binary}"),
            "{binary}",
            id="rewrite-input-not-utf8",
        ),
        pytest.param(
            ("rewrite", "--policy", "{policy}", "-f", "{broken}"),
            "{broken}",
            id="rewrite-input-not-yaml",
        ),
        pytest.param(
            ("explain", "--policy", "{missing}", "nginx"), "{missing}", id="explain-missing-policy"
        ),
        pytest.param(("policy", "check", "{missing}"), "{missing}", id="policy-check-missing-file"),
        pytest.param(
            ("policy", "check", "{directory}"), "{directory}", id="policy-check-directory"
        ),
    ],
)
def test_unreadable_files_exit_2_naming_the_file(
    mirrorgate: Any, tmp_path: Path, policy_file: Path, argv: tuple[str, ...], named: str
) -> None:
    """A file that cannot be read is a configuration error (exit 2) that names the file."""
    places = {
        "missing": tmp_path / "missing.yaml",
        "policy": policy_file,
        "pods": write_yaml(tmp_path, pod(HUB_IMAGE)),
        "directory": tmp_path / "dir",
        "binary": tmp_path / "binary.yaml",
        "broken": tmp_path / "broken.yaml",
    }
    places["directory"].mkdir()
    places["binary"].write_bytes(b"kind: Pod\nname: \xff\xfe\n")
    places["broken"].write_text("kind: Pod\nspec: [\n")
    result = mirrorgate(*(arg.format(**places) for arg in argv))
    assert result.code == 2, result
    assert result.err.startswith("mirrorgate: error: ")
    assert result.err.count("\n") == 1
    assert named.format(**places) in result.err
    assert "Traceback" not in result.err


def subcommand_paths(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every command path of the CLI, read from the parser itself."""
    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from subcommand_paths(child, (*prefix, name))


COMMANDS = list(subcommand_paths(cli.build_parser()))


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "mirrorgate" for c in COMMANDS])
def test_help_works_for_every_command(mirrorgate: Any, command: tuple[str, ...]) -> None:
    """`--help` prints usage for that command and exits 0."""
    result = mirrorgate(*command, "--help")
    assert result.code == 0
    assert result.out.startswith(f"usage: {' '.join(('mirrorgate', *command))}")
    assert result.err == ""


def test_help_covers_the_documented_commands() -> None:
    """The commands the issue documents are all there."""
    assert {("rewrite",), ("explain",), ("policy", "check"), ("serve",)} <= set(COMMANDS)


# --- version and messages ----------------------------------------------------------------------


def test_version_comes_from_the_package_metadata(mirrorgate: Any) -> None:
    """`--version` prints the version pyproject.toml sets, read from the installed metadata."""
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
    result = mirrorgate("--version")
    assert result.code == 0
    assert result.out == f"mirrorgate {project['version']}\n"
    assert importlib.metadata.version("mirrorgate") == project["version"]


def test_certs_generate_out_must_be_a_directory(mirrorgate: Any, tmp_path: Path) -> None:
    """--out naming a file is a one-line error saying it must be a directory."""
    target = tmp_path / "bundle.pem"
    target.write_text("keep me")
    result = mirrorgate(
        "certs", "generate", "--service", "s", "--namespace", "n", "--out", str(target)
    )
    assert result.code == 2
    assert result.err == (
        f"mirrorgate: error: certs generate: --out {target} is not a "
        "directory; --out names the directory the four files are written "
        "into\n"
    )
    assert target.read_text() == "keep me"


def test_certs_generate_names_every_file_it_writes(mirrorgate: Any, tmp_path: Path) -> None:
    """Each written file is named on stderr, ca.key included; the caBundle goes to stdout."""
    out = tmp_path / "certs"
    result = mirrorgate(
        "certs", "generate", "--service", "s", "--namespace", "n", "--out", str(out)
    )
    assert result.code == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    named = [line.split()[1] for line in result.err.splitlines() if line.startswith("wrote ")]
    assert sorted(named) == [str(out / name) for name in written]
    assert result.out.startswith("caBundle: ")


def test_audit_names_a_missing_kubeconfig(
    mirrorgate: Any, tmp_path: Path, policy_file: Path
) -> None:
    """`audit --kubeconfig missing` says which file is missing, in one line."""
    missing = tmp_path / "no-such-kubeconfig"
    result = mirrorgate("audit", "--policy", str(policy_file), "--kubeconfig", str(missing), "-A")
    assert result.code == 2
    assert result.err == f"mirrorgate: error: kubeconfig {missing}: no such file\n"


def test_explain_label_must_be_key_value(mirrorgate: Any, policy_file: Path) -> None:
    """A label without '=' is a one-line usage error."""
    result = mirrorgate("explain", "--policy", str(policy_file), "-l", "skip", "nginx")
    assert result.code == 2
    assert result.err == "mirrorgate: error: --label 'skip': write KEY=VALUE\n"


# --- serve's settings: declared once -----------------------------------------------------------

# A value for every serve option other than its default: (argv, the Settings field and value).
EVERY_SERVE_OPTION: list[tuple[list[str], str, Any]] = [
    (["--audit-only"], "audit_only", True),
    (["--host", "0.0.0.0"], "host", "0.0.0.0"),  # noqa: S104 (parsed, never bound)
    (["--port", "9443"], "port", 9443),
    (["--metrics-port", "9444"], "metrics_port", 9444),
    (["--client-ca", "/etc/webhook-ca.crt"], "client_ca", "/etc/webhook-ca.crt"),
    (["--reload-interval", "0.5"], "reload_interval", 0.5),
    (["--log-level", "debug"], "log_level", "debug"),
    (["--no-health-probes"], "health_probes", False),
    (["--mirror-ca", "/etc/mirrorgate-ca/ca.crt"], "mirror_ca", "/etc/mirrorgate-ca/ca.crt"),
    (["--tls-secret", "certs"], "tls_secret", "certs"),
    (["--ca-secret", "authority"], "ca_secret", "authority"),
    (["--ca-configmap", "published"], "ca_configmap", "published"),
    (["--service", "gate"], "service", "gate"),
    (["--webhook-config", "mwc"], "webhook_configuration", "mwc"),
    (["--tls-name", "a.example", "--tls-name", "10.0.0.1"], "tls_names", ("a.example", "10.0.0.1")),
    (["--tls-dir", "/run/tls"], "tls_dir", "/run/tls"),
    (["--cert-check-interval", "60"], "cert_check_interval", 60.0),
    (["--kubeconfig", "kc"], "kubeconfig", "kc"),
    (["--context", "ctx"], "kube_context", "ctx"),
    (["--namespace", "ns"], "namespace", "ns"),
    (["--store", "file"], "store", "file"),
    (["--store-file", "store.json"], "store_file", "store.json"),
    (["--key-file", "key"], "store_key_file", "key"),
    (["--credential-provider-config", "cp.yaml"], "credential_provider_config", "cp.yaml"),
    (["--credential-provider-bin-dir", "bin"], "credential_provider_bin_dir", "bin"),
    (["--credential-provider-socket", "host.sock"], "credential_provider_socket", "host.sock"),
    (["--credential-provider-timeout", "3"], "credential_provider_timeout", 3.0),
    (["--credential-deadline", "1.5"], "credential_deadline", 1.5),
    (["--reconcile-interval", "5"], "reconcile_interval", 5.0),
    (["--kubelet-port", "8444"], "kubelet_port", 8444),
    (["--kubelet-client-ca", "kubelets.crt"], "kubelet_client_ca", "kubelets.crt"),
    (["--kubelet-audience", "gate"], "kubelet_audience", "gate"),
    (["--kubelet-cache-duration", "60"], "kubelet_cache_duration", 60.0),
]
EVERY_LIMIT: dict[str, Any] = {
    "max_connections": 7,
    "max_header_bytes": 2048,
    "max_headers": 9,
    "header_timeout": 1.5,
    "body_timeout": 2.5,
    "idle_timeout": 3.5,
    "max_buffered_bytes": 4096,
    "max_containers": 11,
    "write_timeout": 4.5,
    "max_unsent_bytes": 8192,
    "max_pipelined": 3,
}


def test_every_serve_option_lands_in_its_setting() -> None:
    """Each flag sets its field and only it; the limits land in Settings.limits."""
    from mirrorgate.webhook.commands.serve.settings import Settings
    from mirrorgate.webhook.edge.limits import Limits

    base = ["serve", "--policy", "p.yaml", "--tls-cert", "c", "--tls-key", "k"]
    defaults = Settings.from_args(cli.build_parser().parse_args(base))
    assert defaults == Settings(policy="p.yaml", tls_cert="c", tls_key="k")
    covered = {"policy", "tls_cert", "tls_key", "limits"}
    for argv, field, value in EVERY_SERVE_OPTION:
        parsed = Settings.from_args(cli.build_parser().parse_args([*base, *argv]))
        assert parsed == dataclasses.replace(defaults, **{field: value}), argv
        covered.add(field)
    assert covered == {f.name for f in dataclasses.fields(Settings)}, "a setting is not tested"
    limits = [f"--{name.replace('_', '-')}={value}" for name, value in EVERY_LIMIT.items()]
    parsed = Settings.from_args(cli.build_parser().parse_args([*base, *limits]))
    assert parsed == dataclasses.replace(defaults, limits=Limits(**EVERY_LIMIT))
    assert set(EVERY_LIMIT) == {f.name for f in dataclasses.fields(Limits)}


def test_each_limit_has_its_help_and_the_defaults_are_the_limits() -> None:
    from mirrorgate.webhook.commands.serve import settings
    from mirrorgate.webhook.edge.limits import Limits

    assert set(settings.LIMIT_FLAGS) == {f.name for f in dataclasses.fields(Limits)}
    options = settings.options()
    for name in settings.LIMIT_FLAGS:
        assert options[name].default == getattr(Limits(), name)


def test_credentials_check_takes_serves_source_options() -> None:
    """The same flags, help and defaults as serve's, under the names `credentials` reads."""
    parser = cli.build_parser()
    args = parser.parse_args(
        ["credentials", "check", "n", "--image", "i", "--context", "c", "--key-file", "k"]
    )
    assert (args.context, args.key_file, args.credential_provider_timeout) == ("c", "k", 10.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["credentials", "check", "n", "--image", "i", "--store", "none"])


def test_the_docs_table_of_serve_options_is_the_declarations() -> None:
    """docs/cli.md's table is generated; `make docs` rewrites it after a change."""
    from mirrorgate.webhook.commands.serve import flagtable

    document = (REPOSITORY / "docs" / "cli.md").read_text()
    assert flagtable.with_flag_table(document) == document, "run `make docs`"
    table = flagtable.flag_table()
    for argv, _, _ in EVERY_SERVE_OPTION:
        assert f"`{argv[0]}" in table
    assert "| `--max-pipelined N` | `8` |" in table


def test_the_docs_table_is_refused_without_its_markers() -> None:
    from mirrorgate.webhook.commands.serve import flagtable

    with pytest.raises(ValueError, match="no generated serve options block"):
        flagtable.with_flag_table("# no table here\n")


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("[" * 2000 + "]" * 2000, id="lists-2000-deep"),
        pytest.param('{"a":' * 2000 + '"x"' + "}" * 2000, id="objects-2000-deep"),
    ],
)
def test_rewrite_of_a_deep_original_images_annotation_warns_once(
    mirrorgate: Any, tmp_path: Path, policy_file: Path, value: str
) -> None:
    """No traceback: the annotation is treated as absent, as admission treats it, and said so."""
    obj = pod(PROM_IMAGE)
    obj["metadata"]["annotations"] = {"mirrorgate.io/original-images": value}
    result = mirrorgate(
        "rewrite", "--policy", str(policy_file), "-o", "json", "-f", str(write_yaml(tmp_path, obj))
    )
    assert result.code == 1  # a warning is a finding
    assert "Traceback" not in result.err
    assert result.err.splitlines() == [
        "warning: Pod/web: annotation mirrorgate.io/original-images is not a JSON object of "
        "strings; treated as absent and rebuilt from the images rewritten now"
    ]
    rewritten = json.loads(result.out)
    assert [c["image"] for c in rewritten["spec"]["containers"]] == [PROM_MIRRORED]
    assert json.loads(rewritten["metadata"]["annotations"]["mirrorgate.io/original-images"]) == {
        "containers/c0": PROM_IMAGE
    }
