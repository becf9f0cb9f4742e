"""`make test-versions`: the e2e suite against each Kubernetes minor mirrorgate supports.

The versions below are the supported range: docs/install.md ("Supported Kubernetes
versions") names exactly these, and tests/test_supported_versions.py holds the two
equal. For each one the binaries are built (or reused: tests/controlplane/build.sh
caches them by version) and pytest runs with ``K8S_VERSION`` set, which every
Kubernetes binary of the harness is chosen by:

* ``(api)``: everything that needs kube-apiserver and etcd but not the node
  (tests/e2e/api), on every version of API_VERSIONS;
* ``(node)``: the node scenarios against mirrorgate installed by its chart from its
  image (``-m installed``; the upgrade from 0.1.0 among them), on NODE_VERSIONS. The
  secretless pulls run from SECRETLESS_MINOR on; before it the chart refuses them.

Each run prints one line, ``kubernetes vX.Y.Z (api): N passed, F failed, S skipped``,
then how long its build and its tests took; the upgrade test's own line
(``upgrade 0.1.0 -> ...``) is repeated from the node runs' output. The whole output of
each run is kept in MIRRORGATE_VERSIONS_LOGS (default build/test-versions/). The run
fails when any line has a failure or a skip: a version that cannot run every test is
not one mirrorgate has passed on.

    python -m tests.e2e.versions                          # the whole matrix
    python -m tests.e2e.versions --kind api --version v1.30.14
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SH = REPO_ROOT / "tests" / "controlplane" / "build.sh"

# The oldest minor that passes, one in the middle (the first with KEP-4412's
# service-account tokens for credential providers, the last without KEP-2535 on by
# default) and the newest; each the newest patch release the Go module proxy serves.
API_VERSIONS = ("v1.30.14", "v1.34.4", "v1.37.2")
# The oldest and the newest minor whose kubelet runs on this cgroup v1 machine.
NODE_VERSIONS = ("v1.30.14", "v1.37.2")

# The first minor whose kubelet sends credential providers service-account tokens
# (KEP-4412, beta): the secretless pulls run on nodes from it on. Before it the chart
# refuses kubeletPlugin.enabled, which the api runs check on every minor.
SECRETLESS_MINOR = 34
BINARIES = {
    "api": ("kube-apiserver",),
    "node": ("kube-apiserver", "kubelet", "kube-controller-manager", "kube-scheduler"),
}
KINDS = tuple(BINARIES)
# xunit1: the suite's record_property (figures) warns under xunit2, and warnings are errors.
JUNIT = ("-o", "junit_family=xunit1", "--junitxml")
UPGRADE_LINE = re.compile(r"^upgrade 0\.1\.0 -> .*$", re.MULTILINE)


@dataclass(frozen=True)
class Outcome:
    version: str
    kind: str
    passed: int
    failed: int
    skipped: int
    build_seconds: float
    test_seconds: float
    log: Path
    extra: tuple[str, ...] = ()

    @property
    def line(self) -> str:
        return (
            f"kubernetes {self.version} ({self.kind}): {self.passed} passed, "
            f"{self.failed} failed, {self.skipped} skipped"
        )

    @property
    def ok(self) -> bool:
        # A node run holds the upgrade test: without its line it did not run.
        upgraded = self.kind != "node" or bool(self.extra)
        return self.failed == 0 and self.skipped == 0 and self.passed > 0 and upgraded


def counts(junit: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from pytest's JUnit XML; errors count as failures."""
    root = ET.parse(junit).getroot()  # noqa: S314  # the report pytest just wrote here
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failed = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def minor(version: str) -> int:
    return int(version.split(".")[1])


def selection(version: str, kind: str) -> list[str]:
    """pytest's arguments for one run: the api suite, or every scenario of the node
    with the installed chart that the version's kubelet can run."""
    if kind == "api":
        return ["tests/e2e/api", "-m", "e2e and not node"]
    if minor(version) >= SECRETLESS_MINOR:
        return ["tests/e2e/node", "-m", "installed"]
    return ["tests/e2e/node", "-m", "installed and not secretless"]


def run(version: str, kind: str, logs: Path) -> Outcome:
    env = {**os.environ, "K8S_VERSION": version, "MIRRORGATE_REQUIRE_E2E": "1"}
    log = logs / f"{version}-{kind}.log"
    junit = logs / f"{version}-{kind}.xml"
    junit.unlink(missing_ok=True)
    with log.open("w") as out:
        started = time.monotonic()
        built = subprocess.run(
            ["bash", str(BUILD_SH), *BINARIES[kind]], env=env, stdout=out, stderr=out, check=False
        )
        build_seconds = time.monotonic() - started
        if built.returncode != 0:
            return Outcome(version, kind, 0, 1, 0, build_seconds, 0.0, log)
        started = time.monotonic()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                *selection(version, kind),
                "-p",
                "no:cacheprovider",
                *JUNIT,
                junit,
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            check=False,
        )
        test_seconds = time.monotonic() - started
    # No report at all (pytest refused its arguments, or died) is one failure.
    passed, failed, skipped = counts(junit) if junit.exists() else (0, 1, 0)
    extra = tuple(UPGRADE_LINE.findall(log.read_text(errors="replace")))
    return Outcome(version, kind, passed, failed, skipped, build_seconds, test_seconds, log, extra)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.versions", description=__doc__)
    parser.add_argument("--kind", action="append", choices=sorted(KINDS), help="default: both")
    parser.add_argument("--version", action="append", help="default: every version of the kind")
    args = parser.parse_args(argv)
    logs = Path(os.environ.get("MIRRORGATE_VERSIONS_LOGS", REPO_ROOT / "build" / "test-versions"))
    logs.mkdir(parents=True, exist_ok=True)
    plan = [
        (version, kind)
        for kind, versions in (("api", API_VERSIONS), ("node", NODE_VERSIONS))
        if kind in (args.kind or KINDS)
        for version in versions
        if version in (args.version or versions)
    ]
    if not plan:
        parser.error(f"nothing to run: api runs {API_VERSIONS}, node runs {NODE_VERSIONS}")
    outcomes = []
    for version, kind in plan:
        outcome = run(version, kind, logs)
        outcomes.append(outcome)
        print(outcome.line, flush=True)
        for line in outcome.extra:
            print(line, flush=True)
        print(
            f"  build {outcome.build_seconds:.0f} s, tests {outcome.test_seconds:.0f} s;"
            f" log: {outcome.log}",
            flush=True,
        )
    print("\nsummary:")
    for outcome in outcomes:
        print(outcome.line)
        for line in outcome.extra:
            print(line)
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
