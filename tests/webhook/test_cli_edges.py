"""Rough edges of the command line found in a walk-through (issue 23, item 8): each one as
the user met it, and what they get now."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from mirrorgate.certs import CertificateAuthority
from mirrorgate.webhook.commands import offline
from mirrorgate.webhook.credentials import filestore
from mirrorgate.webhook.credentials.store import StoreError
from tests.commands import MIRRORGATE
from tests.e2e.harness.procs import free_port
from tests.webhook import policies, serving
from tests.webhook.reviews import HUB_IMAGE, HUB_MIRRORED, PROM_IMAGE, PROM_MIRRORED, pod
from tests.webhook.test_credentials import _run

PASSWORD = "p@ss-edges-81c2"
OTHER_USER = 65534  # nobody


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key"
    path.write_text(filestore.generate_key())
    path.chmod(0o600)
    return path


def _add(registry: str, store: Path, key_file: Path, name: str = "team-a") -> tuple[int, str, str]:
    return _run(
        [
            "credentials",
            "add",
            name,
            "--registry",
            registry,
            "--username",
            "robot",
            "--password-stdin",
            "--store",
            str(store),
            "--key-file",
            str(key_file),
        ],
        stdin=PASSWORD + "\n",
    )


# --- credentials add: the help says what it accepts --------------------------------------


def test_credentials_add_help_names_the_path_it_accepts(
    tmp_path: Path, key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _run(["credentials", "add", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "host[:port][/path]" in text
    assert "--registry HOST[:PORT][/PATH]" in text
    store = tmp_path / "store.json"
    status, _, err = _add("harbor.corp.example:8443/team-a", store, key_file)
    assert status == 0, err
    status, out, _ = _run(
        ["credentials", "list", "--store", str(store), "--key-file", str(key_file)]
    )
    assert (status, out.splitlines()[1].split()[:2]) == (
        0,
        ["team-a", "harbor.corp.example:8443/team-a"],
    )


# --- ports -------------------------------------------------------------------------------


@pytest.mark.parametrize("port", ["99999", "0", "65536"])
def test_credentials_add_refuses_a_port_outside_1_65535(
    tmp_path: Path, key_file: Path, port: str
) -> None:
    store = tmp_path / "store.json"
    status, out, err = _add(f"harbor.corp.example:{port}/team-a", store, key_file)
    assert (status, out) == (2, "")
    assert err == (
        f'mirrorgate: error: --registry: "harbor.corp.example:{port}/team-a" is not '
        f"a valid registry host: port {port} is outside 1-65535\n"
    )
    assert not store.exists()


@pytest.mark.parametrize("field", ["source", "mirror"])
def test_policy_check_refuses_a_port_outside_1_65535(tmp_path: Path, field: str) -> None:
    hosts = {"source": "registry.corp.example:5000", "mirror": "harbor.corp.example:8443"}
    hosts[field] = hosts[field].replace(":5000", ":99999").replace(":8443", ":99999")
    path = tmp_path / "policy.yaml"
    path.write_text(f"mirrors:\n  - source: {hosts['source']}\n    mirror: {hosts['mirror']}\n")
    status, out, _ = _run(["policy", "check", str(path)])
    assert status == 1
    assert f"mirrors[0].{field}: " in out
    assert "port 99999 is outside 1-65535" in out
    path.write_text(
        "mirrors:\n  - source: registry.corp.example:1\n    mirror: harbor.corp.example:65535\n"
    )
    assert _run(["policy", "check", str(path)])[0] == 0


@pytest.mark.parametrize(
    ("port", "why"),
    [
        ("99999", "port 99999 is outside 1-65535 (0: any free port)"),
        ("-1", "port -1 is outside 1-65535 (0: any free port)"),
        ("http", "'http' is not a port number"),
    ],
)
def test_serve_refuses_a_port_outside_1_65535_in_one_line(
    policy_file: Path, port: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not bind's OverflowError traceback."""
    with pytest.raises(SystemExit) as exited:
        _run(
            [
                "serve",
                "--policy",
                str(policy_file),
                "--tls-cert",
                "c",
                "--tls-key",
                "k",
                f"--port={port}",
            ]
        )
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith(f"mirrorgate serve: error: argument --port: {why}\n")


# --- policy check --store ----------------------------------------------------------------


def test_policy_check_with_a_store_but_no_key_prints_no_verdict(
    tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(filestore.KEY_ENV, raising=False)
    store = tmp_path / "store.json"
    assert _add("harbor.corp.example", store, key_file, name="harbor-pull")[0] == 0
    policy = tmp_path / "policy.yaml"
    policy.write_text(policies.POLICY)
    status, out, err = _run(["policy", "check", str(policy), "--store", str(store)])
    assert (status, out) == (2, "")
    assert err.startswith("mirrorgate: error: no store key: pass --key-file FILE")
    status, out, err = _run(
        ["policy", "check", str(policy), "--store", str(store), "--key-file", str(key_file)]
    )
    assert (status, err) == (0, "")
    assert out.startswith(f"{policy}: valid ")


# --- credentials check --policy: a source image ------------------------------------------


def test_credentials_check_maps_a_source_image_through_the_policy(
    tmp_path: Path, key_file: Path
) -> None:
    store = tmp_path / "store.json"
    assert _add("harbor.corp.example/team-a", store, key_file)[0] == 0
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "mirrors:\n"
        "  - source: docker.io\n    mirror: harbor.corp.example/team-a\n"
        "    credential: team-a\n"
        "  - source: quay.io\n    mirror: harbor.corp.example/team-b\n"
        "    credential: team-b\n"
        "credentials:\n  team-a: {namespaces: ['*']}\n"
        "  team-b: {namespaces: ['*']}\n"
    )
    options = ["--policy", str(policy), "--store-file", str(store), "--key-file", str(key_file)]
    status, out, err = _run(["credentials", "check", "team-a", "--image", "nginx:1.27", *options])
    assert status == 0, err
    assert json.loads(out)["registry"] == "harbor.corp.example/team-a"
    assert err == (
        "mirrorgate: nginx:1.27 is admitted as "
        "harbor.corp.example/team-a/library/nginx:1.27: checking that\n"
    )
    # A mirror image is checked as given, as before.
    status, _, err = _run(
        [
            "credentials",
            "check",
            "team-a",
            "--image",
            "harbor.corp.example/team-a/library/nginx:1.27",
            *options,
        ]
    )
    assert (status, err) == (0, "")
    # A source image whose rule uses another credential: exit 1, saying which.
    status, out, err = _run(
        ["credentials", "check", "team-a", "--image", "quay.io/x/y:1", *options]
    )
    assert (status, out) == (1, "")
    assert err == (
        "mirrorgate: image 'quay.io/x/y:1' is rewritten by mirrors[1] to "
        "'harbor.corp.example/team-b/x/y:1', which uses credential 'team-b', "
        "not 'team-a'\n"
    )


# --- rewrite -f DIR ----------------------------------------------------------------------


def _manifest_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    (directory / "b-hub.yaml").write_text(yaml.safe_dump(pod(HUB_IMAGE, namespace="team-a")))
    (directory / "a-prom.json").write_text(json.dumps(pod(PROM_IMAGE, namespace="team-a")))
    (directory / "notes.txt").write_text("not a manifest: {")
    (directory / "sub.yaml").mkdir()  # not a file: passed over, as kubectl does without -R
    return directory


def test_rewrite_reads_a_directory_of_manifests_in_name_order(
    tmp_path: Path, policy_file: Path
) -> None:
    directory = _manifest_dir(tmp_path)
    status, out, err = _run(
        ["rewrite", "--policy", str(policy_file), "-f", str(directory), "-o", "json"]
    )
    assert (status, err) == (0, "")
    images = [item["spec"]["containers"][0]["image"] for item in json.loads(out)["items"]]
    assert images == [PROM_MIRRORED, HUB_MIRRORED]


def test_rewrite_of_a_directory_without_manifests_or_with_too_many_is_refused(
    tmp_path: Path, policy_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(["rewrite", "--policy", str(policy_file), "-f", str(empty)]) == (
        2,
        "",
        f"mirrorgate: error: {empty}: a directory without .json, .yaml, .yml files\n",
    )
    monkeypatch.setattr(offline, "MAX_MANIFEST_FILES", 1)
    directory = _manifest_dir(tmp_path)
    assert _run(["rewrite", "--policy", str(policy_file), "-f", str(directory)]) == (
        2,
        "",
        f"mirrorgate: error: {directory}: 2 manifest files; at most 1 at once\n",
    )


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(policies.POLICY)
    return path


# --- explain -o table --------------------------------------------------------------------


def test_explain_prints_a_table_on_request_and_json_by_default(policy_file: Path) -> None:
    images = [HUB_IMAGE, "ghcr.io/x/y:1", "Bad:1"]
    status, out, _ = _run(
        ["explain", "--policy", str(policy_file), "-n", "team-a", "-o", "table", *images]
    )
    assert status == 1  # the invalid image, as with JSON
    width = len("ghcr.io/x/y:1")
    assert out.splitlines() == [
        f"{'IMAGE':<{width}}  OUTCOME           DETAIL",
        f"{HUB_IMAGE:<{width}}  rewrite           → {HUB_MIRRORED} "
        "(credential harbor-pull, delivery pullSecret)",
        f"{'ghcr.io/x/y:1':<{width}}  no-rule           no mirror rule covers it",
        f"{'Bad:1':<{width}}  invalid           repository name must be lowercase",
        f"{'':<{width}}  warning: image 'Bad:1' left as written: repository name must be lowercase",
    ]
    status, out, _ = _run(["explain", "--policy", str(policy_file), "-n", "team-a", *images])
    assert status == 1
    assert [json.loads(line)["outcome"] for line in out.splitlines()] == [
        "rewrite",
        "no-rule",
        "invalid",
    ]


# --- audit: an unreachable API server is named -------------------------------------------


def test_audit_names_the_api_server_it_cannot_reach(tmp_path: Path, policy_file: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:1",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    status, out, err = _run(
        ["audit", "--policy", str(policy_file), "--kubeconfig", str(kubeconfig), "--no-health"]
    )
    assert (status, out) == (2, "")
    assert err.startswith("mirrorgate: error: cannot reach the API server: ")
    assert "https://127.0.0.1:1" in err
    assert len(err.splitlines()) == 1


# --- files that cannot be read: the real errno -------------------------------------------

# Root reads everything: as root, the process runs without the capabilities that bypass
# file modes, and the files belong to another user; otherwise their modes shut us out.
AS_ROOT = os.geteuid() == 0
WITHOUT_OVERRIDE = ("setpriv", "--bounding-set=-dac_override,-dac_read_search") if AS_ROOT else ()


def _shut_out(path: Path) -> None:
    """Make ``path`` (a file or directory) something this process may not open."""
    if AS_ROOT:
        os.chown(path, OTHER_USER, OTHER_USER)
        path.chmod(0o700 if path.is_dir() else 0o600)
    else:
        path.chmod(0o000)


def _mirrorgate(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return subprocess.run(
        [*WITHOUT_OVERRIDE, *MIRRORGATE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.mark.parametrize("case", ["unreadable-key", "unsearchable-dir", "missing"])
def test_an_unreadable_certificate_is_not_called_missing(
    tmp_path: Path, policy_file: Path, ca: CertificateAuthority, case: str
) -> None:
    tls = tmp_path / "tls"
    tls.mkdir()
    cert, key = serving.write_pair(tls, ca.issue_serving(dns_names=["localhost"]))
    if case == "unreadable-key":
        _shut_out(key)
    elif case == "unsearchable-dir":
        _shut_out(tls)  # as a Secret volume mounted for another user
    else:
        key.unlink()
    try:
        result = _mirrorgate(
            "serve",
            "--policy",
            str(policy_file),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--port",
            str(free_port()),
        )
    finally:
        tls.chmod(0o700)  # for pytest's clean-up when not root
    named = cert if case == "unsearchable-dir" else key
    why = "no such file" if case == "missing" else "cannot read: Permission denied"
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"mirrorgate: error: {named}: {why}\n"


def test_an_unreadable_kubeconfig_is_not_called_missing(tmp_path: Path, policy_file: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    _shut_out(kubeconfig)
    result = _mirrorgate("audit", "--policy", str(policy_file), "--kubeconfig", str(kubeconfig))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"mirrorgate: error: kubeconfig {kubeconfig}: cannot read: Permission denied\n"
    )


def test_a_group_readable_key_is_accepted_only_through_a_group_of_ours(tmp_path: Path) -> None:
    """A Secret volume with fsGroup: another owner's key, readable through our group."""
    key_file = tmp_path / "store.key"
    key_file.write_text(filestore.generate_key())
    key_file.chmod(0o440)
    if AS_ROOT:  # the kubelet's layout, mirrored: another owner, our group
        os.chown(key_file, OTHER_USER, os.getegid())
        assert len(filestore.load_key(key_file=str(key_file), environ={})) == 32
        os.chown(key_file, OTHER_USER, OTHER_USER)  # a group that is not ours
    with pytest.raises(StoreError, match="may be read or written by group or others"):
        filestore.load_key(key_file=str(key_file), environ={})  # our own file, or not our group
    key_file.chmod(0o460 if AS_ROOT else 0o660)  # the group may write: refused
    with pytest.raises(StoreError, match=r"\(mode 0[46]60\)"):
        filestore.load_key(key_file=str(key_file), environ={})
