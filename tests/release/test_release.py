"""`make release`: the artifacts built and verified (release/release.sh, release/verify.py).

The checks themselves first, on small files and documents made here, each
with the fault it must catch; then one real release of the native image into
a temporary directory (marker `image`: it builds the image, reusing podman's
layer cache, exports it, and checks it from a store of its own).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from release import sbom, verify
from release.lock import locked_in_image

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
NATIVE = "linux/amd64"


def _sums(dist: Path) -> None:
    """SHA256SUMS as `sha256sum` writes it, for every other file of ``dist``."""
    names = sorted(p.name for p in dist.iterdir() if p.name != "SHA256SUMS")
    listed = subprocess.run(
        ["sha256sum", "--", *names], cwd=dist, check=True, capture_output=True, text=True
    ).stdout
    (dist / "SHA256SUMS").write_text(listed)


@pytest.fixture
def dist(tmp_path: Path) -> Path:
    """A release directory with two small files and their SHA256SUMS."""
    (tmp_path / "mirrorgate-a").write_bytes(b"a" * 1000)
    (tmp_path / "mirrorgate-b").write_bytes(b"b")
    _sums(tmp_path)
    return tmp_path


def test_checksums_are_checked_file_by_file(dist: Path) -> None:
    """Matching sums pass; a changed byte, a file not listed and a listed file gone fail."""
    assert verify.check_sums(dist) == "SHA256SUMS: 2 files, every one matches"
    (dist / "mirrorgate-a").write_bytes(b"a" * 999 + b"x")
    with pytest.raises(
        verify.ReleaseError,
        match=r"mirrorgate-a: sha256 [0-9a-f]{64}, "
        r"SHA256SUMS says",
    ):
        verify.check_sums(dist)
    _sums(dist)
    (dist / "mirrorgate-c").write_bytes(b"c")
    with pytest.raises(verify.ReleaseError, match="the directory holds"):
        verify.check_sums(dist)
    _sums(dist)
    (dist / "mirrorgate-c").unlink()
    with pytest.raises(verify.ReleaseError, match=r"lists .*mirrorgate-c"):
        verify.check_sums(dist)


def test_the_sbom_lists_exactly_the_locked_distributions(tmp_path: Path) -> None:
    """From the image's listing: CycloneDX with one PyPI component per locked distribution,
    the same bytes every time; the SBOM check passes it and refuses one the CycloneDX
    schema refuses, one without a component and one with one more."""
    locked = locked_in_image()
    document = sbom.bom(VERSION, {**locked, "mirrorgate": VERSION})
    assert document == sbom.bom(VERSION, {**locked, "mirrorgate": VERSION})
    assert document["bomFormat"] == "CycloneDX"
    assert document["metadata"]["component"]["version"] == VERSION
    assert sbom.components_of(document) == locked
    assert {c["purl"] for c in document["components"]} == {
        f"pkg:pypi/{name}@{version}" for name, version in locked.items()
    }
    path = tmp_path / "sbom.json"
    path.write_text(json.dumps(document))
    assert verify.check_sbom(path, VERSION).endswith(
        f"exactly the {len(locked)} locked distributions"
    )
    short = {**document, "components": document["components"][1:]}
    path.write_text(json.dumps(short))
    with pytest.raises(
        verify.ReleaseError, match=f"{document['components'][0]['name']} .* is missing"
    ):
        verify.check_sbom(path, VERSION)
    mistyped = {
        **document,
        "components": [{**document["components"][0], "type": "wheel"}, *document["components"][1:]],
    }
    path.write_text(json.dumps(mistyped))
    with pytest.raises(
        verify.ReleaseError,
        match=r"not valid CycloneDX 1\.5: 'wheel' is not one "
        r"of",
    ):
        verify.check_sbom(path, VERSION)
    extra = {
        **document,
        "components": [
            *document["components"],
            {
                "type": "library",
                "name": "left-pad",
                "version": "1.0",
                "purl": "pkg:pypi/left-pad@1.0",
            },
        ],
    }
    path.write_text(json.dumps(extra))
    with pytest.raises(
        verify.ReleaseError,
        match=r"left-pad 1\.0 is not in "
        r"image/requirements\.lock",
    ):
        verify.check_sbom(path, VERSION)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            lambda d: {**d, "pip": "24.0"},
            "pip 24.0 is not in image/requirements.lock",
            id="an-installer-left",
        ),
        pytest.param(
            lambda d: {k: v for k, v in d.items() if k != "pyyaml"},
            "pyyaml .* is missing",
            id="one-missing",
        ),
        pytest.param(
            lambda d: {**d, "pyyaml": "0.1"},
            "pyyaml is 0.1, image/requirements.lock pins",
            id="another-version",
        ),
        pytest.param(
            lambda d: {**d, "mirrorgate": "0.0.1"},
            "does not hold mirrorgate",
            id="another-mirrorgate",
        ),
    ],
)
def test_no_sbom_is_made_from_an_image_that_disagrees_with_the_lock(
    change: Callable[[dict[str, str]], dict[str, str]], message: str
) -> None:
    """The image's listing must be the lock plus mirrorgate, or no SBOM is written."""
    installed = change({**locked_in_image(), "mirrorgate": VERSION})
    with pytest.raises(sbom.SbomError, match=message):
        sbom.bom(VERSION, installed)


def _release(env: dict[str, str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO_ROOT / "release" / "release.sh")],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({}, "VERSION=X.Y.Z is required (got '')", id="no-version"),
        pytest.param({"VERSION": "1.2"}, "VERSION=X.Y.Z is required (got '1.2')", id="not-x-y-z"),
        pytest.param(
            {"VERSION": "9.9.9"},
            f"VERSION 9.9.9 is not pyproject.toml's {VERSION}",
            id="not-the-project-version",
        ),
        pytest.param(
            {"VERSION": VERSION, "PLATFORMS": "linux/arm64"},
            "PLATFORMS must include linux/amd64",
            id="no-native-image",
        ),
    ],
)
def test_release_refuses_before_building(env: dict[str, str], message: str, tmp_path: Path) -> None:
    """Mistakes are one line (exit 2), found before anything is built or removed."""
    keep = tmp_path / "keep"
    keep.write_text("not a release file")
    done = _release({"VERSION": "", **env, "DIST": str(tmp_path)})
    assert done.returncode == 2
    assert done.stderr.startswith(f"release.sh: {message}")
    assert keep.exists()


def test_release_empties_no_directory_of_other_files(tmp_path: Path) -> None:
    """DIST holding anything but an earlier release is refused, and left as it is."""
    (tmp_path / "notes.txt").write_text("mine")
    done = _release({"VERSION": VERSION, "PLATFORMS": NATIVE, "DIST": str(tmp_path)})
    assert (done.returncode, done.stderr) == (
        2,
        f"release.sh: {tmp_path} holds files that are not a release's; not emptying it\n",
    )
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.image
def test_make_release_builds_and_verifies_every_artifact(tmp_path: Path) -> None:
    """`make release` of the native image: the four files, each verified (the image run
    from the archive says its version, helm lint --strict, the SBOM against the lock,
    the checksums), and what verify refuses on the real chart, changed."""
    dist = tmp_path / "dist"
    started = time.monotonic()
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "release",
            f"VERSION={VERSION}",
            f"DIST={dist}",
            f"PLATFORMS={NATIVE}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    files = verify.artifacts(VERSION)
    assert sorted(p.name for p in dist.iterdir()) == sorted([*files.values(), "SHA256SUMS"])
    verified = [line for line in done.stdout.splitlines() if line.startswith("verified ")]
    assert verified == [
        "verified SHA256SUMS: 3 files, every one matches",
        f"verified {files['image']}: {NATIVE} (x86_64): each runs, says mirrorgate {VERSION} "
        "and holds exactly the locked distributions",
        f"verified {files['chart']}: version and appVersion {VERSION}, helm lint --strict passes",
        f"verified {files['sbom']}: CycloneDX 1.5, exactly the {len(locked_in_image())} "
        "locked distributions",
    ], done.stdout + done.stderr
    assert (
        subprocess.run(
            ["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=dist, check=False
        ).returncode
        == 0
    )
    # The real chart, restamped 9.9.9: the chart check names the mismatch.
    restamped = tmp_path / "restamped.tgz"
    with tarfile.open(dist / files["chart"]) as source, tarfile.open(restamped, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member)
            content = data.read() if data is not None else b""
            if member.name == "mirrorgate/Chart.yaml":
                content = content.replace(f"version: {VERSION}".encode(), b"version: 9.9.9")
                member.size = len(content)
            target.addfile(member, io.BytesIO(content))
    with pytest.raises(verify.ReleaseError, match=f"version 9.9.9, appVersion {VERSION}"):
        verify.check_chart(restamped, VERSION, "helm-not-reached")
    print(f"make release ({NATIVE}, warm layer cache): {took:.0f} s")


@pytest.mark.image
def test_emulation_is_set_up_for_the_command_only() -> None:
    """image/emulation.sh registers qemu for arm64 with the F flag (usable inside
    containers) while its command runs, and leaves binfmt_misc as it found it."""
    binfmt = Path("/proc/sys/fs/binfmt_misc")

    def state() -> tuple[bool, bool]:
        return (binfmt / "register").exists(), (binfmt / "qemu-aarch64").exists()

    before = state()
    done = subprocess.run(
        [
            "bash",
            str(REPO_ROOT / "image" / "emulation.sh"),
            "arm64",
            "cat",
            str(binfmt / "qemu-aarch64"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P")
    flags = re.search(r"^flags: (\w+)$", done.stdout, re.M)
    assert flags is not None
    assert "F" in flags[1]
    assert state() == before
