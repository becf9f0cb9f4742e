"""The README and docs/ say what the code does: checked against the model, CLI and server."""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
import typing
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench import figures, results
from mirrorgate import policy
from mirrorgate.certs import CertificateAuthority
from mirrorgate.policy import crdschema, fields, loader, mirrorlists, verdicts
from mirrorgate.webhook import cli
from tests.webhook.serving import client_context, serve

REPOSITORY = Path(__file__).resolve().parents[1]
README = (REPOSITORY / "README.md").read_text()
DOCS = REPOSITORY / "docs"
REFERENCE = (DOCS / "policy-reference.md").read_text()
CLI_DOC = (DOCS / "cli.md").read_text()
INSTALL = (DOCS / "install.md").read_text()
DEVELOPMENT = DOCS / "development.md"


# --- the policy reference ----------------------------------------------------------------------


def reference_rows() -> dict[str, tuple[str, str]]:
    """``field: (type, default)`` from the reference's field table."""
    table = REFERENCE.split("## Fields", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2].strip("`"))
    return rows


def test_the_reference_lists_exactly_the_fields_the_loader_accepts() -> None:
    """No field missing, none invented: the table against the loader's own field lists."""
    expected = {
        *loader._TOP_LEVEL_KEYS,
        *(f"mirrors[].{key}" for key in loader._RULE_KEYS),
        *(f"mirrors[].mirror[].{key}" for key in mirrorlists.ENTRY_KEYS),
        *(f"exclude.{key}" for key in loader._EXCLUDE_KEYS),
        *(f"health.{key}" for key in loader._HEALTH_KEYS),
        *(f"credentials.<name>.{key}" for key in loader._GRANT_KEYS),
    }
    assert set(reference_rows()) == expected


RULE = {"source": "docker.io", "mirror": "m.example/hub"}
# How to read each documented default back from a policy loaded without the field.
DEFAULTS: dict[str, tuple[dict[str, Any], Any]] = {
    "onCredentialError": ({}, lambda p: p.on_credential_error),
    "mirrors": ({}, lambda p: list(p.rules)),
    "skipPullPolicyNever": ({}, lambda p: p.skip_pull_policy_never),
    "mirrors[].credential": ({"mirrors": [RULE]}, lambda p: list(p.rules[0].credentials)),
    "mirrors[].onNotGranted": ({"mirrors": [RULE]}, lambda p: p.rules[0].on_not_granted),
    "mirrors[].onMirrorDown": ({"mirrors": [RULE]}, lambda p: p.rules[0].on_mirror_down),
    "mirrors[].caFile": ({"mirrors": [RULE]}, lambda p: p.rules[0].ca_file),
    "mirrors[].insecureSkipVerify": ({"mirrors": [RULE]}, lambda p: p.rules[0].skip_verify),
    **{
        f"mirrors[].mirror[].{key}": (
            {"mirrors": [{"source": "docker.io", "mirror": ["m.example/hub", "n.example/hub"]}]},
            lambda p, read=read: read(p.rules[1]),
        )
        for key, read in (
            ("credential", lambda r: list(r.credentials)),
            ("caFile", lambda r: r.ca_file),
            ("insecureSkipVerify", lambda r: r.skip_verify),
        )
    },
    "mirrors[].fixed": ({"mirrors": [RULE]}, lambda p: p.rules[0].fixed),
    "health": (
        {},
        lambda p: {
            "interval": f"{p.health.interval:g}s",
            "timeout": f"{p.health.timeout:g}s",
            "failureThreshold": p.health.failure_threshold,
            "successThreshold": p.health.success_threshold,
        },
    ),
    "health.interval": ({}, lambda p: f"{p.health.interval:g}s"),
    "health.timeout": ({}, lambda p: f"{p.health.timeout:g}s"),
    "health.failureThreshold": ({}, lambda p: p.health.failure_threshold),
    "health.successThreshold": ({}, lambda p: p.health.success_threshold),
    "exclude": ({}, lambda p: {} if not (p.exclude_images or p.exclude_namespaces) else None),
    "exclude.images": ({}, lambda p: list(p.exclude_images)),
    "exclude.namespaces": ({}, lambda p: list(p.exclude_namespaces)),
    "credentials": ({}, lambda p: dict(p.grants)),
    "credentials.<name>.registry": (
        {"credentials": {"a": {"namespaces": ["*"]}}},
        lambda p: p.grants["a"].registry,
    ),
    "credentials.<name>.provider": (
        {"credentials": {"a": {"namespaces": ["*"]}}},
        lambda p: p.grants["a"].provider,
    ),
    "credentials.<name>.delivery": (
        {"credentials": {"a": {"namespaces": ["*"]}}},
        lambda p: p.grants["a"].delivery,
    ),
    "credentials.<name>.namespaceSelector": (
        {"credentials": {"a": {"namespaces": ["shop"]}}},
        lambda p: p.grants["a"].selector,
    ),
}


@pytest.mark.parametrize("field", sorted(reference_rows()))
def test_each_documented_default_is_the_loaders(field: str) -> None:
    """A field left out takes the documented default; a `required` field is required."""
    default = reference_rows()[field][1]
    if default == "required":
        assert field not in DEFAULTS
        assert field in {
            "mirrors[].source",
            "mirrors[].mirror",
            "mirrors[].mirror[].url",
            "credentials.<name>.namespaces",
        }
        return
    document, read = DEFAULTS[field]
    assert read(policy.load(document)) == yaml.safe_load(default)


def yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


@pytest.mark.parametrize("example", yaml_blocks(REFERENCE))
def test_every_reference_example_loads(example: str) -> None:
    """Each example of the reference is a valid policy, or objects that are all accepted."""
    documents = list(yaml.safe_load_all(example))
    if not any(policy.is_policy_object(d) for d in documents):
        assert isinstance(policy.load(documents[0]), policy.Policy)
        return
    composition = policy.compose([policy.parse_object(d) for d in documents])
    assert composition.verdicts
    assert not composition.refused


def test_the_reference_documents_both_kinds_as_the_crds_define_them() -> None:
    """The kinds table against the generated CRDs: scope and spec fields; and every
    reason a refusal gives."""
    table = REFERENCE.split("<!-- kinds:", 1)[1].split("<!-- end of kinds -->", 1)[0]
    rows = {
        cells[0].strip("`"): cells[1:]
        for line in table.splitlines()
        if len(cells := [c.strip() for c in line.split("|")[1:-1]]) == 4
        and cells[0].startswith("`")
    }
    assert set(rows) == set(policy.objects.KINDS)
    top = {f.path for f in fields.FIELDS if "." not in f.path and "[]" not in f.path}
    for kind, (scope, spec, _) in rows.items():
        crd = crdschema.crd(kind)  # type: ignore[arg-type]
        assert crd["spec"]["scope"].lower() == scope
        documented = top if spec == "every field of the table above" else {"mirrors"}
        assert set(crdschema.spec_schema(kind)["properties"]) == documented  # type: ignore[arg-type]
    section = REFERENCE.split("## ClusterMirrorPolicy and MirrorPolicy", 1)[1].split("\n## ", 1)[0]
    for reason in typing.get_args(verdicts.Reason):
        assert f"`{reason}`" in section or reason == "Accepted"


def test_the_reference_lists_every_outcome() -> None:
    """The outcome table names every outcome admission and explain give."""
    table = REFERENCE.split("## What admission decides", 1)[1]
    assert set(re.findall(r"^\| `([a-z-]+)` \|", table, re.M)) == set(policy.IMAGE_OUTCOMES)


def test_the_reference_error_example_is_the_loaders() -> None:
    """The reference's sample error is word for word what loading that policy says."""
    message = re.search(r"`(mirrors\[2\]\.source: .*?)`\.", REFERENCE, re.S)
    assert message is not None
    document = {
        "mirrors": [{"source": f"s{i}.example", "mirror": f"m.example/{i}"} for i in range(2)]
        + [{"source": "Docker.io", "mirror": "m.example/x"}]
    }
    with pytest.raises(policy.PolicyError) as caught:
        policy.load(document)
    assert str(caught.value) == " ".join(message[1].split())


def test_the_readme_policy_loads() -> None:
    """The README's policy, every field of it, is a valid policy."""
    (block,) = [b for b in yaml_blocks(README) if "mirrors:" in b]
    assert isinstance(policy.load(yaml.safe_load(block)), policy.Policy)


# --- README and docs/cli.md examples ------------------------------------------------------------


def console_examples(text: str) -> list[tuple[str, str]]:
    """``(command, output)`` for every `$ mirrorgate ...` line of a console block."""
    examples = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for command, output in re.findall(r"^\$ (mirrorgate .*)\n((?:[^$].*\n)*)", block, re.M):
            examples.append((command, output))
    return examples


def test_the_cli_page_has_console_examples() -> None:
    assert len(console_examples(CLI_DOC)) >= 3


@pytest.mark.parametrize(("command", "output"), console_examples(README + CLI_DOC))
def test_console_examples_are_what_the_cli_prints(
    command: str, output: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `$ mirrorgate ...` example, run in the repository, prints what the docs show."""
    monkeypatch.chdir(REPOSITORY)
    out, err = io.StringIO(), io.StringIO()
    cli.main(shlex.split(command)[1:], out=out, err=err)
    assert out.getvalue() == output


def test_the_sample_admissionreview_answers_as_the_readme_shows(tmp_path: Path) -> None:
    """examples/admissionreview.json through `make serve`'s setup gives the README's output."""
    shown = re.search(r"<!-- example:mutate[^>]*-->\n```text\n(.*?)```", README, re.S)
    assert shown is not None
    ca = CertificateAuthority.generate()
    pair = ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])
    with (
        serve(
            tmp_path, pair=pair, policy=(REPOSITORY / "examples" / "policy.yaml").read_text()
        ) as running,
        httpx.Client(base_url=running.url, verify=client_context(ca.cert_pem)) as client,
    ):
        answer = client.post(
            "/mutate",
            content=(REPOSITORY / "examples" / "admissionreview.json").read_bytes(),
            headers={"content-type": "application/json"},
        )
    assert answer.status_code == 200
    printed = subprocess.run(
        [sys.executable, REPOSITORY / "examples" / "show-response.py"],
        input=answer.text,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert printed == shown[1]


def test_supported_kubernetes_version_is_the_tested_one() -> None:
    """docs/install.md's tested version is the one build.sh pins for the e2e suite."""
    build = (REPOSITORY / "tests" / "controlplane" / "build.sh").read_text()
    pinned = re.search(r'K8S_VERSION="\$\{K8S_VERSION:-(v[0-9.]+)\}"', build)
    assert pinned is not None
    section = INSTALL.split("## Supported Kubernetes versions", 1)[1].split("\n## ", 1)[0]
    assert f"Tested: **{pinned[1]}**" in section


def test_operations_lists_exactly_the_shipped_alerts() -> None:
    """docs/operations.md's alert table names every alert of the monitoring overlay, no other."""
    rule = yaml.safe_load(
        (REPOSITORY / "manifests" / "overlays" / "monitoring" / "prometheusrule.yaml").read_text()
    )
    shipped = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}
    table = (DOCS / "operations.md").read_text().split("## Monitoring", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `(Mirrorgate\w+)` \|", table, re.M)) == shipped


def test_changelog_names_the_current_version() -> None:
    """CHANGELOG.md has an entry for the version pyproject.toml sets, or Unreleased on top."""
    version = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## (.+)$", (REPOSITORY / "CHANGELOG.md").read_text(), re.M)
    assert version in headings
    assert headings[0] in ("Unreleased", version)


# --- figures -----------------------------------------------------------------------------------


def test_figures_are_those_of_the_last_bench_run() -> None:
    """docs/development.md's figures are exactly what bench.figures renders from results.json."""
    assert figures.TARGET == DEVELOPMENT
    document = DEVELOPMENT.read_text()
    assert figures.render(document, results.load()) == document


def test_render_replaces_only_the_marked_section() -> None:
    """Text outside the markers is kept; a section never measured says so."""
    readme = f"intro\n{figures.BEGIN}\nstale 1.00×\n{figures.END}\noutro\n"
    recorded = {
        "planning": {
            "command": "make bench-policy",
            "measured": "2026-01-01 00:00 UTC",
            "cpus": 2,
            "report": "| a | b |\n| --- | --- |\n| 1 | 2 |",
        }
    }
    rendered = figures.render(readme, recorded)
    assert rendered.startswith(f"intro\n{figures.BEGIN}\n")
    assert rendered.endswith(f"{figures.END}\noutro\n")
    assert "stale" not in rendered
    assert "| 1 | 2 |" in rendered
    assert "From `make bench-policy` on 2026-01-01 00:00 UTC (2 CPUs)" in rendered
    assert rendered.count("*Not measured yet: run `make bench`.*") == len(figures.SECTIONS) - 1
    with pytest.raises(ValueError, match="markers"):
        figures.render("no markers", recorded)


def test_results_capture_records_what_was_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """A benchmark's printed report is recorded as its section, and still printed."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "results.json"
        with results.capture("planning", command="make bench-policy", path=path):
            print("| a |\n| --- |\n| 1 |")
        recorded = results.load(path)
    assert recorded["planning"]["report"] == "| a |\n| --- |\n| 1 |"
    assert recorded["planning"]["command"] == "make bench-policy"
    assert capsys.readouterr().out == "| a |\n| --- |\n| 1 |\n"
