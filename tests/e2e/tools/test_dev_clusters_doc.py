"""docs/dev-clusters.md as written: every file it asks a user to write is the file in
examples/kind/, parsed; the kind patch is read by containerd 2 itself, the values are
rendered by the chart, and the policy exports the certs.d the doc shows.

The exported hosts.toml files are read by a real containerd 2 pulling through a
plain-HTTP cache in tests/e2e/node/test_devclusters.py.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirrorgate import policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import export
from tests.commands import MIRRORGATE
from tests.e2e.harness import helm as h
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT, built_binary

DOC = (REPO_ROOT / "docs" / "dev-clusters.md").read_text()
EXAMPLES = REPO_ROOT / "examples" / "kind"
CERTS_D = "/etc/containerd/certs.d"


def _example(name: str) -> Any:
    return yaml.safe_load((EXAMPLES / name).read_text())


def _shown_files() -> dict[str, str]:
    """``<!-- examples/kind/NAME -->`` followed by a fenced block: what the doc shows."""
    return dict(re.findall(r"<!-- (examples/kind/[\w.-]+) -->\n```\w+\n(.*?)```", DOC, re.S))


def _console_out_dir() -> str:
    (out,) = re.findall(r"mirrorgate export containerd --policy \S+ --out (\S+)", DOC)
    return str(out)


def test_every_file_the_doc_shows_is_the_example_file() -> None:
    shown = _shown_files()
    assert sorted(shown) == sorted(f"examples/kind/{p.name}" for p in EXAMPLES.iterdir())
    for path, text in shown.items():
        assert text == (REPO_ROOT / path).read_text(), path


def _meaning(rules: policy.Policy) -> tuple[object, ...]:
    return (
        rules.on_credential_error,
        rules.rules,
        rules.exclude_images,
        rules.exclude_namespaces,
        dict(rules.grants),
        rules.health,
    )


def test_the_policy_loads() -> None:
    loaded = policyfile.read_policy(EXAMPLES / "policy.yaml").policy
    assert [(r.scheme, str(r.mirror)) for r in loaded.rules] == [("http", "kind-registry:5000")]
    assert loaded.warnings == ()


def test_the_export_writes_what_the_doc_says(tmp_path: Path) -> None:
    out = tmp_path / "certs.d"
    done = subprocess.run(
        [
            *MIRRORGATE,
            "export",
            "containerd",
            "--policy",
            str(EXAMPLES / "policy.yaml"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    wrote = [
        line.removeprefix(f"wrote {out}/")
        for line in done.stderr.splitlines()
        if line.startswith("wrote ")
    ]
    shown = re.findall(r"^wrote \S+?/certs\.d/(\S+)$", DOC, re.M)
    assert wrote == shown == ["docker.io/hosts.toml", "kind-registry:5000/hosts.toml"]
    (toml_block,) = re.findall(r"```toml\n(.*?)```", DOC, re.S)
    exported = (out / "kind-registry:5000" / "hosts.toml").read_text()
    assert tomllib.loads(toml_block) == tomllib.loads(exported)
    # The same as the export function gives, which the node test runs on containerd 2.
    assert (
        exported
        == export.containerd(policyfile.read_policy(EXAMPLES / "policy.yaml").policy).files[
            "kind-registry:5000/hosts.toml"
        ]
    )


def test_kind_and_ctlptl_make_the_same_node_with_the_exported_certs_d() -> None:
    kind, ctlptl = _example("kind-config.yaml"), _example("ctlptl-cluster.yaml")
    assert (kind["kind"], kind["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    assert (ctlptl["kind"], ctlptl["apiVersion"], ctlptl["product"]) == (
        "Cluster",
        "ctlptl.dev/v1alpha1",
        "kind",
    )
    embedded = dict(ctlptl["kindV1Alpha4Cluster"])
    assert embedded.pop("name") == "mirrorgate"
    assert embedded == {k: v for k, v in kind.items() if k not in ("kind", "apiVersion")}
    (node,) = kind["nodes"]
    (mount,) = node["extraMounts"]
    assert mount == {"hostPath": _console_out_dir(), "containerPath": CERTS_D, "readOnly": True}
    assert "--config examples/kind/kind-config.yaml" in DOC


@pytest.mark.e2e
def test_containerd_2_reads_the_kind_patch_as_config_path(tmp_path: Path) -> None:
    """The patch in kind's config version 2, migrated by containerd 2 (`config dump`)."""
    (patch,) = _example("kind-config.yaml")["containerdConfigPatches"]
    config = tmp_path / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{tmp_path}/root"\nstate = "{tmp_path}/state"\n{patch}\n'
    )
    done = subprocess.run(
        [str(built_binary("containerd")), "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    dumped = tomllib.loads(done.stdout)
    assert dumped["version"] >= 3  # 2.4 writes its own newest format, 4
    assert dumped["plugins"]["io.containerd.cri.v1.images"]["registry"]["config_path"] == CERTS_D


@pytest.mark.e2e
def test_the_chart_renders_the_values(helm: Path, tmp_path: Path) -> None:
    output = h.run(
        helm,
        "template",
        "mirrorgate",
        str(h.CHART),
        "--namespace",
        mg.NAMESPACE,
        "-f",
        str(EXAMPLES / "values.yaml"),
        home=tmp_path,
    ).stdout
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(output) if o}
    deployment = objects[("Deployment", "mirrorgate")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "localhost/mirrorgate:0.1.0"
    assert container["imagePullPolicy"] == "Never"
    assert deployment["spec"]["replicas"] == 1
    # The chart ships no policy of its own: `policy:` is the ClusterMirrorPolicy's spec
    # whole, with the same meaning as the kind policy file.
    rendered = policy.load(objects[("ClusterMirrorPolicy", "mirrorgate")]["spec"])
    assert _meaning(rendered) == _meaning(policyfile.read_policy(EXAMPLES / "policy.yaml").policy)
    version = re.search(r'^version = "(.*)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert f"localhost/mirrorgate:{version.group(1)}" in DOC
