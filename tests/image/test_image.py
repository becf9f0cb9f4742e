"""The real image, built with podman and run as the Deployment runs it: read-only
root filesystem, non-root user (the `image` marker; part of `make test`)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import tomllib
import uuid
from pathlib import Path

import httpx
import pytest
from packaging.utils import canonicalize_name

from release.lock import locked_in_image
from tests.e2e.harness.procs import free_port
from tests.image.podman import REPO_ROOT, RUN_AS, ULIMITS, build, podman, run
from tests.webhook.reviews import patch_ops, pod, response_of, review

pytestmark = pytest.mark.image

UID = int(RUN_AS.split(":")[0])
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
POLICY = """\
mirrors:
  - source: docker.io
    mirror: mirror.image-test.example/hub
"""


def test_runs_as_the_deployment_user_on_a_read_only_root(image: str) -> None:
    """The image's user is the Deployment's, and the CLI works with nothing writable."""
    user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == RUN_AS
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", image).stdout)
    assert labels["org.opencontainers.image.version"] == VERSION
    done = run(image, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: mirrorgate")


def test_nothing_in_the_image_is_writable_by_its_user(image: str) -> None:
    """Even without --read-only, the virtualenv and the system are root's: a
    compromised server cannot change its own code."""
    probe = (
        "import os\n"
        "for top in ('/opt/mirrorgate', '/usr', '/etc'):\n"
        "    for d, dirs, files in os.walk(top):\n"
        "        for p in [d, *(os.path.join(d, f) for f in files)]:\n"
        "            if not os.path.islink(p) and os.access(p, os.W_OK): print(p)\n"
    )
    done = podman(
        "run",
        "--rm",
        "--user",
        RUN_AS,
        "--network=none",
        *ULIMITS,
        "--entrypoint",
        "python3",
        image,
        "-c",
        probe,
    )
    assert done.stdout == ""


def test_carries_the_kubelet_plugin_of_its_architecture(image: str) -> None:
    """/opt/mirrorgate/libexec/mirrorgate-credential-provider: a static executable of the
    image's own architecture, runnable by anyone (the chart's DaemonSet copies it out)."""
    probe = (
        "import os, platform\n"
        "p = '/opt/mirrorgate/libexec/mirrorgate-credential-provider'\n"
        "head = open(p, 'rb').read(20)\n"
        "machine = {'x86_64': 62, 'aarch64': 183}[platform.machine()]\n"
        "print(os.access(p, os.X_OK), head[:4] == b'\\x7fELF', "
        "int.from_bytes(head[18:20], 'little') == machine)\n"
    )
    done = podman(
        "run", "--rm", "--user", RUN_AS, "--network=none", *ULIMITS,
        "--entrypoint", "python3", image, "-c", probe,
    )  # fmt: skip
    assert done.stdout == "True True True\n"


def test_holds_exactly_the_locked_distributions_and_no_installer(image: str) -> None:
    """What the image runs is what image/requirements.lock pins (setuptools and
    pip removed after the build), plus mirrorgate itself."""
    listing = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    done = run(image, "-c", listing, options=["--entrypoint", "python3"])
    assert done.returncode == 0, done.stderr
    installed = {canonicalize_name(k): v for k, v in json.loads(done.stdout).items()}
    assert installed == {**locked_in_image(), "mirrorgate": VERSION}


def test_serves_admission_on_a_read_only_root(image: str, tmp_path: Path) -> None:
    """`mirrorgate certs generate` and `serve` from the image, as user 65532 with a
    read-only root: /readyz answers and a Pod is rewritten over real HTTPS."""
    certs = tmp_path / "certs"
    certs.mkdir()
    os.chown(certs, UID, UID)
    made = run(
        image,
        "certs",
        "generate",
        "--service",
        "mirrorgate",
        "--namespace",
        "mirrorgate",
        "--ip",
        "127.0.0.1",
        "--out",
        "/certs",
        options=["-v", f"{certs}:/certs"],
    )
    assert made.returncode == 0, made.stderr
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    name = f"mirrorgate-image-test-{uuid.uuid4().hex[:8]}"
    # Host networking on loopback only: no bridge, no firewall rules touched.
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--read-only",
        "--user",
        RUN_AS,
        "--network=host",
        *ULIMITS,
        "-v",
        f"{certs}:/certs:ro",
        "-v",
        f"{policy}:/etc/mirrorgate/policy.yaml:ro",
        image,
        "serve",
        "--policy=/etc/mirrorgate/policy.yaml",
        "--tls-cert=/certs/tls.crt",
        "--tls-key=/certs/tls.key",
        "--host=127.0.0.1",
        f"--port={port}",
        # The policy's mirror is fictional, and tests reach nothing beyond loopback.
        "--no-health-probes",
    )
    try:
        with httpx.Client(
            base_url=f"https://127.0.0.1:{port}",
            verify=ssl.create_default_context(cafile=certs / "ca.crt"),
            timeout=5,
        ) as client:
            _wait_ready(client, name)
            answer = client.post("/mutate", json=review(pod("nginx:1.27")))
        assert answer.status_code == 200
        ops = patch_ops(response_of(answer.json()))
        assert {
            "op": "replace",
            "path": "/spec/containers/0/image",
            "value": "mirror.image-test.example/hub/library/nginx:1.27",
        } in ops
    finally:
        podman("rm", "--force", "--time=5", name, check=False)


def test_build_context_is_only_what_the_image_needs(tmp_path: Path) -> None:
    """.containerignore keeps virtualenvs, keys, certificates, caches and git out
    of the context: a probe build copies the whole context and lists it."""
    context = tmp_path / "context"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for rel in filter(None, tracked):
        if (REPO_ROOT / rel).is_symlink():  # mirrorgate/policy -> ../policy and its kin
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            (context / rel).symlink_to((REPO_ROOT / rel).readlink())
        elif (REPO_ROOT / rel).is_file():
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / rel, context / rel)
    planted = [
        ".venv/bin/python",
        "dev-certs/ca.key",
        "dev-certs/tls.crt",
        "tls.key",
        "webhook/server.pem",
        "certs/leaked.key",
        ".env",
        ".git/config",
        ".pytest_cache/v/cache",
        ".mypy_cache/x.json",
        "policy/__pycache__/x.pyc",
        "build/lib/x.py",
        "mirrorgate.egg-info/PKG-INFO",
    ]
    for rel in planted:
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / rel).write_text("must not reach the image\n")
    probe = tmp_path / "Probe.Containerfile"
    probe.write_text(f"FROM {build('debian-base.sh')}\nCOPY . /ctx\n")
    tag = f"localhost/mirrorgate-context-probe:{uuid.uuid4().hex[:8]}"
    podman("build", "--quiet", "--tag", tag, "--file", str(probe), str(context), timeout=300)
    try:
        listed = podman(
            "run",
            "--rm",
            "--network=none",
            "--user",
            RUN_AS,
            *ULIMITS,
            tag,
            "find",
            "/ctx",
            "-type",
            "f",
        ).stdout.split()
    finally:
        podman("rmi", "--force", tag, check=False)
    sent = {path.removeprefix("/ctx/") for path in listed}
    expected = {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "tools/build_backend.py",
        "image/requirements.lock",
    } | {
        rel
        for rel in tracked
        if rel.endswith(".py")
        and rel.split("/")[0] in ("policy", "webhook", "certs", "mirrorgate")
        and not (REPO_ROOT / rel).is_symlink()
    }
    assert sent == expected
    assert not sent.intersection(planted)


def _wait_ready(client: httpx.Client, name: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        state = podman("inspect", "--format", "{{.State.Status}}", name, check=False).stdout
        if state.strip() != "running" or time.monotonic() > deadline:
            logs = podman("logs", name, check=False)
            raise AssertionError(
                f"serve in the image not ready ({state.strip()}): {logs.stdout}{logs.stderr}"
            )
        time.sleep(0.2)


def test_no_base_is_taken_unverified() -> None:
    """The Containerfile names no default base, and BASE=official needs a digest given by
    its user: a tag alone is refused before anything is pulled."""
    containerfile = (REPO_ROOT / "Containerfile").read_text()
    assert [line for line in containerfile.splitlines() if line.startswith("ARG PYTHON_IMAGE")] == [
        "ARG PYTHON_IMAGE"
    ]
    for given in ({}, {"PYTHON_IMAGE": "docker.io/library/python:3.11-slim-bookworm"}):
        done = subprocess.run(
            ["bash", str(REPO_ROOT / "image" / "build.sh")],
            env={**os.environ, "BASE": "official", **given},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (done.returncode, done.stderr) == (
            2,
            (
                "image/build.sh: BASE=official needs PYTHON_IMAGE=<image>@sha256:<digest>, "
                "a digest you resolved and verified\n"
            ),
        )


@pytest.mark.parametrize(
    ("owner", "mode", "outcome"),
    [
        # The kubelet's Secret volume with the Pod's fsGroup: root's files, the group's to
        # read, defaultMode 0400 made 0440 (group read is added for fsGroup).
        pytest.param((0, UID), 0o440, "", id="fsGroup-0440"),
        # Without fsGroup the key is root's alone: the real errno, not "no such file".
        pytest.param(
            (0, 0), 0o400, "cannot read the store key: Permission denied", id="no-fsGroup"
        ),
        pytest.param(
            (0, UID), 0o444, "may be read or written by group or others", id="world-readable"
        ),
    ],
)
def test_a_store_key_from_a_secret_volume_is_read_as_user_65532(
    image: str, tmp_path: Path, owner: tuple[int, int], mode: int, outcome: str
) -> None:
    """docs/security.md's advice for the store key, as the kubelet lays a Secret volume out."""
    from mirrorgate.webhook.credentials import filestore  # the host's copy writes the store
    from mirrorgate.webhook.credentials.store import Credential

    secret = tmp_path / "secret"
    secret.mkdir()
    key = filestore.generate_key()
    filestore.update_store(
        str(secret / "store.json"),
        base64.b64decode(key),
        lambda contents: {
            "team-a": Credential(
                name="team-a",
                registry="harbor.corp.example",
                username="robot",
                password="p@ss-image-2b7e",
            )
        },
        missing_ok=True,
    )
    (secret / "store.key").write_text(key + "\n")
    for name in ("store.json", "store.key"):
        os.chown(secret / name, *owner)
        (secret / name).chmod(mode)
    done = run(
        image,
        "credentials",
        "list",
        "--store",
        "/secret/store.json",
        "--key-file",
        "/secret/store.key",
        options=["-v", f"{secret}:/secret:ro"],
    )
    if not outcome:
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert done.stdout.split() == [
            "NAME",
            "REGISTRY",
            "USERNAME",
            "team-a",
            "harbor.corp.example",
            "robot",
        ]
        return
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("mirrorgate: error: /secret/store.key: ")
    assert outcome in done.stderr
