"""serve with its plugins in a `mirrorgate plugin-host` of their own, on the real API server.

The scenario of test_credential_providers (two project robots, 15-second logins
from the real Go test plugin, a mirrorgate of its own that is the leader), but
serve runs no plugin itself: it asks the plugin host over its socket
(`--credential-provider-socket`). The host's environment holds what a Pod's
containers hold and no plugin may see (the API server's address, a store
key); the plugin (`--report`) says in each run what it was given, and serve
logs that, redacted, as it logs any plugin's stderr.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.e2e.harness import provider_setup as ps
from tests.e2e.harness.fixtures_secrets import log_entries, wait_log
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import Installed

pytestmark = pytest.mark.e2e

PRIVATE = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "MIRRORGATE_STORE_KEY": "c3RvcmUta2V5LW5vdC1mb3ItcGx1Z2lucw==",
}


@pytest.fixture(scope="module")
def setup(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ps.Setup]:
    with ps.provider_setup(
        installed,
        tmp_path_factory.mktemp("plugin-host"),
        host_env=PRIVATE,
        plugin_args=["--report"],
    ) as found:
        yield found


def test_serve_publishes_the_logins_the_host_minted_and_the_plugins_see_no_identity(
    setup: ps.Setup,
) -> None:
    assert setup.plugin_host is not None
    with setup.installed.control_plane.api_client() as api:
        published = {
            t: ps.password_of(ps.wait_published(api, setup.own_namespace, t)) for t in ps.TEAMS
        }
        for team in ps.TEAMS:
            assert setup.issuer.server.passwords.valid(setup.robots[team], published[team])
        pod, warnings = ps.create_pod(
            api, setup.namespace, [f"{ps.source(t)}/{ps.REPOSITORY}:{ps.TAG}" for t in ps.TEAMS]
        )
    assert warnings == []
    assert [c["image"] for c in pod["spec"]["containers"]] == [setup.mirrored(t) for t in ps.TEAMS]
    assert [s["name"] for s in pod["spec"]["imagePullSecrets"]] == [
        f"mirrorgate-{t}" for t in ps.TEAMS
    ]

    def reports() -> list[str]:
        return [
            e["stderr"]
            for e in log_entries(setup.server.logs())
            if e.get("msg") == "credential provider said"
        ]

    # Each published login was a run; its line is flushed within a second.
    wait_until(
        lambda: None if len(reports()) >= len(ps.TEAMS) else f"{len(reports())} reports",
        timeout=10,
        what="a report of each plugin's run",
    )
    for said in reports():
        match = re.search(r"report: env=(\S*) token=(\S+)", said)
        assert match, said
        names = set(match.group(1).split(","))
        assert not names & set(PRIVATE), said
        assert not [n for n in names if n.startswith("KUBERNETES_")], said
        assert {"TOKEN_URL", "ROBOT", "ROBOT_SECRET", "CA_FILE", "PATH"} <= names, said
    # The host ran them, and logged that it did, never what they wrote.
    host_log = setup.plugin_host.log_text()
    assert host_log.count('"plugin host: ran a plugin"') >= len(ps.TEAMS)
    for password in published.values():
        assert password not in host_log
        assert password not in setup.server.logs()


def test_a_stopped_plugin_host_is_named_and_the_last_login_stays(setup: ps.Setup) -> None:
    assert setup.plugin_host is not None
    with setup.installed.control_plane.api_client() as api:
        last = ps.wait_published(api, setup.own_namespace, "team-a")
        setup.plugin_host.stop()
        failed = wait_log(
            setup.server, "credential refresh failed", timeout=3 * ps.TTL, credential="team-a"
        )
        assert re.fullmatch(
            r"the plugin host's socket '.*/plugins\.sock' does not exist: is the plugin-host "
            r"container running \(mirrorgate plugin-host --socket PATH\)\?",
            failed["reason"],
        ), failed
        kept = ps.published_login(api, setup.own_namespace, "team-a")
    assert kept is not None
    assert ps.password_of(kept) == ps.password_of(last)
    assert failed["kept_until"] == kept["metadata"]["annotations"]["mirrorgate.io/expires"]
