"""The policy as objects, in force on the real API server: the session's mirrorgate watches
ClusterMirrorPolicy and MirrorPolicy, composes them with its policy file (the deprecated
ConfigMap policy), judges each write at apply time (policies.mirrorgate.io) and, as the
leader, writes each object's status.

Cluster-scoped objects are seen by every test of the session: each test's sources and
credentials are its own, and what it makes it deletes.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from mirrorgate import policy
from tests.commands import MIRRORGATE
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS, metric, metrics_text
from tests.e2e.harness.kube import create_pod, run_kubectl
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import CREDENTIAL, Installed, MakeNamespace, central_credential

pytestmark = pytest.mark.e2e

GROUP, VERSION = policy.API_VERSION.split("/")


def mirror_host() -> str:
    """A mirror of a test's own: mirror paths may not nest, and the session's policy file
    holds the test registry's whole host (the rewrites are checked, nothing is pulled)."""
    return f"m-{secrets.token_hex(3)}.mirrors.e2e.example"


def _custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def cluster_policy(api: k8s.ApiClient, name: str, spec: dict[str, Any]) -> Any:
    body: dict[str, Any] = {"apiVersion": policy.API_VERSION, "kind": "ClusterMirrorPolicy"}
    body |= {"metadata": {"name": name}, "spec": spec}
    created: Any = _custom(api).create_cluster_custom_object(
        GROUP, VERSION, "clustermirrorpolicies", body
    )
    return created


def team_policy(api: k8s.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> Any:
    body: dict[str, Any] = {"apiVersion": policy.API_VERSION, "kind": "MirrorPolicy"}
    body |= {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    created: Any = _custom(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "mirrorpolicies", body
    )
    return created


def _delete_cluster_policy(api: k8s.ApiClient, name: str) -> None:
    try:
        _custom(api).delete_cluster_custom_object(GROUP, VERSION, "clustermirrorpolicies", name)
    except k8s.ApiException as error:
        if error.status != 404:
            raise


def refusal(call: Any, *args: Any) -> str:
    """The API server's message for a write the policy webhook refused."""
    with pytest.raises(k8s.ApiException) as caught:
        call(*args)
    assert caught.value.status in (400, 403, 422), caught.value.body
    body = str(caught.value.body)
    assert 'admission webhook \\"policies.mirrorgate.io\\" denied the request' in body, body
    return body


def accepted(
    api: k8s.ApiClient, namespace: str | None, name: str
) -> tuple[str, str, str, int] | None:
    """The object's Accepted condition (status, reason, message, observedGeneration), once
    the leader wrote one for its current generation; None before."""
    custom = _custom(api)
    found: Any = (
        custom.get_cluster_custom_object(GROUP, VERSION, "clustermirrorpolicies", name)
        if namespace is None
        else custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "mirrorpolicies", name)
    )
    status = found.get("status") or {}
    if status.get("observedGeneration") != found["metadata"]["generation"]:
        return None
    (condition,) = [c for c in status.get("conditions", []) if c["type"] == "Accepted"]
    return (
        condition["status"],
        condition["reason"],
        condition["message"],
        status["observedGeneration"],
    )


def wait_accepted(
    api: k8s.ApiClient, namespace: str | None, name: str, want: str
) -> tuple[str, str, str, int]:
    def check() -> str | None:
        found = accepted(api, namespace, name)
        return None if found is not None and found[0] == want else f"status {found}"

    wait_until(check, timeout=20, what=f"{namespace}/{name} Accepted={want}")
    found = accepted(api, namespace, name)
    assert found is not None
    return found


def kubectl_get(kubectl: Path, installed: Installed, *args: str) -> dict[tuple[str, str], Any]:
    """`kubectl get ARGS` as the admin: each row's cells by column, keyed by (namespace,
    name). The columns are read where the header puts them: a cell may be empty."""
    output = run_kubectl(kubectl, installed.control_plane.kubeconfig, "get", *args)
    header, *lines = output.splitlines()
    found = list(re.finditer(r"\S+", header))
    names, starts = [m.group() for m in found], [m.start() for m in found]
    rows = {}
    for line in lines:
        cells = {
            n: line[a:b].strip()
            for n, a, b in zip(names, starts, [*starts[1:], len(line)], strict=True)
        }
        rows[(cells.get("NAMESPACE", ""), cells["NAME"])] = cells
    return rows


def _pod(image: str) -> dict[str, Any]:
    name = f"p-{secrets.token_hex(3)}"
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "a", "image": image}]}}


def image_of(api: k8s.ApiClient, namespace: str, image: str) -> str:
    created, _ = create_pod(api, namespace, _pod(image), dry_run=True)
    found: str = created["spec"]["containers"][0]["image"]
    return found


@pytest.fixture
def teams(installed: Installed, make_namespace: MakeNamespace) -> Iterator[tuple[str, str]]:
    """Two enforced namespaces, team a's and team b's; their MirrorPolicies are deleted
    afterwards (with no object stored, the session's server serves its file alone again,
    under the file's own version, as the other modules expect)."""
    made = make_namespace(ENFORCE_LABELS), make_namespace(ENFORCE_LABELS)
    yield made
    with installed.control_plane.api_client() as api:
        for namespace in made:
            _custom(api).delete_collection_namespaced_custom_object(
                GROUP, VERSION, namespace, "mirrorpolicies"
            )


def test_a_teams_rule_applies_to_its_pods_only_and_its_status_says_accepted(
    installed: Installed, teams: tuple[str, str], kubectl: Path
) -> None:
    """A MirrorPolicy in team a's namespace rewrites team a's Pods through its rule (with the
    credential the cluster grants it); team b's Pods are left as written. The leader marks
    it Accepted, and `kubectl get mirrorpolicies -A` (the Table the printer columns make)
    shows it."""
    team_a, team_b = teams
    host = mirror_host()
    source = f"team-{secrets.token_hex(3)}.e2e.example"
    with installed.control_plane.api_client() as api:
        team_policy(
            api,
            team_a,
            "rules",
            {"mirrors": [{"source": source, "mirror": f"{host}/team-a", "credential": CREDENTIAL}]},
        )
        status, reason, _, generation = wait_accepted(api, team_a, "rules", "True")
        assert (status, reason, generation) == ("True", "Accepted", 1)
        assert image_of(api, team_a, f"{source}/app:1") == f"{host}/team-a/app:1"
        assert image_of(api, team_b, f"{source}/app:1") == f"{source}/app:1"
        # The cluster's rules still apply in team a's namespace beside its own.
        upstream = installed.registry.upstream_image
        assert image_of(api, team_a, upstream) == installed.registry.mirror_image
        method, url, headers, body, _ = api.param_serialize(
            "GET",
            f"/apis/{policy.API_VERSION}/mirrorpolicies",
            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
            auth_settings=["BearerToken"],
        )
        answer = api.call_api(method, url, header_params=headers, body=body)
        answer.read()
        table = json.loads(answer.data)
        columns = [c["name"] for c in table["columnDefinitions"]]
        (row,) = [r for r in table["rows"] if r["object"]["metadata"]["namespace"] == team_a]
        shown = dict(zip(columns, row["cells"], strict=True))
        assert shown["Accepted"] == "True", shown
    # The real client prints the same columns.
    listed = kubectl_get(kubectl, installed, "mirrorpolicies", "-A")
    assert listed[(team_a, "rules")]["ACCEPTED"] == "True", listed
    assert listed[(team_a, "rules")]["REASON"] == "Accepted", listed


def test_a_credential_not_granted_to_the_namespace_is_refused_at_apply_saying_why(
    installed: Installed, teams: tuple[str, str]
) -> None:
    """A MirrorPolicy naming a credential the cluster grants only to another namespace is
    refused by the API server, the message naming the credential and the reason; nothing
    is stored."""
    team_a, team_b = teams
    suffix = secrets.token_hex(3)
    robot = f"e2e-robot-{suffix}"
    with installed.control_plane.api_client() as api:
        central_credential(api, installed.registry, name=robot)
        cluster_policy(
            api, f"e2e-grants-{suffix}", {"credentials": {robot: {"namespaces": [team_b]}}}
        )
        try:
            wait_accepted(api, None, f"e2e-grants-{suffix}", "True")
            spec = {
                "mirrors": [
                    {
                        "source": f"a-{suffix}.e2e.example",
                        "mirror": f"{mirror_host()}/a-{suffix}",
                        "credential": robot,
                    }
                ]
            }
            message = refusal(team_policy, api, team_a, "borrowed", spec)
            assert "NotGranted" in message, message
            assert robot in message, message
            assert "Traceback" not in message
            assert "internal error" not in message
            with pytest.raises(k8s.ApiException) as absent:
                _custom(api).get_namespaced_custom_object(
                    GROUP, VERSION, team_a, "mirrorpolicies", "borrowed"
                )
            assert absent.value.status == 404
            # The namespace it is granted to may.
            team_policy(api, team_b, "own", spec)
            wait_accepted(api, team_b, "own", "True")
        finally:
            _delete_cluster_policy(api, f"e2e-grants-{suffix}")


def test_a_revoked_grant_turns_the_team_policy_not_accepted_and_its_rules_stop(
    installed: Installed, teams: tuple[str, str], kubectl: Path
) -> None:
    """The cluster policy stops granting team b's robot to team b: the MirrorPolicy that uses
    it turns Accepted=False with the reason, and team b's Pods are no longer rewritten by
    its rule; granted again, it applies again."""
    _, team_b = teams
    suffix = secrets.token_hex(3)
    robot, grants = f"e2e-robot-{suffix}", f"e2e-grants-{suffix}"
    source = f"b-{suffix}.e2e.example"
    host = mirror_host()
    with installed.control_plane.api_client() as api:
        central_credential(api, installed.registry, name=robot)
        custom = _custom(api)
        cluster_policy(api, grants, {"credentials": {robot: {"namespaces": [team_b]}}})
        try:
            wait_accepted(api, None, grants, "True")
            rule = {"source": source, "mirror": f"{host}/b-{suffix}", "credential": robot}
            team_policy(api, team_b, "robot", {"mirrors": [rule]})
            wait_accepted(api, team_b, "robot", "True")
            assert image_of(api, team_b, f"{source}/app:1") == f"{host}/b-{suffix}/app:1"

            def grant(namespaces: list[str]) -> None:
                custom.patch_cluster_custom_object(
                    GROUP,
                    VERSION,
                    "clustermirrorpolicies",
                    grants,
                    {"spec": {"credentials": {robot: {"namespaces": namespaces}}}},
                )

            grant(["e2e-nobody"])
            _, reason, message, _ = wait_accepted(api, team_b, "robot", "False")
            assert reason == "NotGranted", message
            assert robot in message, message
            assert image_of(api, team_b, f"{source}/app:1") == f"{source}/app:1"
            shown = kubectl_get(kubectl, installed, "mirrorpolicies", "-A")[(team_b, "robot")]
            assert (shown["ACCEPTED"], shown["REASON"]) == ("False", "NotGranted"), shown
            grant([team_b])
            wait_accepted(api, team_b, "robot", "True")
            assert image_of(api, team_b, f"{source}/app:1") == f"{host}/b-{suffix}/app:1"
        finally:
            _delete_cluster_policy(api, grants)


def test_on_not_granted_next_falls_through_to_the_broader_rule_and_explain_shows_it(
    installed: Installed, teams: tuple[str, str], tmp_path: Path
) -> None:
    """A narrower rule whose robot only team a is granted says `onNotGranted: next`: team
    a's Pod takes it, team b's falls through to the broader rule, without a warning (under
    `skip` it would be left as written). `mirrorgate explain` of the object as the API
    server stores it walks the same chain and names the rule it passed over, and why."""
    team_a, team_b = teams
    suffix = secrets.token_hex(3)
    robot, name = f"e2e-robot-{suffix}", f"e2e-next-{suffix}"
    source, host = f"next-{suffix}.e2e.example", mirror_host()
    image = f"{source}/team-a/app:1"
    narrower = {
        "source": f"{source}/team-a",
        "mirror": f"{host}/team-a",
        "credential": robot,
        "onNotGranted": "next",
    }
    spec = {
        "mirrors": [narrower, {"source": source, "mirror": f"{host}/all"}],
        "credentials": {robot: {"namespaces": [team_a]}},
    }
    with installed.control_plane.api_client() as api:
        # The robot logs in to the rule's mirror host, or it would count as misconfigured.
        central_credential(api, installed.registry, name=robot, host=host)
        cluster_policy(api, name, spec)
        try:
            wait_accepted(api, None, name, "True")
            assert image_of(api, team_a, image) == f"{host}/team-a/app:1"
            created, warnings = create_pod(api, team_b, _pod(image), dry_run=True)
            assert created["spec"]["containers"][0]["image"] == f"{host}/all/team-a/app:1"
            assert not [w for w in warnings if "not granted" in w], warnings
            stored = _custom(api).get_cluster_custom_object(
                GROUP, VERSION, "clustermirrorpolicies", name
            )
        finally:
            _delete_cluster_policy(api, name)
    objects = tmp_path / "objects.yaml"
    objects.write_text(yaml.safe_dump(stored))

    def explain(namespace: str) -> Any:
        command = ["explain", "--policy", str(objects), "-n", namespace, image]
        done = subprocess.run(
            [*MIRRORGATE, *command], capture_output=True, text=True, timeout=60, check=True
        )
        return json.loads(done.stdout)

    passed = explain(team_b)
    rule = f"ClusterMirrorPolicy {name} spec.mirrors[0]"
    assert (passed["outcome"], passed["result"]) == ("rewrite", f"{host}/all/team-a/app:1")
    assert passed["chain"] == [
        {
            "rule": rule,
            "source": f"{source}/team-a",
            "reason": f"credential {robot!r} of {rule} is not granted to namespace {team_b!r}",
        }
    ]
    taken = explain(team_a)
    assert (taken["result"], taken["credential"], taken["chain"]) == (
        f"{host}/team-a/app:1",
        robot,
        [],
    )


def test_a_fixed_rule_cannot_be_overridden_and_the_message_says_why(
    installed: Installed, teams: tuple[str, str]
) -> None:
    team_a, _ = teams
    suffix = secrets.token_hex(3)
    source, host = f"fixed-{suffix}.e2e.example", mirror_host()
    name = f"e2e-fixed-{suffix}"
    with installed.control_plane.api_client() as api:
        cluster_policy(
            api,
            name,
            {"mirrors": [{"source": source, "mirror": f"{host}/fixed-{suffix}", "fixed": True}]},
        )
        try:
            wait_accepted(api, None, name, "True")
            spec = {"mirrors": [{"source": source, "mirror": f"{host}/mine-{suffix}"}]}
            message = refusal(team_policy, api, team_a, "override", spec)
            assert "FixedRule" in message, message
            assert source in message, message
            assert image_of(api, team_a, f"{source}/app:1") == f"{host}/fixed-{suffix}/app:1"
        finally:
            _delete_cluster_policy(api, name)


def test_the_migrated_configmap_policy_takes_over_with_no_gap(
    installed: Installed, make_namespace: MakeNamespace
) -> None:
    """The upgrade path: the server serves its policy file (the ConfigMap policy: deprecated,
    said in the log and the metrics), `policy migrate` of that file is applied as a
    ClusterMirrorPolicy, and every Pod is rewritten the same all along: the file yields to
    the object, which is Accepted; deleted again, the file is back in force."""
    namespace = make_namespace(ENFORCE_LABELS)
    upstream, mirrored = installed.registry.upstream_image, installed.registry.mirror_image
    server = installed.server
    name = f"e2e-migrated-{secrets.token_hex(3)}"
    command = ["policy", "migrate", str(server.policy_path), "--name", name]
    migrated = subprocess.run(
        [*MIRRORGATE, *command], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    body = yaml.safe_load(migrated)
    assert body["kind"] == "ClusterMirrorPolicy"
    assert "policy file served beside the policy objects: deprecated" in server.logs()
    assert metric(metrics_text(server), "mirrorgate_policy_configmap_in_use") == 1
    seen: list[str] = []
    with installed.control_plane.api_client() as api:
        create_pod(api, namespace, _pod(upstream))  # its pull secret, for the dry runs
        seen.append(image_of(api, namespace, upstream))
        _custom(api).create_cluster_custom_object(GROUP, VERSION, "clustermirrorpolicies", body)
        try:
            while accepted(api, None, name) is None:  # the switch, Pod after Pod
                seen.append(image_of(api, namespace, upstream))
            assert (accepted(api, None, name) or ())[:2] == ("True", "Accepted")
            seen.append(image_of(api, namespace, upstream))
            wait_until(
                lambda: None if "the policy file yields" in server.logs() else "not yet",
                timeout=10,
                what="the file yielding to the object",
            )
            served = metrics_text(server)
            assert metric(served, "mirrorgate_policy_objects", kind="ClusterMirrorPolicy") >= 1
        finally:
            _delete_cluster_policy(api, name)
        wait_until(
            lambda: None if image_of(api, namespace, upstream) == mirrored else "not rewritten",
            timeout=10,
            what="the file back in force",
        )
        seen.append(image_of(api, namespace, upstream))
    assert len(seen) >= 3, seen
    assert set(seen) == {mirrored}, seen
