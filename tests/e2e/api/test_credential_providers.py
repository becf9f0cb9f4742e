"""Path-scoped credentials and short-lived logins from a real provider plugin, on the real API.

The registry's token server has two robots, each allowed to pull only its own
project (`team-a/...`, `team-b/...`) on one registry host, with passwords that
live 15 s. A mirrorgate server of this module's own (its own namespace, so
that it holds its own Lease and is the leader that refreshes) gets their
logins from the real Go test plugin, configured with the kubelet's
CredentialProviderConfig. Pods in one namespace use both projects; each pull
secret is keyed by its project's path; each robot pulls its own project and
not the other's (checked with the registry client: the node harness adds the
kubelet's own pull separately). Pods keep being admitted with working logins
across several refreshes, and a plugin that fails, hangs or answers garbage
leaves the last good login in place until it expires, after which
onCredentialError decides (skip, then deny).
"""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.commands import MIRRORGATE
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.dockerconfig import credentials_for
from tests.e2e.harness.fixtures_secrets import (
    entries_with,
    metric,
    metrics_text,
    read_secret,
    rewrite_policy,
    secret_config,
    wait_log,
)
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.provider_setup import (
    REPOSITORY,
    TAG,
    TEAMS,
    TTL,
    Setup,
    create_pod,
    password_of,
    provider_setup,
    published_login,
    source,
    wait_published,
)
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.registry_client import RegistryClient, RegistryHTTPError
from tests.e2e.harness.suite import Installed

pytestmark = pytest.mark.e2e

NGINX = "docker.io/library/nginx:1.27"


def _push_projects(registry: RegistryStack) -> None:
    upstream = RegistryClient(
        registry.upstream_host,
        ca_file=str(registry.ca_path),
        credentials=credentials_for(
            {
                "auths": {
                    registry.upstream_host: {
                        "username": registry.upstream_username,
                        "password": registry.upstream_password,
                    }
                }
            },
            registry.upstream_host,
        ),
    )
    with upstream as client:
        for team in TEAMS:
            assert client.push(f"{team}/{REPOSITORY}", TAG, registry.image) == registry.digest


@pytest.fixture(scope="module")
def setup(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    _push_projects(installed.registry)
    with provider_setup(installed, tmp_path_factory.mktemp("providers")) as found:
        yield found


def pull_secrets_config(api: k8s.ApiClient, pod: Mapping[str, Any]) -> dict[str, Any]:
    """The union of the Pod's pull secrets' auths, as the kubelet's keyring sees them."""
    auths: dict[str, Any] = {}
    for ref in pod["spec"].get("imagePullSecrets") or []:
        secret = read_secret(api, pod["metadata"]["namespace"], ref["name"])
        assert secret is not None, ref
        auths.update(secret_config(secret)["auths"])
    return {"auths": auths}


def test_two_projects_on_one_host_each_pull_only_their_own_across_refreshes(setup: Setup) -> None:
    registry = setup.registry
    up = registry.upstream_host
    seen: dict[str, list[str]] = {t: [] for t in TEAMS}
    with setup.installed.control_plane.api_client() as api:
        for team in TEAMS:
            wait_published(api, setup.own_namespace, team)
        for _ in range(3):
            published = {t: password_of(wait_published(api, setup.own_namespace, t)) for t in TEAMS}
            pod, warnings = create_pod(
                api, setup.namespace, [f"{source(t)}/{REPOSITORY}:{TAG}" for t in TEAMS]
            )
            assert warnings == []
            assert [c["image"] for c in pod["spec"]["containers"]] == [
                setup.mirrored(t) for t in TEAMS
            ]
            assert [s["name"] for s in pod["spec"]["imagePullSecrets"]] == [
                f"mirrorgate-{t}" for t in TEAMS
            ]
            config = pull_secrets_config(api, pod)
            assert sorted(config["auths"]) == [f"{up}/{t}" for t in TEAMS]
            for team in TEAMS:
                # The kubelet's choice: the most specific key covering the image.
                assert registry.pull(setup.mirrored(team), config) == registry.digest
                login = credentials_for(config, up, f"{team}/{REPOSITORY}")
                assert login is not None
                assert login.username == setup.robots[team]
                seen[team].append(login.password)
                other = TEAMS[1 - TEAMS.index(team)]
                with (
                    RegistryClient(up, ca_file=str(registry.ca_path), credentials=login) as robot,
                    pytest.raises(RegistryHTTPError) as refused,
                ):
                    robot.pull(f"{other}/{REPOSITORY}", TAG)
                assert refused.value.status in (401, 403)
            for team in TEAMS:
                wait_published(api, setup.own_namespace, team, not_password=published[team])
    for team in TEAMS:
        assert len(set(seen[team])) == 3, f"{team}: the same login in two rounds"
    text = metrics_text(setup.server)
    for team in TEAMS:
        assert (
            metric(
                text, "mirrorgate_credential_refreshes_total", credential=team, outcome="refreshed"
            )
            >= 3
        )
        assert (
            metric(text, "mirrorgate_credential_expiry_timestamp_seconds", credential=team)
            > time.time()
        )
    logs = setup.server.logs()
    for password in (*seen["team-a"], *seen["team-b"]):
        assert password not in logs
        assert password not in text


def test_a_failing_plugin_keeps_the_last_login_until_it_expires_then_skip_and_deny(
    setup: Setup,
) -> None:
    server = setup.server
    images = [f"{source(t)}/{REPOSITORY}:{TAG}" for t in TEAMS]
    fault = setup.fault_files["team-b"]
    with setup.installed.control_plane.api_client() as api:
        last = wait_published(api, setup.own_namespace, "team-b")
        fault.write_text("exit")
        failed = wait_log(server, "credential refresh failed", timeout=3 * TTL, credential="team-b")
        assert failed["reason"] == "plugin 'team-b-provider' failed with exit status 1"
        kept = published_login(api, setup.own_namespace, "team-b")
        assert kept is not None
        assert password_of(kept) == password_of(last)  # the last good login stays
        assert failed["kept_until"] == kept["metadata"]["annotations"]["mirrorgate.io/expires"]
        for why, reason in (
            ("hang", "plugin 'team-b-provider' did not answer within 2 s and was killed"),
            ("malformed", "plugin 'team-b-provider' did not answer with JSON"),
        ):
            fault.write_text(why)
            wait_log(
                server,
                "credential refresh failed",
                timeout=3 * TTL,
                credential="team-b",
                reason=reason,
            )
        expiry = datetime.datetime.fromisoformat(failed["kept_until"]).timestamp()
        wait_until(
            lambda: None if time.time() > expiry + 0.5 else "not expired",
            timeout=3 * TTL,
            what="the kept login to expire",
            interval=0.5,
        )
        expired = published_login(api, setup.own_namespace, "team-b")
        assert expired is not None
        assert password_of(expired) == password_of(last)  # still there, but never attached now

        pod, warnings = create_pod(api, setup.namespace, images)
        assert [c["image"] for c in pod["spec"]["containers"]] == [
            setup.mirrored("team-a"),
            images[1],
        ]
        assert [s["name"] for s in pod["spec"]["imagePullSecrets"]] == ["mirrorgate-team-a"]
        assert len(warnings) == 1
        assert warnings[0].startswith(
            f"containers/extra0: image '{images[1]}' left as "
            "written: pull secret 'mirrorgate-team-b' is unavailable: "
            "credential 'team-b' expired at "
        )

        rewrite_policy(server, setup.policy.replace('"skip"', '"deny"'))
        try:
            with pytest.raises(k8s.ApiException) as denied:
                create_pod(api, setup.namespace, images)
            assert denied.value.status == 403
            assert "credential 'team-b' expired at" in str(denied.value.body)
        finally:
            rewrite_policy(server, setup.policy)
            fault.unlink()
        wait_published(api, setup.own_namespace, "team-b", not_password=password_of(last))
        pod, warnings = create_pod(api, setup.namespace, images)
        assert warnings == []
        assert [c["image"] for c in pod["spec"]["containers"]] == [setup.mirrored(t) for t in TEAMS]
    text = metrics_text(server)
    assert (
        metric(text, "mirrorgate_credential_refreshes_total", credential="team-b", outcome="failed")
        >= 3
    )
    assert entries_with(server, "credential refreshed", credential="team-b")


def _store_secret(
    api: k8s.ApiClient, namespace: str, name: str, key: str, username: str, password: str
) -> None:
    """What `kubectl create secret docker-registry NAME --docker-server=KEY ...` makes."""
    payload = json.dumps({"auths": {key: {"username": username, "password": password}}})
    body: Any = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": name, "namespace": namespace},
        "data": {".dockerconfigjson": base64.b64encode(payload.encode()).decode()},
    }
    k8s.CoreV1Api(api).create_namespaced_secret(namespace, body)


def _check(setup: Setup, *args: str) -> subprocess.CompletedProcess[str]:
    """`mirrorgate credentials check` as a real process, with mirrorgate's own identity."""
    kubeconfig = setup.installed.control_plane.kubeconfig_for(
        *mg.service_account(setup.own_namespace)
    )
    return subprocess.run(
        [
            *MIRRORGATE,
            "credentials",
            "check",
            *args,
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            setup.own_namespace,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        check=False,
    )


def test_store_entries_keyed_by_project_path_and_credentials_check(setup: Setup) -> None:
    """Static store Secrets whose keys carry the project path: the store's key scopes them."""
    registry, server = setup.registry, setup.server
    up = registry.upstream_host
    passwords = {t: setup.issuer.server.passwords.mint(setup.robots[t], 3600) for t in TEAMS}
    static = json.dumps(
        {
            "mirrors": [
                {
                    "source": f"static-{t}.e2e.example",
                    "mirror": f"{up}/{t}",
                    "credential": f"static-{t}",
                }
                for t in TEAMS
            ],
            "credentials": {f"static-{t}": {"namespaces": ["*"]} for t in TEAMS},
        }
    )
    with setup.installed.control_plane.api_client() as api:
        for team in TEAMS:
            _store_secret(
                api,
                setup.own_namespace,
                f"static-{team}",
                f"{up}/{team}",
                setup.robots[team],
                passwords[team],
            )
        checked = _check(setup, "static-team-a", "--image", setup.mirrored("team-a"))
        wrong = _check(setup, "static-team-a", "--image", setup.mirrored("team-b"))
        provider = _check(
            setup,
            "team-b",
            "--image",
            setup.mirrored("team-b"),
            "--policy",
            str(server.policy_path),
            "--credential-provider-config",
            str(setup.issuer.bin_dir.parent / "credential-providers.json"),
            "--credential-provider-bin-dir",
            str(setup.issuer.bin_dir),
        )
        missing = _check(setup, "nobody", "--image", setup.mirrored("team-a"))
        rewrite_policy(server, static)
        try:
            pod, warnings = create_pod(
                api, setup.namespace, [f"static-{t}.e2e.example/{REPOSITORY}:{TAG}" for t in TEAMS]
            )
            # Read before the policy goes back: then the copies are cleaned up.
            config = pull_secrets_config(api, pod)
        finally:
            rewrite_policy(server, setup.policy)
        assert warnings == []
        assert [c["image"] for c in pod["spec"]["containers"]] == [setup.mirrored(t) for t in TEAMS]
    assert sorted(config["auths"]) == [f"{up}/{t}" for t in TEAMS]
    for team in TEAMS:
        assert registry.pull(setup.mirrored(team), config) == registry.digest
        own = credentials_for(config, up, f"{team}/{REPOSITORY}")
        assert own is not None
        assert own.password == passwords[team]
        other = TEAMS[1 - TEAMS.index(team)]
        with (
            RegistryClient(up, ca_file=str(registry.ca_path), credentials=own) as robot,
            pytest.raises(RegistryHTTPError),
        ):
            robot.pull(f"{other}/{REPOSITORY}", TAG)

    assert (checked.returncode, checked.stderr) == (0, "")
    assert json.loads(checked.stdout) == {
        "credential": "static-team-a",
        "source": "kubernetes",
        "registry": f"{up}/team-a",
        "username": setup.robots["team-a"],
        "expires": None,
    }
    assert wrong.returncode == 1
    assert wrong.stderr.strip() == (
        f"mirrorgate: credential 'static-team-a' is for {up}/team-a, which does not cover "
        f"image '{setup.mirrored('team-b')}': the kubelet would not send it"
    )
    assert (provider.returncode, provider.stderr) == (0, "")
    resolved = json.loads(provider.stdout)
    assert (resolved["source"], resolved["registry"], resolved["username"]) == (
        "provider",
        f"{up}/team-b",
        setup.robots["team-b"],
    )
    assert resolved["expires"].endswith("Z")
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        == f"mirrorgate: no Secret {setup.own_namespace}/nobody in the credential store"
    )
    for result in (checked, wrong, provider, missing):
        for password in passwords.values():
            assert password not in result.stdout + result.stderr
