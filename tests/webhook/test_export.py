"""`mirrorgate export containerd|cri-o`: golden files, parsed back, and routed like admission.

The golden files live in tests/webhook/golden/export/, made from the policy
there. After a deliberate change of output, regenerate them with
``MIRRORGATE_UPDATE_GOLDEN=1 pytest tests/webhook/test_export.py`` and review
the diff.
"""

from __future__ import annotations

import dataclasses
import io
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mirrorgate import policy
from mirrorgate.webhook import cli, policyfile
from mirrorgate.webhook.commands import export_crio

GOLDEN = Path(__file__).resolve().parent / "golden" / "export"
POLICY = GOLDEN / "policy.yaml"
UPDATE = os.environ.get("MIRRORGATE_UPDATE_GOLDEN") == "1"

# Images whose route through the exported configuration is checked against
# what admission rewrites them to.
CONTAINERD_IMAGES = (
    "nginx:1.27",
    "docker.io/grafana/grafana:11.1.0",
    "index.docker.io/library/redis@sha256:" + "a" * 64,
    "ghcr.io/org/tool:v1",
    "registry.internal.example:5000/team/app:2",
)
CRI_O_IMAGES = (
    *CONTAINERD_IMAGES,
    "docker.io/bitnami/redis:7.2",  # the longer prefix wins over docker.io
    "quay.io/prometheus/node-exporter:v1.8.0",
    "quay.io/prometheus/alertmanager",
)


@dataclasses.dataclass
class Result:
    code: int | str | None
    out: str
    err: str


def run(*argv: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    try:
        code: int | str | None = cli.main(list(argv), out=out, err=err)
    except SystemExit as exit_:  # argparse usage errors
        code = exit_.code
    return Result(code=code, out=out.getvalue(), err=err.getvalue())


def rules() -> policy.Policy:
    return policyfile.read_policy(POLICY).policy


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def check_golden(actual: dict[str, str], golden: Path) -> None:
    if UPDATE:
        for relative, text in actual.items():
            (golden / relative).parent.mkdir(parents=True, exist_ok=True)
            (golden / relative).write_text(text, encoding="utf-8")
    assert actual == tree(golden)


@pytest.fixture
def containerd_out(tmp_path: Path) -> tuple[Result, Path]:
    out = tmp_path / "certs.d"
    return run("export", "containerd", "--policy", str(POLICY), "--out", str(out)), out


# --- golden files ------------------------------------------------------------


def test_containerd_matches_golden(containerd_out: tuple[Result, Path]) -> None:
    result, out = containerd_out
    assert result.code == 1, result.err  # some rules are not expressible
    assert result.out == ""
    check_golden(tree(out), GOLDEN / "containerd")
    assert sorted(tree(out)) == [
        "docker.io/hosts.toml",
        "ghcr.io/hosts.toml",
        "registry.internal.example:5000/hosts.toml",
    ]


def test_cri_o_matches_golden() -> None:
    result = run("export", "cri-o", "--policy", str(POLICY))
    assert result.code == 1, result.err  # the wildcard is not expressible
    check_golden({"registries.conf": result.out}, GOLDEN / "cri-o")


# --- containerd: structure and routing ---------------------------------------


def hosts_files(out: Path) -> dict[str, dict[str, Any]]:
    return {relative.split("/")[0]: tomllib.loads(text) for relative, text in tree(out).items()}


def test_hosts_toml_structure(containerd_out: tuple[Result, Path]) -> None:
    parsed = hosts_files(containerd_out[1])
    assert parsed["docker.io"] == {
        "server": "https://registry-1.docker.io",
        "host": {
            "https://harbor.corp.example/v2/dockerhub-proxy": {
                "capabilities": ["pull", "resolve"],
                "override_path": True,
            }
        },
    }
    assert parsed["ghcr.io"] == {
        "server": "https://ghcr.io",
        "host": {
            "https://harbor.corp.example/v2/ghcr-proxy": {
                "capabilities": ["pull", "resolve"],
                "override_path": True,
            }
        },
    }
    # No path on the mirror: containerd adds /v2 itself, no override_path.
    assert parsed["registry.internal.example:5000"] == {
        "server": "https://registry.internal.example:5000",
        "host": {"https://cache.corp.example:8443": {"capabilities": ["pull", "resolve"]}},
    }


def containerd_manifest_url(parsed: dict[str, dict[str, Any]], image: str) -> str:
    """The first URL containerd asks for `image`'s manifest, per its hosts.toml rules."""
    ref = policy.parse_normalized(image)
    host_url, settings = next(iter(parsed[ref.domain]["host"].items()))
    api_root = host_url if settings.get("override_path") else f"{host_url}/v2"
    return f"{api_root}/{ref.path}/manifests/{ref.digest or ref.tag or 'latest'}"


def registry_manifest_url(image: str) -> str:
    ref = policy.parse_normalized(image)
    return f"https://{ref.domain}/v2/{ref.path}/manifests/{ref.digest or ref.tag or 'latest'}"


@pytest.mark.parametrize("image", CONTAINERD_IMAGES)
def test_containerd_pulls_what_admission_would_rewrite_to(
    containerd_out: tuple[Result, Path], image: str
) -> None:
    resolution = rules().resolve(image)
    assert resolution.outcome == "rewrite"
    assert resolution.new_image is not None
    parsed = hosts_files(containerd_out[1])
    assert containerd_manifest_url(parsed, image) == registry_manifest_url(resolution.new_image)


def test_containerd_reports_what_it_cannot_express(containerd_out: tuple[Result, Path]) -> None:
    err = containerd_out[0].err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 3, err
    assert (
        "mirrors[1] (docker.io/bitnami → mirror.corp.example/bitnami): not exported" in warnings[0]
    )
    assert "through mirrors[0]'s mirror harbor.corp.example/dockerhub-proxy" in warnings[0]
    assert (
        "mirrors[2] (quay.io/prometheus → mirror.corp.example/prometheus): not exported: "
        "hosts.toml configures whole registries" in warnings[1]
    )
    assert "mirrors[4] (*.gcr.io → mirror.corp.example/gcr): not exported" in warnings[2]
    assert "no wildcard" in warnings[2]


def test_credentials_are_never_written_and_the_output_says_so(
    containerd_out: tuple[Result, Path],
) -> None:
    result, out = containerd_out
    assert "note: no credentials are written" in result.err
    assert (
        "mirrors[0] (docker.io → harbor.corp.example/dockerhub-proxy): the mirror needs "
        "credential 'harbor-pull'" in result.err
    )
    assert "admission webhook" in result.err
    for relative, text in tree(out).items():
        assert text.startswith("# containerd hosts.toml for "), relative
        assert "# No credentials are written here" in text
        keys = _all_keys(tomllib.loads(text))
        assert not keys & {"auth", "username", "password", "token", "identitytoken"}, relative


def _all_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value).union(*(_all_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_all_keys(v) for v in value))
    return set()


def test_containerd_rewrites_files_in_place(containerd_out: tuple[Result, Path]) -> None:
    out = containerd_out[1]
    (out / "docker.io" / "hosts.toml").write_text("stale", encoding="utf-8")
    (out / "quay.io").mkdir()
    (out / "quay.io" / "hosts.toml").write_text("# someone else's\n", encoding="utf-8")
    again = run("export", "containerd", "--policy", str(POLICY), "--out", str(out))
    assert again.code == 1
    assert (out / "docker.io" / "hosts.toml").read_text() == (
        GOLDEN / "containerd" / "docker.io" / "hosts.toml"
    ).read_text()
    # Files of registries the policy does not export are left alone.
    assert (out / "quay.io" / "hosts.toml").read_text() == "# someone else's\n"
    assert not [p for p in out.rglob(".hosts.toml.*")]  # no temporary files left


# --- CRI-O: structure and routing --------------------------------------------


def registries_conf() -> dict[str, Any]:
    return tomllib.loads(export_crio.cri_o(rules()).files["registries.conf"])


def test_registries_conf_structure() -> None:
    registries = registries_conf()["registry"]
    assert [
        (r["prefix"], r["location"], [m["location"] for m in r["mirror"]]) for r in registries
    ] == [
        ("docker.io", "docker.io", ["harbor.corp.example/dockerhub-proxy"]),
        ("docker.io/bitnami", "docker.io/bitnami", ["mirror.corp.example/bitnami"]),
        ("quay.io/prometheus", "quay.io/prometheus", ["mirror.corp.example/prometheus"]),
        ("ghcr.io", "ghcr.io", ["harbor.corp.example/ghcr-proxy"]),
        (
            "registry.internal.example:5000",
            "registry.internal.example:5000",
            ["cache.corp.example:8443"],
        ),
    ]
    assert set(registries_conf()) == {"registry"}  # no global settings changed by a drop-in
    for entry in registries:
        assert set(entry) == {"prefix", "location", "mirror"}
        assert [set(m) for m in entry["mirror"]] == [{"location"}]


def cri_o_mirror_reference(conf: dict[str, Any], image: str) -> str:
    """What containers/image pulls first: the longest matching prefix, its mirror location.

    A prefix matches when the normalised reference continues after it with
    ':', '/', '@' or nothing (sysregistriesv2's refMatchingPrefix).
    """
    ref = str(policy.parse_normalized(image))
    matching = [
        r
        for r in conf["registry"]
        if ref.startswith(r["prefix"]) and ref[len(r["prefix"]) :][:1] in ("", ":", "/", "@")
    ]
    best = max(matching, key=lambda r: len(r["prefix"]))
    location: str = best["mirror"][0]["location"]
    return location + ref[len(best["prefix"]) :]


@pytest.mark.parametrize("image", CRI_O_IMAGES)
def test_cri_o_pulls_what_admission_would_rewrite_to(image: str) -> None:
    resolution = rules().resolve(image)
    assert resolution.outcome == "rewrite"
    assert cri_o_mirror_reference(registries_conf(), image) == resolution.new_image


def test_cri_o_reports_the_wildcard_and_credentials() -> None:
    result = run("export", "cri-o", "--policy", str(POLICY))
    warnings = [line for line in result.err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, result.err
    assert warnings[0].startswith(
        "warning: mirrors[4] (*.gcr.io → mirror.corp.example/gcr): not exported: "
    )
    assert "note: no credentials are written" in result.err
    assert "credential 'harbor-pull'" in result.err
    assert result.out.startswith("# containers-registries.conf(5) v2 drop-in for CRI-O")
    assert "# No credentials are written here" in result.out
    assert "*.gcr.io" not in registries_conf()


# --- exit codes and errors ---------------------------------------------------


def write_policy(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_fully_expressible_policy_exits_zero(tmp_path: Path) -> None:
    path = write_policy(
        tmp_path, "mirrors:\n  - source: docker.io\n    mirror: mirror.example/hub\n"
    )
    containerd = run("export", "containerd", "--policy", path, "--out", str(tmp_path / "out"))
    assert containerd.code == 0, containerd.err
    assert "warning" not in containerd.err
    assert (tmp_path / "out" / "docker.io" / "hosts.toml").is_file()
    cri_o = run("export", "cri-o", "--policy", path)
    assert cri_o.code == 0, cri_o.err
    assert tomllib.loads(cri_o.out)["registry"][0]["mirror"] == [{"location": "mirror.example/hub"}]


def test_nothing_expressible_writes_nothing(tmp_path: Path) -> None:
    path = write_policy(
        tmp_path, "mirrors:\n  - source: '*.gcr.io'\n    mirror: mirror.example/gcr\n"
    )
    result = run("export", "containerd", "--policy", path, "--out", str(tmp_path / "out"))
    assert result.code == 1
    assert "warning: no rule could be exported; nothing written" in result.err
    assert not (tmp_path / "out").exists()


def test_empty_policy_exports_an_empty_drop_in(tmp_path: Path) -> None:
    result = run("export", "cri-o", "--policy", write_policy(tmp_path, "onCredentialError: skip\n"))
    assert result.code == 0
    assert tomllib.loads(result.out) == {}


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["export"], id="no-runtime"),
        pytest.param(["export", "docker", "--policy", "p.yaml"], id="unknown-runtime"),
        pytest.param(["export", "containerd", "--policy", "p.yaml"], id="no-out"),
        pytest.param(["export", "cri-o"], id="no-policy"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    result = run(*argv)
    assert result.code == 2
    err = capsys.readouterr().err  # argparse writes to sys.stderr itself
    assert err.startswith("mirrorgate export")
    assert "error:" in err
    assert len(err.splitlines()) == 1


def test_bad_policy_is_a_one_line_config_error(tmp_path: Path) -> None:
    missing = run("export", "cri-o", "--policy", str(tmp_path / "nope.yaml"))
    assert missing.code == 2
    assert missing.err.startswith("mirrorgate: error: ")
    assert "cannot read policy" in missing.err
    bad = write_policy(tmp_path, "mirrors:\n  - source: Docker.io\n    mirror: m.example\n")
    invalid = run("export", "cri-o", "--policy", bad)
    assert invalid.code == 2
    assert "invalid policy" in invalid.err
    assert invalid.out == ""


def test_unwritable_out_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    result = run("export", "containerd", "--policy", str(POLICY), "--out", str(blocker))
    assert result.code == 2
    assert result.err.splitlines()[-1].startswith(f"mirrorgate: error: {blocker}: cannot write")


# --- several mirrors per source ------------------------------------------------

FAILOVER = """\
mirrors:
  - source: docker.io
    mirror:
      - url: harbor-a.corp.example/hub
        credential: a-pull
      - url: harbor-b.corp.example/hub
        caFile: /etc/mirrorgate/ca/b.pem
      - http://cache.corp.example:5000/hub
  - source: quay.io/org
    mirror: [mirror.corp.example/org, standby.corp.example/org]
credentials:
  a-pull: {namespaces: [shop]}
"""


def test_containerd_lists_a_rule_s_mirrors_in_order(tmp_path: Path) -> None:
    path = write_policy(tmp_path, FAILOVER)
    result = run("export", "containerd", "--policy", path, "--out", str(tmp_path / "d"))
    parsed = hosts_files(tmp_path / "d")
    assert list(parsed["docker.io"]["host"].items()) == [
        (
            "https://harbor-a.corp.example/v2/hub",
            {"capabilities": ["pull", "resolve"], "override_path": True},
        ),
        (
            "https://harbor-b.corp.example/v2/hub",
            {
                "capabilities": ["pull", "resolve"],
                "override_path": True,
                "ca": "/etc/mirrorgate/ca/b.pem",
            },
        ),
        (
            "http://cache.corp.example:5000/v2/hub",
            {"capabilities": ["pull", "resolve"], "override_path": True},
        ),
    ]
    # Each mirror reached other than by verified HTTPS gets its own file, as for one mirror.
    assert sorted(parsed) == [
        "cache.corp.example:5000",
        "docker.io",
        "harbor-b.corp.example",
    ]
    text = (tmp_path / "d" / "docker.io" / "hosts.toml").read_text()
    assert "# containerd tries the mirrors in this order first, then the server." in text
    assert "# The mirror harbor-a.corp.example/hub needs credential 'a-pull'." in text
    # The path rule is one warning for the whole rule, naming its mirrors in order.
    assert (
        "warning: mirrors[1] (quay.io/org → mirror.corp.example/org, standby.corp.example/org): "
        "not exported: hosts.toml configures whole registries" in result.err
    )
    assert result.err.count("warning: ") == 1, result.err
    # The first host is the one containerd asks first: the first mirror's image.
    image = "nginx:1.27"
    assert containerd_manifest_url(parsed, image) == registry_manifest_url(
        str(policyfile.read_policy(Path(path)).policy.resolve(image).new_image)
    )


def test_cri_o_lists_a_rule_s_mirrors_in_order(tmp_path: Path) -> None:
    result = run("export", "cri-o", "--policy", write_policy(tmp_path, FAILOVER))
    assert result.code == 0, result.err
    registries = tomllib.loads(result.out)["registry"]
    assert [
        (r.get("prefix"), [(m["location"], m.get("insecure", False)) for m in r.get("mirror", [])])
        for r in registries
    ] == [
        (
            "docker.io",
            [
                ("harbor-a.corp.example/hub", False),
                ("harbor-b.corp.example/hub", False),
                ("cache.corp.example:5000/hub", True),
            ],
        ),
        ("quay.io/org", [("mirror.corp.example/org", False), ("standby.corp.example/org", False)]),
        (None, []),  # the plain-HTTP mirror host itself, for images rewritten to it
    ]
    assert (
        "# mirrors[0].mirror[0]: docker.io → harbor-a.corp.example/hub (needs credential 'a-pull')"
        in result.out
    )
    assert (
        "the mirror harbor-b.corp.example is verified with /etc/mirrorgate/ca/b.pem" in result.err
    )
