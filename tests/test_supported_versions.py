"""docs/install.md's "Supported Kubernetes versions" names exactly what `make test-versions`
runs (tests/e2e/versions.py), and the minimum it states is the one everything else states:
the chart's kubeVersion, the README and the top of docs/install.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.e2e import versions

REPOSITORY = Path(__file__).resolve().parents[1]
INSTALL = (REPOSITORY / "docs" / "install.md").read_text()
RUNS = "runs"


def _section() -> str:
    found = re.search(r"^## Supported Kubernetes versions\n(.*?)^## ", INSTALL, re.M | re.S)
    assert found is not None, "docs/install.md has no 'Supported Kubernetes versions' section"
    return found.group(1)


def _tested_rows() -> dict[str, tuple[str, str]]:
    """The table of tested versions: version -> (API-server suite, node) cells."""
    rows = re.findall(r"^\| \*\*(v1\.\d+\.\d+)\*\* \| ([^|]+?) \| ([^|]+?) \|$", _section(), re.M)
    assert rows, "no table of tested versions (| **vX.Y.Z** | runs | runs |)"
    table = {version: (api, node) for version, api, node in rows}
    assert len(table) == len(rows), f"a version twice: {[r[0] for r in rows]}"
    return table


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def test_the_docs_list_exactly_the_versions_make_test_versions_runs() -> None:
    table = _tested_rows()
    assert set(table) == set(versions.API_VERSIONS) | set(versions.NODE_VERSIONS)
    for version, (api, node) in table.items():
        assert (api == RUNS) == (version in versions.API_VERSIONS), (version, api)
        assert (node == RUNS) == (version in versions.NODE_VERSIONS), (version, node)
    # Newest first, as the rest of the docs list versions.
    assert list(table) == sorted(table, key=lambda v: tuple(map(int, v[1:].split("."))))[::-1]


def test_the_minimum_is_the_oldest_version_tested_everywhere_it_is_stated() -> None:
    oldest = min(_minor(v) for v in versions.API_VERSIONS)
    # The node runs on the oldest minor too: the minimum holds for the node as well.
    assert min(_minor(v) for v in versions.NODE_VERSIONS) == oldest
    assert max(versions.API_VERSIONS, key=_minor) in versions.NODE_VERSIONS
    assert f"Minimum: **v1.{oldest}**" in _section()
    readme = (REPOSITORY / "README.md").read_text()
    for page, text in (("README.md", readme), ("docs/install.md", INSTALL)):
        stated = set(re.findall(r"Kubernetes \*\*1\.(\d+) or newer\*\*", text))
        assert stated == {str(oldest)}, (page, stated)
    chart = yaml.safe_load((REPOSITORY / "manifests/helm/mirrorgate/Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">=1.{oldest}.0-0"


def test_a_feature_newer_than_the_minimum_says_what_happens_before_it() -> None:
    """Every row of the features table whose `since` is past the minimum has a `before`
    cell saying what an older cluster does instead (the fallback the matrix runs)."""
    oldest = min(_minor(v) for v in versions.API_VERSIONS)
    rows = re.findall(r"^\| (.+?) \| 1\.(\d+) \| (.*?) \|$", _section(), re.M)
    assert rows, "no features table (| feature | since | before |)"
    newer = [(feature, before) for feature, since, before in rows if int(since) > oldest]
    assert newer, "no feature newer than the minimum: then nothing differs by version"
    for feature, before in newer:
        assert before.strip() not in ("", "-", "—"), feature


def test_the_node_runs_pull_secretless_from_the_minor_the_chart_allows_it() -> None:
    """The secretless scenarios run on every node the chart lets enable the kubelet plugin,
    on at least the newest, and are left out only where the chart refuses them."""
    helpers = (REPOSITORY / "manifests/helm/mirrorgate/templates/_kubeletplugin.tpl").read_text()
    guard = re.findall(r'semverCompare "<1\.(\d+)\.0-0"', helpers)
    assert guard == [str(versions.SECRETLESS_MINOR)], guard
    for version in versions.NODE_VERSIONS:
        markers = versions.selection(version, "node")[-1]
        if _minor(version) >= versions.SECRETLESS_MINOR:
            assert markers == "installed", (version, markers)
        else:
            assert markers == "installed and not secretless", (version, markers)
    assert versions.selection(max(versions.NODE_VERSIONS, key=_minor), "node")[-1] == "installed"
    assert versions.selection("v1.30.14", "api") == ["tests/e2e/api", "-m", "e2e and not node"]


def test_each_run_prints_its_line_counted_from_pytests_own_report(tmp_path: Path) -> None:
    """The line is the issue's, counted from a real pytest run's JUnit report (an error
    is a failure, an xfail a skip), and only a clean run is a pass."""
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        # The suite's figures use record_property, which warns under junit's xunit2.
        "def test_ok(record_property): record_property('figure', 1)\n"
        "def test_ok_too(): pass\n"
        "def test_fails(): assert False\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError\n"
        "def test_errors(broken): pass\n"
        "@pytest.mark.skip(reason='x')\n"
        "def test_skipped(): pass\n"
    )
    junit = tmp_path / "report.xml"
    sample = tmp_path / "test_sample.py"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "error",
            *versions.JUNIT,
            junit,
            sample,
        ],
        capture_output=True,
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    passed, failed, skipped = versions.counts(junit)
    outcome = versions.Outcome("v1.30.14", "api", passed, failed, skipped, 0.0, 0.0, junit)
    assert outcome.line == "kubernetes v1.30.14 (api): 2 passed, 2 failed, 1 skipped"
    assert not outcome.ok
    clean = versions.Outcome("v1.37.2", "api", 2, 0, 0, 0.0, 0.0, junit)
    assert clean.ok
    # A node run without the upgrade's line did not run the upgrade test.
    assert not versions.Outcome("v1.37.2", "node", 2, 0, 0, 0.0, 0.0, junit).ok
    line = "upgrade 0.1.0 -> 0.1.0+abc1234: 900 Pods, fail-open 0, rejected 0, unrewritten 0"
    assert versions.UPGRADE_LINE.findall(f"== e2e figures ==\n{line}\n") == [line]


def test_the_docs_say_whether_the_chart_renders_by_kubernetes_version() -> None:
    """Where a template reads `.Capabilities.KubeVersion`, the chart renders differently by
    minor and both renderings must run (`helm template --kube-version`, then the matrix);
    the docs say which. Today one does (_kubeletplugin.tpl: kubeletPlugin from 1.34), and
    the docs name it."""
    templates = REPOSITORY / "manifests" / "helm" / "mirrorgate" / "templates"
    readers = sorted(
        t.name for t in templates.iterdir() if "Capabilities.KubeVersion" in t.read_text()
    )
    says_none = "reads no\n`.Capabilities.KubeVersion`" in _section()
    assert says_none == (readers == []), (
        f"templates reading .Capabilities.KubeVersion: {readers}; docs/install.md must say "
        "what each minor renders, and a test must render both sides"
    )
    for reader in readers:
        assert f"`{reader}`" in _section(), f"docs/install.md does not say what {reader} reads"
