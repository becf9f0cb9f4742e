"""`helm upgrade --reuse-values` across a chart that added values, against a real API server.

--reuse-values keeps the previous chart's defaults as well as the user's values,
so a value the new chart added has none: the chart refuses, naming the value and
--reset-then-reuse-values (docs/upgrading.md), which keeps the user's values and
takes the new defaults.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness import helm as h
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kube import create_namespace

pytestmark = pytest.mark.e2e

RELEASE = "gate"


def _previous_chart(workdir: Path) -> Path:
    """The chart as it was before `spread`: no such value, its one constraint written in."""
    chart = workdir / "mirrorgate"
    shutil.copytree(h.CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    del values["spread"]
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    deployment = chart / "templates" / "deployment.yaml"
    text = deployment.read_text()
    added = '{{- $spread := include "mirrorgate.defaulted" (list "spread" .Values.spread) }}'
    assert added in text
    deployment.write_text(text.replace(added, '{{- $spread := "required" }}'))
    return chart


def test_reuse_values_is_refused_by_name_and_reset_then_reuse_keeps_the_users_values(
    helm: Path, own_control_plane: ControlPlane, tmp_path: Path
) -> None:
    home, kubeconfig = tmp_path / "home", own_control_plane.kubeconfig
    with own_control_plane.api_client() as api:
        namespace = create_namespace(api, "helm-upgrade")
    common = ["--namespace", namespace, "--set", f"fullnameOverride={RELEASE}"]
    h.run(
        helm,
        "install",
        RELEASE,
        str(_previous_chart(tmp_path)),
        *common,
        "--set",
        "replicas=3",
        home=home,
        kubeconfig=kubeconfig,
    )
    try:
        upgrade = ["upgrade", RELEASE, str(h.CHART), "--namespace", namespace]
        refused = h.run(
            helm, *upgrade, "--reuse-values", home=home, kubeconfig=kubeconfig, check=False
        )
        assert refused.returncode != 0
        assert "spread: no value" in refused.stderr
        assert "--reset-then-reuse-values" in refused.stderr
        assert "goroutine" not in refused.stderr
        h.run(helm, *upgrade, "--reset-then-reuse-values", home=home, kubeconfig=kubeconfig)
        values = yaml.safe_load(
            h.run(
                helm,
                "get",
                "values",
                RELEASE,
                "--namespace",
                namespace,
                "--all",
                "-o",
                "yaml",
                home=home,
                kubeconfig=kubeconfig,
            ).stdout
        )
        # The user's values survive, and the new chart's defaults arrive.
        assert (values["replicas"], values["fullnameOverride"]) == (3, RELEASE)
        assert values["spread"] == "required"
    finally:
        h.run(
            helm,
            "uninstall",
            RELEASE,
            "--namespace",
            namespace,
            home=home,
            kubeconfig=kubeconfig,
            check=False,
        )
