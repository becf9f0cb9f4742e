"""The upgrade from the previous release (issue 33, item 4): 0.1.0's chart and image,
from a `git archive` of its commit (tests/e2e/harness/previous.py), installed on the node
as its users had it (no CRDs); Pods admitted; then, as docs/upgrading.md says, the CRDs
applied (without them `helm upgrade` refuses, changing nothing) and `helm upgrade` to
this tree's chart and image, with 0.1.0's policy carried over, under the availability load.

Counted by the API server's own metrics, as the availability test counts: no call
failed open, none was rejected, and every Pod created through the upgrade is stored
rewritten. The pull-secret copy 0.1.0 made, and the record of a Pod it admitted,
survive, and the policy keeps working. Printed under "e2e figures" as
`upgrade 0.1.0 -> <version>: N Pods, fail-open F, rejected J, unrewritten U`.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from mirrorgate import policy
from tests.e2e.harness import apiload, previous
from tests.e2e.harness import helm as h
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS, as_dict, read_secret
from tests.e2e.harness.incluster import REPOSITORY, ROLLOUT_TIMEOUT, TAG, Release, replicas
from tests.e2e.harness.kube import create_namespace, create_pod, namespace_name
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.rollout import deployment_done, held, held_load, old_replicas_stopped
from tests.e2e.harness.suite import CREDENTIAL, GRANTED_PREFIX

# `upgrade`: `make test-versions` runs it on each node version, `make test` leaves it out.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.node,
    pytest.mark.image,
    pytest.mark.installed,
    pytest.mark.upgrade,
]

SECRET = policy.pull_secret_name(CREDENTIAL)
CRDS = ("clustermirrorpolicies.mirrorgate.io", "mirrorpolicies.mirrorgate.io")
# What a running release made for itself (not the chart): a user upgrading from 0.1.0
# has only what 0.1.0 made. The suite's own release left these; 0.1.0 starts without.
MADE_BY_A_LATER_RELEASE = {
    "secrets": ("mirrorgate-tls", "mirrorgate-ca", "mirrorgate-fingerprint-key"),
    "config_maps": ("mirrorgate-ca", "mirrorgate-policy-accepted"),
}


def working_tree_version() -> str:
    """pyproject.toml's version with the commit as its local part (0.1.0+6b7a454)."""
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    return f"{version}+{commit}"


def _crds_left(api: k8s.ApiClient) -> str | None:
    names = {
        c.metadata.name
        for c in k8s.ApiextensionsV1Api(api).list_custom_resource_definition().items
        if c.metadata and c.metadata.name
    }
    left = sorted(names & set(CRDS))
    return f"CRDs still there: {left}" if left else None


def _crds_established(api: k8s.ApiClient) -> str | None:
    crds = k8s.ApiextensionsV1Api(api)
    for name in CRDS:
        status = crds.read_custom_resource_definition(name).status
        conditions = (status.conditions if status else None) or []
        if not any(c.type == "Established" and c.status == "True" for c in conditions):
            return f"{name} not established"
    return None


def apply_crds_as_the_notes_say(release: Release, api: k8s.ApiClient) -> None:
    """docs/upgrading.md, from 0.1.0: `helm show crds CHART | kubectl apply --server-side
    --force-conflicts -f -`, the apply made through the API as kubectl makes it."""
    shown = h.run(release.helm, "show", "crds", str(h.CHART), home=release.home).stdout
    crds = k8s.ApiextensionsV1Api(api)
    for crd in (doc for doc in yaml.safe_load_all(shown) if doc):
        crds.patch_custom_resource_definition(
            crd["metadata"]["name"],
            crd,
            field_manager="kubectl",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
    _wait(lambda: _crds_established(api), "the CRDs established")


def _no_replicas(api: k8s.ApiClient) -> str | None:
    left = [str(p.metadata.name) for p in replicas(api, terminating=True) if p.metadata]
    return f"replicas still running: {left}" if left else None


def _as_0_1_0_found_it(api: k8s.ApiClient) -> None:
    """The namespace as a user of 0.1.0 has it: without what later releases made.

    Only once the suite's own replicas are gone, not merely deleted: `helm uninstall
    --wait` returns when the Deployment is, while its Pods still run their preStop
    pause, and a replica that sees its CA Secret deleted writes a new one. 0.1.0 would
    then make a CA of its own beside that stray one, and the upgrade's first replica,
    finding the stray one in `mirrorgate-ca`, would put it in caBundle while 0.1.0's
    replicas still serve certificates of theirs: every call to them fails open."""
    _wait(lambda: _no_replicas(api), "the suite's replicas stopped")
    # 0.1.0 had no CRDs: the suite's install left them (Helm never deletes crds/).
    crds = k8s.ApiextensionsV1Api(api)
    for name in CRDS:
        with contextlib.suppress(k8s.ApiException):
            crds.delete_custom_resource_definition(name)
    _wait(lambda: _crds_left(api), "the CRDs gone")
    core = k8s.CoreV1Api(api)
    for name in MADE_BY_A_LATER_RELEASE["secrets"]:
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespaced_secret(name, mg.NAMESPACE)
    for name in MADE_BY_A_LATER_RELEASE["config_maps"]:
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespaced_config_map(name, mg.NAMESPACE)


def _wait(done: Callable[[], str | None], what: str) -> None:
    wait_until(done, timeout=ROLLOUT_TIMEOUT, what=what, interval=0.5)


# klog's warning for each call failed open on: `W1202 03:08:00.123456 ... failing open NAME: ERROR`.
FAILING_OPEN = re.compile(
    r"^\w(\d{4} [\d:.]+) .*Failed calling webhook, failing open "
    rf"{re.escape(mg.ENFORCE_WEBHOOK)}: (.*)$",
    re.MULTILINE,
)


def fail_open_reasons(log: Path, offset: int) -> dict[str, list[str]]:
    """What the API server logged for each call it failed open on since ``offset`` of
    its log: each error once, with the times it was logged at (the metric counts them,
    the log says why)."""
    with log.open("rb") as stream:
        stream.seek(offset)
        text = stream.read().decode(errors="replace")
    reasons: dict[str, list[str]] = {}
    for at, error in FAILING_OPEN.findall(text):
        # The Pod's own name and the connection's port differ call by call.
        reasons.setdefault(re.sub(r":\d+->|/pods/[^/\s]+", "", error), []).append(at)
    return reasons


def test_upgrade_from_0_1_0_under_load(
    node_installed: Release, e2e_figures: dict[str, str], tmp_path: Path
) -> None:
    node = node_installed.node
    registry = node.registry
    tree = previous.checkout(tmp_path)
    old_image = f"{previous.push_image(tree, node)}:{previous.TAG}"
    new_image = f"{registry.upstream_host}/{REPOSITORY}:{TAG}"
    old_values = previous.values(old_image.rsplit(":", 1)[0], node)
    values_file = tmp_path / "values-0.1.0.yaml"
    values_file.write_text(json.dumps(old_values, indent=2))
    image = f"{registry.upstream_host}/node/upgrade:1"  # never pulled: the Pods are held
    mirrored = f"{registry.host}/node/upgrade:1"
    version = working_tree_version()
    with node.control_plane.api_client() as api, node_installed.set_aside():
        try:
            _as_0_1_0_found_it(api)
            node_installed.run_helm(
                "install",
                "mirrorgate",
                str(tree / "manifests" / "helm" / "mirrorgate"),
                "--take-ownership",
                "-f",
                str(values_file),
            )
            previous.route_to_api(api, node_installed.relay_port)
            _wait(lambda: deployment_done(api, old_image), "0.1.0 rolled out")

            # Admitted by 0.1.0: its copy of the credential, and the Pod's record.
            early = create_namespace(
                api, f"{GRANTED_PREFIX}{namespace_name('upgrade-early')}", ENFORCE_LABELS
            )
            first, _ = create_pod(api, early, held("first", image))
            copy_before = read_secret(api, early, SECRET)

            # This tree's chart, with the values the suite installs it with, and 0.1.0's
            # policy as it was: the policy must keep working as written.
            upgrade = (
                "upgrade",
                "mirrorgate",
                str(h.CHART),
                "-f",
                str(node_installed.values),
                "--set-json",
                f"policy={json.dumps(old_values['policy'])}",
                "--force-conflicts",
            )
            # `helm upgrade` installs no crds/: without them it refuses, changing nothing.
            refused = h.run(
                node_installed.helm,
                *upgrade,
                "--namespace",
                mg.NAMESPACE,
                home=node_installed.home,
                kubeconfig=node.control_plane.kubeconfig,
                check=False,
            )
            unchanged = deployment_done(api, old_image)
            apply_crds_as_the_notes_say(node_installed, api)

            load = held_load(api, node, "upgrade", image, minimum_s=20.0)
            api_log = node.control_plane.workdir / "kube-apiserver.log"
            log_offset = api_log.stat().st_size
            before = apiload.api_server_samples(api)
            with load.running():
                load.wait_created(100)  # five seconds' worth at 20/s before the upgrade
                started = time.monotonic()
                node_installed.run_helm(*upgrade)
                _wait(lambda: deployment_done(api, new_image), "the upgrade rolled out")
                # Until every 0.1.0 replica has ended: it answers during its preStop pause.
                _wait(lambda: old_replicas_stopped(api, new_image), "0.1.0's replicas stopped")
                upgraded_s = time.monotonic() - started
            after = apiload.api_server_samples(api)
            reasons = fail_open_reasons(api_log, log_offset)
            core = k8s.CoreV1Api(api)
            stored = {
                str(p.metadata.name): p.spec.containers[0].image
                for p in core.list_namespaced_pod(load.namespace).items
                if p.metadata and p.spec
            }
            core.delete_namespace(load.namespace)

            copy_after = read_secret(api, early, SECRET)
            first_after = as_dict(api, core.read_namespaced_pod("first", early))
            second, _ = create_pod(api, early, held("second", image))
        finally:
            node_installed.uninstall()
    counts = apiload.WebhookCounts.between(before, after, mg.ENFORCE_WEBHOOK)
    failed = [o for o in load.outcomes if o.error is not None]
    unrewritten = sorted(name for name, found in stored.items() if found != mirrored)
    e2e_figures[f"upgrade {previous.VERSION} -> {version}"] = (
        f"{len(load.outcomes)} Pods, fail-open {counts.fail_open}, "
        f"rejected {counts.rejected}, unrewritten {len(unrewritten)}"
    )
    e2e_figures["upgrade from 0.1.0, rollout"] = f"{upgraded_s:.1f} s"
    # Without the CRDs first, as the upgrade notes say, the upgrade is refused whole.
    assert refused.returncode != 0
    assert 'no matches for kind "ClusterMirrorPolicy"' in refused.stderr, refused.stderr
    assert unchanged is None  # 0.1.0 still serving, rolled out
    # 0.1.0 admitted the early Pod: rewritten, with its copy of the credential.
    assert first["spec"]["containers"][0]["image"] == mirrored
    assert first["spec"]["imagePullSecrets"] == [{"name": SECRET}]
    assert copy_before is not None
    # Through the upgrade: nothing failed open, nothing refused, every Pod rewritten.
    assert load.elapsed_s >= 20.0
    assert failed == []
    assert len(stored) == len(load.outcomes)
    assert counts.admissions == len(load.outcomes)
    assert (counts.fail_open, counts.rejected, len(unrewritten)) == (0, 0, 0), {
        error: f"{len(at)} calls, {at[0]} to {at[-1]}" for error, at in reasons.items()
    }
    # The copy survives: the same object (the kubelet knows it by its uid), the same login.
    assert copy_after is not None
    assert copy_after["metadata"]["uid"] == copy_before["metadata"]["uid"]
    assert copy_after["data"] == copy_before["data"]
    # The record 0.1.0 wrote is the Pod's still.
    annotation = policy.ORIGINAL_IMAGES_ANNOTATION
    assert (
        first_after["metadata"]["annotations"][annotation]
        == (first["metadata"]["annotations"][annotation])
    )
    assert json.loads(first_after["metadata"]["annotations"][annotation]) == {"containers/c": image}
    # 0.1.0's policy keeps working under this version: a new Pod there is rewritten.
    assert second["spec"]["containers"][0]["image"] == mirrored
    assert second["spec"]["imagePullSecrets"] == [{"name": SECRET}]
