"""The Containerfile, checked by reading it (this machine has no container engine)."""

from __future__ import annotations

import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONTAINERFILE = (ROOT / "Containerfile").read_text()
INSTRUCTIONS = [line for line in CONTAINERFILE.splitlines()
                if line and not line.startswith("#") and not line.startswith(" ")]


def _stages() -> list[list[str]]:
    stages: list[list[str]] = []
    for line in INSTRUCTIONS:
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_two_stages_and_a_pinned_base() -> None:
    """A build stage and a run stage, both on an exactly versioned base image."""
    assert len(_stages()) == 2
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", CONTAINERFILE, re.MULTILINE)
    assert base is not None
    # A full patch version and distribution, never a floating tag.
    assert re.fullmatch(r"docker\.io/library/python:3\.11\.\d+-slim-bookworm", base[1])


def test_final_stage_runs_as_the_deployment_user() -> None:
    """The run stage ends as the non-root user the Deployment's securityContext names."""
    final = _stages()[-1]
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users == ["65532:65532"]
    deployment = yaml.safe_load((ROOT / "manifests/base/deployment.yaml").read_text())
    context = deployment["spec"]["template"]["spec"]["securityContext"]
    assert f"{context['runAsUser']}:{context['runAsGroup']}" == users[0]


def test_final_stage_has_no_build_tools() -> None:
    """Only the virtualenv is copied in; pip is removed and nothing is compiled or installed."""
    final = "\n".join(_stages()[-1])
    assert "COPY --from=build /opt/mirrorgate /opt/mirrorgate" in final
    assert "pip uninstall" in final
    for tool in ("apt-get", "gcc", "pip install", "apk add"):
        assert tool not in final


def test_entrypoint_is_the_cli() -> None:
    """The image runs the mirrorgate console script the Deployment passes arguments to."""
    assert 'ENTRYPOINT ["mirrorgate"]' in INSTRUCTIONS
    deployment = yaml.safe_load((ROOT / "manifests/base/deployment.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve"
