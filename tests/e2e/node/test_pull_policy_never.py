"""A locally imported image with ``imagePullPolicy: Never`` starts under enforce (issue 32).

The kind and minikube way to run an image built on the laptop: ``kind load``
(here ``ctr -n k8s.io images import``, what it does on the node) and a
container that never pulls. mirrorgate in enforce, with a catch-all rule that
covers the image's registry, leaves that container as written, so the kubelet
finds the image on the node and starts it; the same image under
``IfNotPresent`` is rewritten (the rule does cover it), and the server counts
the one it left (``reason="pull-policy-never"``).
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness import nodepods
from tests.e2e.harness.fixtures_secrets import (
    metric,
    metrics_text,
    register_for_suite,
    suite_namespace,
)
from tests.e2e.harness.kube import create_namespace, create_pod
from tests.e2e.harness.node import Node
from tests.e2e.harness.oci import OciImage, sha256_digest
from tests.e2e.harness.testimages import workload_image

pytestmark = [pytest.mark.e2e, pytest.mark.node]

MIRROR = "mirror.never.example/cache"


def oci_archive(image: OciImage, name: str, path: Path) -> Path:
    """``image`` as an OCI image-layout tarball that ``ctr images import`` names ``name``."""
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": image.media_type,
                "digest": image.digest,
                "size": len(image.manifest),
                "annotations": {"io.containerd.image.name": name},
            }
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
        f"blobs/sha256/{image.digest.removeprefix('sha256:')}": image.manifest,
    }
    for digest, blob in image.blobs.items():
        assert sha256_digest(blob) == digest
        entries[f"blobs/sha256/{digest.removeprefix('sha256:')}"] = blob
    with tarfile.open(path, "w") as tar:
        for member, data in entries.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def enforced(
    node_cluster: Node, kustomize: Path, tmp_path: Path
) -> Iterator[tuple[mg.Mirrorgate, str]]:
    """A mirrorgate of this test (its Lease in a namespace of its own), in enforce, for a
    namespace of its own: every registry goes to a mirror (``source: "*"``)."""
    with contextlib.ExitStack() as stop, node_cluster.control_plane.api_client() as api:
        own = create_namespace(api, f"mg-never-{secrets.token_hex(3)}")
        # Not the chart's identity (this test installs no release): what it can write is
        # not the question here, what it leaves as written is. Where an earlier module
        # installed the release, its reserved-prefix policy must let this one make its own
        # mirrorgate-* Secrets too, as a second installation's operator would.
        try:
            mg.allow_reserved_names(api, "e2e-never-admin")
        except k8s.ApiException as missing:
            if missing.status != 404:
                raise
        server = mg.start_mirrorgate(
            tmp_path / "mirrorgate",
            node_cluster.control_plane,
            policy=f'mirrors:\n  - source: "*"\n    mirror: {MIRROR}\n',
            user="e2e-never-admin",
            groups=("system:masters",),
            args=["--namespace", own],
        )
        stop.callback(server.stop)
        suite = f"never-{secrets.token_hex(4)}"
        name = f"mirrorgate-e2e-{suite}"
        register_for_suite(api, mg.webhook_configuration(kustomize), server, name=name, suite=suite)
        stop.callback(mg.unregister, api, name)
        yield server, suite_namespace(api, "never", suite)


def test_a_locally_imported_image_with_pull_policy_never_starts_under_enforce(
    node_cluster: Node, enforced: tuple[mg.Mirrorgate, str], tmp_path: Path
) -> None:
    server, namespace = enforced
    greeting = f"hello from a local build {secrets.token_hex(4)}"
    local = f"docker.io/library/mg-local-{secrets.token_hex(3)}:dev"
    archive = oci_archive(workload_image(greeting), local, tmp_path / "local.tar")
    node_cluster.ctr("images", "import", str(archive))
    try:
        with node_cluster.control_plane.api_client() as api:
            stored, warnings = create_pod(
                api,
                namespace,
                nodepods.pod("local", [nodepods.container("app", local, pull_policy="Never")]),
            )
            nodepods.wait_running(api, namespace, "local")
            printed = nodepods.log(api, namespace, "local")
            pulled, _ = create_pod(
                api,
                namespace,
                nodepods.pod("pulled", [nodepods.container("app", local)]),
                dry_run=True,
            )
            counted = metric(
                metrics_text(server),
                "mirrorgate_images_left_unmirrored_total",
                reason="pull-policy-never",
            )
    finally:
        node_cluster.ctr("images", "remove", local)
    assert stored["spec"]["containers"][0]["image"] == local
    assert not stored["spec"].get("imagePullSecrets")
    assert warnings == []
    assert greeting in printed
    # The rule covers the image: only the pull policy kept it as written.
    assert pulled["spec"]["containers"][0]["image"] == f"{MIRROR}/{local}"
    assert counted == 1.0
