"""The time from a MirrorPolicy change to its first admission, with 1,000 MirrorPolicies.

A real etcd + kube-apiserver on loopback (``tests.e2e.harness.controlplane``), the CRDs
and RBAC of ``manifests/base``, N namespaces (default 1,000) labelled
``mirrorgate.io/mode=enforce``, each holding one MirrorPolicy (its own source and mirror,
no credential), and ``mirrorgate serve`` as the e2e suite starts it (mirrorgate's
ServiceAccount, ``--namespace mirrorgate``, no policy file: the objects are the policy),
registered with manifests/base's webhook configurations. Once every object is
``Accepted``, one MirrorPolicy at a time has its mirror changed (a patch of its spec);
from the patch's answer, dry-run Pods are created in its namespace one after the other
until one comes back with the new mirror. That wait is the figure: the watch event, the
composition of all N objects (after :data:`PolicyObjects.SETTLE`), the reference swap,
and one admission. Sequential, one change at a time; the p99 of R rounds is the largest.

    python -m bench.policy_objects_bench [--namespaces N] [--rounds R]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from kubernetes import client as k8s

from bench import results
from mirrorgate import policy
from tests.e2e.harness import controlplane
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import built_binary
from tests.e2e.harness.kube import create_namespace, create_pod

GROUP, VERSION = policy.API_VERSION.split("/")
ENFORCE = {"mirrorgate.io/mode": "enforce"}


def _team_policy(namespace: str, mirror: str) -> dict[str, Any]:
    return {
        "apiVersion": policy.API_VERSION,
        "kind": "MirrorPolicy",
        "metadata": {"name": "rules", "namespace": namespace},
        "spec": {"mirrors": [{"source": f"{namespace}.bench.example", "mirror": mirror}]},
    }


def _image(api: k8s.ApiClient, namespace: str) -> str:
    pod = {
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "a", "image": f"{namespace}.bench.example/app:1"}]},
    }
    created, _ = create_pod(api, namespace, pod, dry_run=True)
    found: str = created["spec"]["containers"][0]["image"]
    return found


def _accepted(api: k8s.ApiClient) -> int:
    listed: Any = k8s.CustomObjectsApi(api).list_cluster_custom_object(
        GROUP, VERSION, "mirrorpolicies"
    )
    return sum(
        1
        for item in listed["items"]
        for c in (item.get("status") or {}).get("conditions", [])
        if c["type"] == "Accepted" and c["status"] == "True"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    kustomize = built_binary("kustomize")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="mirrorgate-bench-objects-"))
    began = time.monotonic()
    plane = controlplane.start_control_plane(workdir / "controlplane")
    server = None
    waits: list[float] = []
    try:
        with plane.api_client() as api:
            mg.install_base(api, kustomize)
            custom = k8s.CustomObjectsApi(api)
            names = [f"team-{i:04d}" for i in range(args.namespaces)]
            for name in names:
                create_namespace(api, name, ENFORCE)
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, name, "mirrorpolicies", _team_policy(name, f"m.example/{name}")
                )
            made = time.monotonic()
            server = mg.start_mirrorgate(workdir, plane, policy=None)
            for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                mg.register(api, mg.webhook_configuration(kustomize, kind), server)
            started = time.monotonic()
            while _accepted(api) < args.namespaces:
                if time.monotonic() - started > 600:
                    raise SystemExit("the MirrorPolicies were not all Accepted within 600 s")
                time.sleep(1.0)
            all_accepted = time.monotonic() - started
            for round_ in range(args.rounds):
                namespace = names[(round_ * 37) % len(names)]
                mirror = f"m.example/{namespace}-v{round_}"
                patch = {
                    "spec": {
                        "mirrors": [{"source": f"{namespace}.bench.example", "mirror": mirror}]
                    }
                }
                changed = time.monotonic()
                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, "mirrorpolicies", "rules", patch
                )
                while not _image(api, namespace).startswith(f"{mirror}/"):
                    if time.monotonic() - changed > 60:
                        raise SystemExit(f"{namespace}: the change never reached admission")
                waits.append(time.monotonic() - changed)
    finally:
        if server is not None:
            server.stop()
        plane.stop()
    ordered = sorted(waits)
    with results.capture("policy-objects", command="python -m bench.policy_objects_bench"):
        print(
            f"MirrorPolicy change to its first admission, {args.namespaces:,} MirrorPolicies "
            f"in as many namespaces, {args.rounds} changes one at a time (dry-run Pods "
            "through the real API server):"
        )
        print(
            f"  median {statistics.median(ordered) * 1000:.0f} ms, "
            f"p90 {ordered[int(len(ordered) * 0.9) - 1] * 1000:.0f} ms, "
            f"max {ordered[-1] * 1000:.0f} ms"
        )
        print(
            f"  start-up: all {args.namespaces:,} Accepted {all_accepted:.1f} s after the "
            f"server started ({made - began:.0f} s to create them); "
            f"run {time.monotonic() - began:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
