"""Secretless pulls on a real node (issue 31): the kubelet gets the mirror login for the Pod's
ServiceAccount, and no namespace holds it.

One shared install for the module (tests/e2e/harness/secretless.py): the suite's
release upgraded with `kubeletPlugin.enabled=true`, the plugin put on the node by
the chart's DaemonSet, the kubelet restarted with the CredentialProviderConfig
entry the NOTES print (and `imagePullCredentialsVerificationPolicy:
AlwaysVerify`), a mirror of the module's own whose only login is the credential
`secretless-robot` (`delivery: kubelet`, granted to `sl-granted-*`). All of it is
undone after the module.

The mirror is distribution with htpasswd: its log has an `authorized request`
line for each request its one user's current password let in, and its access
log the status of every request; `containerd/` is the node's user agent.
"""

from __future__ import annotations

import json
import re
import secrets
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from tests.e2e.harness import kubeletcreds as kc
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness import nodepods
from tests.e2e.harness.components import TIMINGS
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.incluster import Release
from tests.e2e.harness.kube import create_namespace, create_pod
from tests.e2e.harness.node import NODE_NAME
from tests.e2e.harness.nodepods import Workload
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.secretless import (
    CACHE_DURATION,
    CREDENTIAL,
    DAEMONSET,
    GRANTED,
    PLUGIN,
    Secretless,
    client_pem,
    secretless_release,
    wait_plugin_installed,
)
from tests.e2e.harness.suite import central_credential

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.node,
    pytest.mark.installed,
    pytest.mark.image,
    pytest.mark.secretless,
]

OTHER = "sl-other-"
"""The prefix of enforced namespaces the credential is not granted to."""
LOGINS = "mirrorgate_kubelet_credential_logins_total"
REFUSALS = "mirrorgate_kubelet_credential_refusals_total"
NODE_AGENT = nodepods.CONTAINERD
NONE_SENT = "invalid authorization credential"
WRONG_SENT = "authentication failure"


@pytest.fixture(scope="module")
def secretless(
    node_installed: Release,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Secretless]:
    started = time.monotonic()
    with secretless_release(node_installed, tmp_path_factory.mktemp("secretless")) as found:
        request.config.stash.setdefault(TIMINGS, {})["secretless_setup_s"] = (
            time.monotonic() - started
        )
        yield found


def _namespace(api: k8s.ApiClient, prefix: str) -> str:
    return create_namespace(api, f"{prefix}{secrets.token_hex(3)}", ENFORCE_LABELS)


def _service_account(api: k8s.ApiClient, namespace: str, name: str) -> str:
    k8s.CoreV1Api(api).create_namespaced_service_account(
        namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name))
    )
    return name


def _pod(
    api: k8s.ApiClient, namespace: str, name: str, image: str, service_account: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    return create_pod(
        api,
        namespace,
        nodepods.pod(name, [nodepods.container("app", image)], service_account=service_account),
    )


def _node_requests(s: Secretless, workload: Workload) -> list[int]:
    """The statuses the mirror gave the node's requests for ``workload``'s manifest."""
    path = s.manifest_path(workload)
    return [
        a.status for a in s.mirror.access_log() if a.path == path and a.agent.startswith(NODE_AGENT)
    ]


def _authorized(s: Secretless, workload: Workload) -> list[int]:
    """The statuses of the node's requests for ``workload``'s manifest that the mirror's
    login check let in."""
    path = s.manifest_path(workload)
    return [
        a.status for a in s.mirror.authorized() if a.path == path and a.agent.startswith(NODE_AGENT)
    ]


def _refused(s: Secretless, workload: Workload) -> set[str]:
    """Why the mirror's login check refused requests for ``workload``'s manifest:
    distribution's "invalid authorization credential" is none sent at all, "authentication
    failure" a wrong one."""
    path = s.manifest_path(workload)
    reasons = {why.rsplit(": ", 1)[-1] for uri, why in s.mirror.refused() if uri == path}
    return reasons


def _wait_event(api: k8s.ApiClient, namespace: str, name: str, needle: str) -> list[str]:
    """The Pod's events once one of them holds ``needle``."""
    found: list[list[str]] = [[]]

    def seen() -> str | None:
        found[0] = nodepods.events(api, namespace, name)
        return None if any(needle in e for e in found[0]) else f"events {found[0]}"

    wait_until(
        seen, timeout=60, what=f"an event of {namespace}/{name} with {needle!r}", interval=0.3
    )
    return found[0]


def test_a_granted_namespace_pulls_through_the_kubelet_with_no_secret_anywhere(
    secretless: Secretless,
) -> None:
    s = secretless
    workload = s.workload(f"granted-{secrets.token_hex(3)}")
    with s.node.control_plane.api_client() as api:
        namespace = _namespace(api, GRANTED)
        logins = s.counted(LOGINS)
        stored, warnings = _pod(api, namespace, "web", s.source_image(workload))
        nodepods.wait_running(api, namespace, "web")
        printed = nodepods.log(api, namespace, "web")
        core = k8s.CoreV1Api(api)
        in_namespace = [
            str(x.metadata.name) for x in core.list_namespaced_secret(namespace).items if x.metadata
        ]
        copies = core.list_secret_for_all_namespaces(
            field_selector=f"metadata.name=mirrorgate-{CREDENTIAL}"
        ).items
    assert stored["spec"]["containers"][0]["image"] == s.mirror_image(workload)
    assert not stored["spec"].get("imagePullSecrets")
    assert stored["spec"]["serviceAccountName"] == "default"
    assert warnings == []
    assert workload.greeting in printed
    assert [n for n in in_namespace if n.startswith("mirrorgate-")] == []
    assert copies == []
    # The node's pull carried the login: the mirror let it in, and served it.
    assert 200 in _authorized(s, workload)
    assert s.counted(LOGINS) >= logins + 1


def test_a_namespace_not_granted_gets_no_login_and_the_mirror_answers_401(
    secretless: Secretless,
) -> None:
    """The mirror's image named directly (the only way to it from a namespace the rule
    does not grant): the kubelet asks, mirrorgate refuses, containerd pulls without a
    login and the mirror refuses it."""
    s = secretless
    workload = s.workload(f"other-{secrets.token_hex(3)}")
    image = s.mirror_image(workload)
    with s.node.control_plane.api_client() as api:
        namespace = _namespace(api, OTHER)
        refused = s.counted(REFUSALS, reason="not-granted")
        logged_before = s.kubelet_log.stat().st_size
        stored, _ = _pod(api, namespace, "web", image)
        message = nodepods.wait_pull_failure(api, namespace, "web", "app")
        events = _wait_event(api, namespace, "web", "ErrImagePull")
    assert stored["spec"]["containers"][0]["image"] == image
    assert not stored["spec"].get("imagePullSecrets")
    assert nodepods.NO_CREDENTIAL in message, message
    assert any(e.startswith("Failed: Failed to pull image") and image in e for e in events), events
    assert set(_node_requests(s, workload)) == {401}
    assert _refused(s, workload) == {NONE_SENT}
    assert _authorized(s, workload) == []
    assert s.counted(REFUSALS, reason="not-granted") >= refused + 1
    # mirrorgate's reason reaches the kubelet's log (the plugin's one line), not the events.
    said = f'(HTTP 403, "not-granted"): credential {CREDENTIAL!r}'
    assert any(said in line for line in _kubelet_said(s, logged_before)), said
    assert not any("not-granted" in e for e in events), events


def _kubelet_said(s: Secretless, offset: int) -> list[str]:
    """The lines of the kubelet's log from ``offset`` on."""
    with s.kubelet_log.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace").splitlines()


def _tenant_role(api: k8s.ApiClient, namespace: str, user: str) -> None:
    """What a tenant of ``namespace`` may do there: run Pods of its own ServiceAccounts and
    mint their tokens (TokenRequest), nothing of mirrorgate's."""
    rbac = k8s.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        {  # type: ignore[arg-type]
            "metadata": {"name": "tenant"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "serviceaccounts"], "verbs": ["*"]},
                {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {  # type: ignore[arg-type]
            "metadata": {"name": "tenant"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


def test_a_token_a_tenant_mints_for_its_own_pod_gets_no_login(
    secretless: Secretless, tmp_path: Path
) -> None:
    """The tenant's token is the real thing: its own ServiceAccount, mirrorgate's audience,
    bound to its own Pod running on this node. Sent to the endpoint from the host with
    the tenant's own client certificate (of the cluster CA), or with none, it gets nothing;
    only the node's kubelet certificate turns it into a login."""
    s = secretless
    plane = s.node.control_plane
    workload = s.workload(f"tenant-{secrets.token_hex(3)}")
    image = s.mirror_image(workload)
    user = f"tenant-{secrets.token_hex(3)}"
    audience = s.provider["tokenAttributes"]["serviceAccountTokenAudience"]
    with plane.api_client() as api:
        namespace = _namespace(api, GRANTED)
        _tenant_role(api, namespace, user)
    with plane.api_client(user, ("tenants",)) as own:
        _service_account(own, namespace, "app")
        _pod(own, namespace, "own", s.source_image(workload), "app")
        running = nodepods.wait_running(own, namespace, "own")
        assert running["spec"]["nodeName"] == NODE_NAME
        answer = k8s.CoreV1Api(own).create_namespaced_service_account_token(
            "app",
            namespace,
            {  # type: ignore[arg-type]
                "spec": {
                    "audiences": [audience],
                    "expirationSeconds": 600,
                    "boundObjectRef": {
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "name": "own",
                        "uid": running["metadata"]["uid"],
                    },
                }
            },
        )
    assert answer.status is not None
    token = str(answer.status.token)
    tenant_pem = client_pem(plane.kubeconfig_for(user, ["tenants"]), tmp_path / "tenant.pem")
    not_a_node = s.counted(REFUSALS, reason="not-a-node")

    with_own_certificate = s.plugin(tenant_pem, token, image)
    context = ssl.create_default_context(cafile=str(s.bin_dir / "mirrorgate-ca.crt"))
    url = next(a.removeprefix("--url=") for a in s.provider["args"] if a.startswith("--url="))
    with pytest.raises(httpx.HTTPError):  # no client certificate: no handshake, nothing read
        httpx.post(url, content=kc.credential_request(image, token), verify=context, timeout=10)
    refused = s.counted(REFUSALS, reason="not-a-node")
    # The same token from the node's kubelet: the token was good, the caller was not.
    from_the_kubelet = s.plugin(s.client_pem, token, image)

    password = s.mirror.password
    assert password
    assert with_own_certificate.returncode == 1
    assert with_own_certificate.stdout == ""
    assert "not-a-node" in with_own_certificate.stderr
    assert password not in with_own_certificate.stderr
    assert refused == not_a_node + 1
    assert from_the_kubelet.returncode == 0, from_the_kubelet.stderr
    logins = json.loads(from_the_kubelet.stdout)["auth"]
    assert [v["username"] for v in logins.values()] == [s.mirror.username]
    logged = json.dumps(s.release.log_entries())
    assert token not in logged
    assert password not in logged


def test_always_verify_a_cached_image_is_verified_for_each_service_account(
    secretless: Secretless,
) -> None:
    """KEP-2535 with AlwaysVerify: the image one ServiceAccount pulled is on the node; a
    second Pod of that ServiceAccount runs it as it is, a ServiceAccount of another granted
    namespace runs it after a pull with its own login, and one of a namespace not granted
    cannot run it."""
    s = secretless
    workload = s.workload(f"verify-{secrets.token_hex(3)}")
    image = s.mirror_image(workload)
    with s.node.control_plane.api_client() as api:
        config = s.node.kubelet_configz()
        first_ns, second_ns = _namespace(api, GRANTED), _namespace(api, GRANTED)
        stranger_ns = _namespace(api, OTHER)
        _service_account(api, first_ns, "first")
        _pod(api, first_ns, "pull", s.source_image(workload), "first")
        nodepods.wait_running(api, first_ns, "pull")
        after_first = len(_authorized(s, workload))
        _pod(api, first_ns, "again", s.source_image(workload), "first")
        nodepods.wait_running(api, first_ns, "again")
        again = _wait_event(api, first_ns, "again", "Pulled: ")
        after_again = len(_authorized(s, workload))
        _service_account(api, second_ns, "second")
        _pod(api, second_ns, "verified", s.source_image(workload), "second")
        nodepods.wait_running(api, second_ns, "verified")
        verified = _wait_event(api, second_ns, "verified", "Pulled: ")
        after_second = _authorized(s, workload)
        cached = s.node.ctr("images", "list", "--quiet").split()
        node_requests = len(_node_requests(s, workload))
        _service_account(api, stranger_ns, "stranger")
        _pod(api, stranger_ns, "refused", image, "stranger")
        message = nodepods.wait_pull_failure(api, stranger_ns, "refused", "app")
        refused = _wait_event(api, stranger_ns, "refused", "ErrImagePull")
    assert config["imagePullCredentialsVerificationPolicy"] == "AlwaysVerify"
    assert config["featureGates"]["KubeletEnsureSecretPulledImages"] is True
    assert after_first >= 1
    assert after_again == after_first
    assert any("already present on machine and can be accessed by the pod" in e for e in again)
    assert not any(e.startswith("Pulling: ") for e in again), again
    assert any(e.startswith("Pulling: ") for e in verified), verified
    assert any(e.startswith("Pulled: Successfully pulled image") for e in verified), verified
    assert after_second[after_again:], "no pull verified the second account's login"
    assert set(after_second[after_again:]) == {200}
    assert image in cached
    assert nodepods.NO_CREDENTIAL in message, message
    assert any(e.startswith("Pulling: ") for e in refused), refused
    assert _refused(s, workload) == {NONE_SENT}
    assert set(_node_requests(s, workload)[node_requests:]) == {401}


def _pull_outcome(api: k8s.ApiClient, namespace: str, name: str) -> str | None:
    """Wait until the Pod runs (None) or its pull fails (the kubelet's message)."""
    outcome: list[str | None] = []

    def settled() -> str | None:
        stored = nodepods.read(api, namespace, name)
        for status in stored.get("status", {}).get("containerStatuses", []):
            state = status.get("state", {})
            if "running" in state:
                outcome.append(None)
                return None
            waiting = state.get("waiting") or {}
            if waiting.get("reason") in nodepods.PULL_FAILED:
                outcome.append(str(waiting.get("message", "")))
                return None
        return nodepods.describe(stored)

    wait_until(settled, timeout=60, what=f"{namespace}/{name} running or failed", interval=0.2)
    return outcome[-1]


def test_a_rotated_login_reaches_new_service_accounts_at_once_and_old_ones_within_the_cache(
    secretless: Secretless, e2e_figures: dict[str, str]
) -> None:
    s = secretless
    tag = secrets.token_hex(3)
    warm, fresh, later = (s.workload(f"{kind}-{tag}") for kind in ("warm", "fresh", "later"))
    new_password = secrets.token_urlsafe(18)
    with s.node.control_plane.api_client() as api:
        namespace = _namespace(api, GRANTED)
        _service_account(api, namespace, "steady")
        _service_account(api, namespace, "fresh")
        filled = time.monotonic()  # the kubelet caches the steady account's login at its pull
        _pod(api, namespace, "warm", s.source_image(warm), "steady")
        nodepods.wait_running(api, namespace, "warm")
        # The central login changes; the mirror refuses the old one from now on.
        s.mirror.set_password(new_password)
        central_credential(
            api,
            s.node.registry,
            name=CREDENTIAL,
            host=s.mirror.host,
            username=s.mirror.username,
            password=new_password,
        )
        rotated = time.monotonic()
        _pod(api, namespace, "fresh", s.source_image(fresh), "fresh")
        nodepods.wait_running(api, namespace, "fresh")
        new_account_s = time.monotonic() - rotated
        failures: list[str] = []
        core = k8s.CoreV1Api(api)
        for attempt in range(200):
            name = f"later-{attempt}"
            _pod(api, namespace, name, s.source_image(later), "steady")
            message = _pull_outcome(api, namespace, name)
            if message is None:
                break
            failures.append(message)
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            assert time.monotonic() - rotated < CACHE_DURATION + 60, failures[-1]
        existing_account_s = time.monotonic() - rotated
        since_fill_s = time.monotonic() - filled
    e2e_figures["secretless rotation, new ServiceAccount"] = f"{new_account_s:.1f} s"
    e2e_figures["secretless rotation, existing ServiceAccount"] = (
        f"{existing_account_s:.1f} s after the change, {since_fill_s:.1f} s after its "
        f"login was cached (cacheDuration {CACHE_DURATION} s, {len(failures)} refused pulls)"
    )
    assert 200 in _authorized(s, fresh)
    # The old login, kept by the kubelet for the steady account, is refused until it ages out.
    assert failures, "the first Pod after the change pulled: no cached login was used"
    # containerd asks without a login first, then with the one the kubelet gave it.
    assert WRONG_SENT in _refused(s, later), failures
    assert CACHE_DURATION - 1 <= since_fill_s <= CACHE_DURATION + 15
    assert 200 in _authorized(s, later)
    assert new_account_s < CACHE_DURATION


def test_without_the_plugin_on_the_node_the_pull_fails_and_the_pods_events_say_why(
    secretless: Secretless,
) -> None:
    """The DaemonSet moved off the node and its binary removed, as when the plugin is
    missing: the kubelet runs no plugin (its log says so) and mirrorgate is not asked; the
    Pod's events name the mirror's refusal for want of a login. Restored after, and a
    Pod pulls again."""
    s = secretless
    workload = s.workload(f"gone-{secrets.token_hex(3)}")
    with s.node.control_plane.api_client() as api:
        apps = k8s.AppsV1Api(api)
        namespace = _namespace(api, GRANTED)
        selector = apps.read_namespaced_daemon_set(
            DAEMONSET, mg.NAMESPACE
        ).spec.template.spec.node_selector  # type: ignore[union-attr]
        path = "/spec/template/spec/nodeSelector"
        apps.patch_namespaced_daemon_set(
            DAEMONSET,
            mg.NAMESPACE,
            [{"op": "replace", "path": path, "value": {"mirrorgate.io/e2e": "nowhere"}}],
        )
        try:
            _wait_no_plugin_pods(api)
            (s.bin_dir / PLUGIN).unlink()
            asked = s.counted(LOGINS) + s.counted(REFUSALS)
            logged_before = s.kubelet_log.stat().st_size
            _pod(api, namespace, "web", s.source_image(workload))
            message = nodepods.wait_pull_failure(api, namespace, "web", "app")
            events = _wait_event(api, namespace, "web", "ErrImagePull")
            not_asked = s.counted(LOGINS) + s.counted(REFUSALS)
        finally:
            apps.patch_namespaced_daemon_set(
                DAEMONSET, mg.NAMESPACE, [{"op": "replace", "path": path, "value": selector}]
            )
            wait_plugin_installed(s.bin_dir)
        restored = s.workload(f"back-{secrets.token_hex(3)}")
        _pod(api, namespace, "back", s.source_image(restored))
        nodepods.wait_running(api, namespace, "back")
    since = _kubelet_said(s, logged_before)
    # klog writes the error on the line after the message.
    failed = [
        f"{line} {since[n + 1] if n + 1 < len(since) else ''}"
        for n, line in enumerate(since)
        if "Failed to provide credentials for image" in line
    ]
    assert failed, "the kubelet logged no failed credential provider"
    assert re.search(rf"{PLUGIN}.*no such file or directory", failed[0]), failed[0]
    assert not_asked == asked
    failure = [e for e in events if e.startswith("Failed: Failed to pull image")]
    assert failure, events
    assert s.mirror_image(workload) in failure[0]
    assert nodepods.NO_CREDENTIAL in failure[0], failure[0]
    assert nodepods.NO_CREDENTIAL in message, message
    assert _refused(s, workload) == {NONE_SENT}
    assert _authorized(s, workload) == []


def _wait_no_plugin_pods(api: k8s.ApiClient) -> None:
    """Until no Pod of the DaemonSet is left (its Pods' name label is its name)."""
    core = k8s.CoreV1Api(api)

    def gone() -> str | None:
        pods = core.list_namespaced_pod(
            mg.NAMESPACE, label_selector=f"app.kubernetes.io/name={DAEMONSET}"
        ).items
        return None if not pods else f"{len(pods)} plugin Pods"

    wait_until(gone, timeout=60, what="the DaemonSet's Pod gone from the node", interval=0.3)
