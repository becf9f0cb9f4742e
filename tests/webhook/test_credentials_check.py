"""`mirrorgate credentials check`: the file store and a real provider plugin (Kubernetes: e2e)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mirrorgate.certs import CertificateAuthority
from mirrorgate.webhook import errors
from mirrorgate.webhook.commands.serve import settings, wiring
from mirrorgate.webhook.credentials import filestore
from mirrorgate.webhook.policyfile import boundedyaml
from tests.commands import MIRRORGATE
from tests.e2e.harness.providers import RobotIssuer
from tests.webhook import serving
from tests.webhook.test_credentials import _run

PASSWORD = "p@ss-check-5e1d"
KEYS = ["credential", "source", "registry", "username", "expires"]


@pytest.fixture
def store(tmp_path: Path) -> list[str]:
    """A file store holding team-a, scoped to a path; the options that name it."""
    key_file = tmp_path / "key"
    key_file.write_text(filestore.generate_key())
    key_file.chmod(0o600)
    options = ["--store-file", str(tmp_path / "store.json"), "--key-file", str(key_file)]
    status, _, err = _run(
        [
            "credentials",
            "add",
            "team-a",
            "--registry",
            "harbor.corp.example/team-a",
            "--username",
            "robot$team-a",
            "--password-stdin",
            "--store",
            options[1],
            *options[2:],
        ],
        stdin=PASSWORD + "\n",
    )
    assert status == 0, err
    return options


def test_a_file_store_credential_resolves_without_its_password(store: list[str]) -> None:
    status, out, err = _run(
        ["credentials", "check", "team-a", "--image", "harbor.corp.example/team-a/app:1", *store]
    )
    assert (status, err) == (0, "")
    answer = json.loads(out)
    assert list(answer) == KEYS
    assert answer == {
        "credential": "team-a",
        "source": "file",
        "registry": "harbor.corp.example/team-a",
        "username": "robot$team-a",
        "expires": None,
    }
    assert PASSWORD not in out


@pytest.mark.parametrize(
    ("name", "image", "message"),
    [
        ("team-b", "harbor.corp.example/team-b/app:1", "no credential 'team-b' in"),
        (
            "team-a",
            "harbor.corp.example/team-b/app:1",
            "credential 'team-a' is for harbor.corp.example/team-a, which does not cover image "
            "'harbor.corp.example/team-b/app:1': the kubelet would not send it",
        ),
    ],
)
def test_a_source_without_a_usable_login_exits_1_with_one_line(
    store: list[str], name: str, image: str, message: str
) -> None:
    status, out, err = _run(["credentials", "check", name, "--image", image, *store])
    assert (status, out) == (1, "")
    assert len(err.splitlines()) == 1
    assert err.startswith("mirrorgate: ")
    assert message in err


def _provider_policy(tmp_path: Path, **extra: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        json.dumps(
            {
                "mirrors": [
                    {"source": "quay.io", "mirror": "a.example/team-a", "credential": "team-a"}
                ],
                "credentials": {
                    "team-a": {"namespaces": ["*"], "provider": "test-provider", **extra}
                },
            }
        )
    )
    return path


def test_a_provider_credential_resolves_with_its_expiry(
    issuer: RobotIssuer, tmp_path: Path
) -> None:
    config = issuer.write_config(
        tmp_path / "providers.json",
        issuer.provider("test-provider", "robot-a", args=["--cache-duration", "1h"]),
    )
    status, out, err = _run(
        [
            "credentials",
            "check",
            "team-a",
            "--image",
            "a.example/team-a/app:1",
            "--policy",
            str(_provider_policy(tmp_path, registry="a.example/team-a")),
            "--credential-provider-config",
            str(config),
            "--credential-provider-bin-dir",
            str(issuer.bin_dir),
        ]
    )
    assert (status, err) == (0, "")
    answer = json.loads(out)
    assert list(answer) == KEYS
    assert answer["source"] == "provider"
    assert answer["registry"] == "a.example/team-a"
    assert answer["username"] == "robot-a"
    assert answer["expires"].endswith("Z")
    assert "." not in answer["expires"]  # RFC 3339 to the second


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--fault", "exit"], 1, "plugin 'test-provider' failed with exit status 1"),
        (["--fault", "malformed"], 1, "plugin 'test-provider' did not answer with JSON"),
        # It was an OverflowError traceback.
        (
            ["--cache-duration", "100000000h"],
            1,
            "plugin 'test-provider': cacheDuration "
            "'100000000h' is not a duration from 0 to 2562047h "
            "(such as 12h)",
        ),
    ],
)
def test_a_failing_provider_exits_1(
    issuer: RobotIssuer, tmp_path: Path, args: list[str], status: int, message: str
) -> None:
    config = issuer.write_config(
        tmp_path / "providers.json", issuer.provider("test-provider", "robot-a", args=args)
    )
    result = _run(
        [
            "credentials",
            "check",
            "team-a",
            "--image",
            "a.example/team-a/app:1",
            "--policy",
            str(_provider_policy(tmp_path)),
            "--credential-provider-config",
            str(config),
            "--credential-provider-bin-dir",
            str(issuer.bin_dir),
        ]
    )
    assert result[:2] == (status, "")
    assert result[2] == f"mirrorgate: {message}\n"


def test_configuration_errors_exit_2(tmp_path: Path) -> None:
    policy = _provider_policy(tmp_path)
    status, _, err = _run(
        ["credentials", "check", "team-a", "--image", "a.example/team-a/x", "--policy", str(policy)]
    )
    assert status == 2
    assert err == (
        "mirrorgate: error: credential 'team-a' comes from provider "
        "'test-provider': pass --credential-provider-config and "
        "--credential-provider-socket (or --credential-provider-bin-dir)\n"
    )
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1",
                "kind": "CredentialProviderConfig",
                "providers": [],
            }
        )
    )
    status, _, err = _run(
        [
            "credentials",
            "check",
            "team-a",
            "--image",
            "a.example/team-a/x",
            "--policy",
            str(policy),
            "--credential-provider-config",
            str(bad),
            "--credential-provider-bin-dir",
            str(tmp_path),
        ]
    )
    assert status == 2
    assert "providers: Required value" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            [],
            "credentials.team-a.provider: needs --credential-provider-config and "
            "--credential-provider-socket (or --credential-provider-bin-dir)",
        ),
        (
            ["config"],
            "--credential-provider-config needs --credential-provider-socket (the plugin "
            "host's) or --credential-provider-bin-dir",
        ),
        (
            ["config", "bin", "socket"],
            "--credential-provider-bin-dir and --credential-provider-socket: give one "
            "(plugins run in this container, or in the plugin host)",
        ),
        (
            ["config", "bin"],
            "credentials with a provider need --store kubernetes: the leader "
            "publishes their logins there for every replica",
        ),
        (
            ["other-config", "bin"],
            "mirrors[0].mirror: 'a.example/team-a' (credential 'team-a') "
            "does not match provider 'test-provider''s matchImages "
            "(*.other.example)",
        ),
    ],
)
def test_serve_refuses_a_provider_setup_it_cannot_run(
    issuer: RobotIssuer,
    tmp_path: Path,
    ca: CertificateAuthority,
    store: list[str],
    options: list[str],
    message: str,
) -> None:
    """Before any port opens: one line naming the field or the option."""
    serving.write_pair(tmp_path, ca.issue_serving(dns_names=["localhost"]))
    config = issuer.write_config(
        tmp_path / "providers.json", issuer.provider("test-provider", "robot-a")
    )
    other = issuer.write_config(
        tmp_path / "other.json",
        issuer.provider("test-provider", "robot-a", match_images=["*.other.example"]),
    )
    given = {"config": str(config), "other-config": str(other), "bin": str(issuer.bin_dir)}
    configs = [given[o] for o in options if o.endswith("config")]
    configured = settings.Settings(
        policy=str(_provider_policy(tmp_path)),
        tls_cert=str(tmp_path / "tls.crt"),
        tls_key=str(tmp_path / "tls.key"),
        store="file",
        store_file=store[1],
        store_key_file=store[3],
        credential_provider_config=configs[0] if configs else None,
        credential_provider_bin_dir=given["bin"] if "bin" in options else None,
        credential_provider_socket=str(tmp_path / "host.sock") if "socket" in options else None,
    )
    with pytest.raises(errors.ConfigError) as raised:
        wiring.build(configured)
    assert str(raised.value) == message


def _hostile_config(kind: str) -> str:
    """A CredentialProviderConfig whose YAML would cost without bound to read or quote."""
    head = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n"
    provider = (
        "providers:\n  - name: test-provider\n    matchImages: ['a.example']\n"
        "    apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
    )
    if kind == "nested":  # a RecursionError traceback before
        return head + provider + "    defaultCacheDuration: " + "[" * 100_000 + "]" * 100_000
    # 9**9 strings in 500 bytes; the duration's error quoted it whole, gigabytes, before.
    lines = ["x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, 9)]
    return head + "\n".join(lines) + "\n" + provider + "    defaultCacheDuration: *x8\n"


HOSTILE_REFUSALS = {
    # x5, the eighth line, passes the bound at its third alias (each *x4 holds 66,430).
    "alias-bomb": f":8:25: holds more than {boundedyaml.MAX_VALUES:,} values with its aliases "
    "expanded",
    # libyaml stops at 1,000 levels by itself.
    "nested": ":7:1024: not valid YAML: exceeded maximum nesting depth",
}
MEMORY_CAP = 1 << 30
"""Address space the command may take (the alias bomb took gigabytes before)."""


@pytest.mark.parametrize("kind", sorted(HOSTILE_REFUSALS))
@pytest.mark.parametrize("command", ["credentials check", "serve"])
def test_a_hostile_provider_config_is_refused_in_one_line_within_bounds(
    tmp_path: Path, ca: CertificateAuthority, store: list[str], kind: str, command: str
) -> None:
    """As a policy file is: the file, line and column and the bound passed, exit 2, no
    traceback, under 1 GiB of address space and well inside the time cap."""
    config = tmp_path / "providers.yaml"
    config.write_text(_hostile_config(kind))
    provider_options = [
        "--credential-provider-config",
        str(config),
        "--credential-provider-bin-dir",
        str(tmp_path),
    ]
    policy = str(_provider_policy(tmp_path))
    if command == "serve":
        cert, key = serving.write_pair(tmp_path, ca.issue_serving(dns_names=["localhost"]))
        argv = [
            "serve",
            "--policy",
            policy,
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-health-probes",
            "--store",
            "file",
            *store,
            *provider_options,
        ]
    else:
        argv = [
            "credentials",
            "check",
            "team-a",
            "--image",
            "a.example/team-a/app:1",
            "--policy",
            policy,
            *provider_options,
        ]
    done = subprocess.run(
        ["prlimit", f"--as={MEMORY_CAP}", *MIRRORGATE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"mirrorgate: error: {config}{HOSTILE_REFUSALS[kind]}\n"
