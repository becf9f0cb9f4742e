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
import struct
import subprocess
import tarfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from release import dpkg, sbom, verify
from release.dpkg import DebianPackage
from release.lock import locked_in_image

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
NATIVE = "linux/amd64"
# As `dpkg-query -W -f dpkg.FORMAT` prints them in a Debian 12 image, in dpkg's order,
# with one package removed but for its configuration files.
DPKG_LISTING = (
    "python3.11\t3.11.2-6+deb12u6\tamd64\tinstalled\n"
    "libc6\t2.36-9+deb12u10\tamd64\tinstalled\n"
    "ca-certificates\t20230311+deb12u1\tall\tinstalled\n"
    "mawk\t1.3.4.20200120-3.1\tamd64\tconfig-files\n"
    "base-files\t12.4+deb12u11\tamd64\tinstalled\n"
)
PACKAGES = dpkg.packages_of(DPKG_LISTING)
OS_RELEASE = """PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
"""


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
    document = sbom.bom(VERSION, {**locked, "mirrorgate": VERSION}, PACKAGES, "debian-12")
    assert document == sbom.bom(VERSION, {**locked, "mirrorgate": VERSION}, PACKAGES, "debian-12")
    assert document["bomFormat"] == "CycloneDX"
    assert document["metadata"]["component"]["version"] == VERSION
    assert sbom.components_of(document).python == locked
    assert {c["purl"] for c in document["components"] if c["purl"].startswith("pkg:pypi/")} == {
        f"pkg:pypi/{name}@{version}" for name, version in locked.items()
    }
    path = tmp_path / "sbom.json"
    path.write_text(json.dumps(document))
    assert verify.check_sbom(path, VERSION).endswith(
        f"exactly the {len(locked)} locked distributions and 4 Debian packages of debian-12"
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
        sbom.bom(VERSION, installed, PACKAGES, "debian-12")


def test_the_sbom_lists_the_images_debian_packages(tmp_path: Path) -> None:
    """The installed packages of the dpkg listing, after the Python distributions, each with
    its Debian package URL (version percent-encoded, arch and distro), sorted by name: the
    same bytes whatever dpkg's order; a removed package is not listed."""
    assert [
        DebianPackage("base-files", "12.4+deb12u11", "amd64"),
        DebianPackage("ca-certificates", "20230311+deb12u1", "all"),
        DebianPackage("libc6", "2.36-9+deb12u10", "amd64"),
        DebianPackage("python3.11", "3.11.2-6+deb12u6", "amd64"),
    ] == PACKAGES
    assert dpkg.distro_of(OS_RELEASE) == "debian-12"
    installed = {**locked_in_image(), "mirrorgate": VERSION}
    document = sbom.bom(VERSION, installed, PACKAGES, dpkg.distro_of(OS_RELEASE))
    debian = document["components"][len(locked_in_image()) :]
    assert debian == [
        {
            "type": "library",
            "bom-ref": purl,
            "name": purl.split("/")[2].split("@")[0],
            "version": version,
            "purl": purl,
        }
        for purl, version in [
            (
                "pkg:deb/debian/base-files@12.4%2Bdeb12u11?arch=amd64&distro=debian-12",
                "12.4+deb12u11",
            ),
            (
                "pkg:deb/debian/ca-certificates@20230311%2Bdeb12u1?arch=all&distro=debian-12",
                "20230311+deb12u1",
            ),
            (
                "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64&distro=debian-12",
                "2.36-9+deb12u10",
            ),
            (
                "pkg:deb/debian/python3.11@3.11.2-6%2Bdeb12u6?arch=amd64&distro=debian-12",
                "3.11.2-6+deb12u6",
            ),
        ]
    ]
    assert sbom.components_of(document) == (locked_in_image(), PACKAGES, "debian-12")
    reordered = dpkg.packages_of("".join(reversed(DPKG_LISTING.splitlines(keepends=True))))
    assert json.dumps(sbom.bom(VERSION, installed, reordered, "debian-12"), indent=2) == json.dumps(
        document, indent=2
    )
    # The command release.sh runs: the same file from the same image, byte for byte,
    # whatever order dpkg lists it in.
    (tmp_path / "os-release").write_text(OS_RELEASE)
    made = []
    for listing in [DPKG_LISTING, "".join(reversed(DPKG_LISTING.splitlines(keepends=True)))]:
        (tmp_path / "dpkg").write_text(listing)
        done = _sbom_command(tmp_path, json.dumps(installed))
        assert (done.returncode, done.stderr) == (0, "")
        made.append(done.stdout)
    assert made[0] == made[1]
    assert json.loads(made[0]) == document
    path = tmp_path / "sbom.json"
    path.write_text(made[0])
    assert verify.check_sbom(path, VERSION).endswith("and 4 Debian packages of debian-12")


def _sbom_command(work: Path, listing: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(REPO_ROOT / ".venv" / "bin" / "python"),
            "-m",
            "release.sbom",
            "--version",
            VERSION,
            "--debian",
            str(work / "dpkg"),
            "--os-release",
            str(work / "os-release"),
        ],
        cwd=REPO_ROOT,
        input=listing,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("listing", "message"),
    [
        pytest.param(
            "libc6\t2.36-9\tamd64\n",
            "line 1: 'libc6\\t2.36-9\\tamd64' has 3 tab-separated fields, "
            "not 4 (package, version, architecture, status)",
            id="a-field-missing",
        ),
        pytest.param(
            "libc6 2.36-9 amd64 installed\n",
            "line 1: 'libc6 2.36-9 amd64 installed' has 1 tab-separated fields",
            id="not-tab-separated",
        ),
        pytest.param(
            "libc6\t2.36-9\tamd64\tinstalled\nLibC_7\t1.0\tamd64\tinstalled\n",
            "line 2: 'LibC_7' is not a Debian package name",
            id="a-name",
        ),
        pytest.param(
            "libc6\t2.36 9\tamd64\tinstalled\n",
            "line 1: libc6's version '2.36 9' is not a Debian version",
            id="a-version",
        ),
        pytest.param(
            "libc6\t2.36-9\tx86_64\tinstalled\n",
            "line 1: libc6's architecture 'x86_64' is not a Debian architecture",
            id="an-architecture",
        ),
        pytest.param(
            "libc6\t2.36-9\tamd64\thalf-configured\n",
            "line 1: libc6 is 'half-configured', not installed: the image's packages are not "
            "a finished install",
            id="a-broken-install",
        ),
        pytest.param(
            "libc6\t2.36-9\tamd64\tinstalled\nlibc6\t2.36-8\tamd64\tinstalled\n",
            "line 2: libc6:amd64 is listed twice",
            id="twice",
        ),
        pytest.param(
            "mawk\t1.3.4\tamd64\tconfig-files\n",
            "the image's dpkg listing names no installed package",
            id="nothing-installed",
        ),
        pytest.param("", "the image's dpkg listing names no installed package", id="empty"),
    ],
)
def test_a_malformed_debian_listing_makes_no_sbom(
    listing: str, message: str, tmp_path: Path
) -> None:
    """A listing that is not dpkg-query's, or not of a finished install, is refused naming
    the line and what is wrong; release.sh's command writes nothing and exits 1."""
    with pytest.raises(dpkg.DpkgError, match=re.escape(message)):
        dpkg.packages_of(listing)
    (tmp_path / "dpkg").write_text(listing)
    (tmp_path / "os-release").write_text(OS_RELEASE)
    done = _sbom_command(tmp_path, json.dumps({**locked_in_image(), "mirrorgate": VERSION}))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("release.sbom: ")
    assert message in done.stderr


@pytest.mark.parametrize(
    ("os_release", "distro_or_message"),
    [
        pytest.param(
            'ID=debian\nVERSION_CODENAME=forky\nPRETTY_NAME="Debian GNU/Linux forky/sid"\n',
            "debian-forky",
            id="testing-has-a-codename-only",
        ),
        pytest.param(
            'ID=ubuntu\nVERSION_ID="24.04"\n',
            "the image's os-release says ID='ubuntu', not 'debian'",
            id="not-debian",
        ),
        pytest.param(
            "ID=debian\n",
            "the image's os-release has no VERSION_ID or VERSION_CODENAME",
            id="no-release",
        ),
    ],
)
def test_the_debian_release_comes_from_os_release(os_release: str, distro_or_message: str) -> None:
    """The purls' distro is debian-VERSION_ID, or the codename of a suite without a number;
    an image that is not Debian, or names no release, is refused."""
    if distro_or_message.startswith("debian-"):
        assert dpkg.distro_of(os_release) == distro_or_message
        return
    with pytest.raises(dpkg.DpkgError, match=re.escape(distro_or_message)):
        dpkg.distro_of(os_release)


def test_the_sbom_check_refuses_debian_components_that_lie(tmp_path: Path) -> None:
    """An SBOM whose Debian purl is not its component's version, whose packages are of two
    distros, or that lists no Debian package, is refused."""
    installed = {**locked_in_image(), "mirrorgate": VERSION}
    document = sbom.bom(VERSION, installed, PACKAGES, "debian-12")
    first = len(locked_in_image())
    libc = document["components"][first + 2]
    assert libc["name"] == "libc6"
    path = tmp_path / "sbom.json"
    cases = [
        (
            [{**libc, "version": "2.36-9+deb12u9"}],
            "component 'libc6': a duplicate, or its purl "
            "'pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64&distro=debian-12' is not its",
        ),
        (
            [{**libc, "purl": libc["purl"].replace("debian-12", "debian-11")}],
            "the Debian packages are of 2 distros, ['debian-11', 'debian-12'], not one",
        ),
        ([libc, {**libc, "bom-ref": "libc6-again"}], "component 'libc6': a duplicate"),
    ]
    for replacement, message in cases:
        components = document["components"]
        changed = [*components[: first + 2], *replacement, *components[first + 3 :]]
        path.write_text(json.dumps({**document, "components": changed}))
        with pytest.raises(verify.ReleaseError, match=re.escape(message)):
            verify.check_sbom(path, VERSION)
    path.write_text(json.dumps({**document, "components": document["components"][:first]}))
    with pytest.raises(verify.ReleaseError, match="lists no Debian package"):
        verify.check_sbom(path, VERSION)


def test_each_platforms_image_holds_the_sboms_debian_packages() -> None:
    """The SBOM is made from the native image; another platform's image passes when it holds
    the same packages of its own architecture (``all`` unchanged), and a package more, one
    fewer or another version is named."""
    arm64 = [p if p.architecture == "all" else p._replace(architecture="arm64") for p in PACKAGES]
    verify.check_packages("the linux/arm64 image", arm64, PACKAGES, "arm64")
    verify.check_packages("the linux/amd64 image", PACKAGES, PACKAGES, "amd64")
    changed = [*arm64[:2], arm64[2]._replace(version="2.36-9+deb12u9"), *arm64[3:]]
    changed.append(DebianPackage("curl", "7.88.1-10+deb12u12", "arm64"))
    with pytest.raises(verify.ReleaseError) as refused:
        verify.check_packages("the linux/arm64 image", changed, PACKAGES, "arm64")
    assert str(refused.value) == (
        "the linux/arm64 image disagrees with the SBOM's Debian packages: "
        "curl 7.88.1-10+deb12u12 (arm64) is not in the SBOM; "
        "libc6 2.36-9+deb12u9 (arm64) is not in the SBOM; "
        "libc6 2.36-9+deb12u10 (arm64) is missing"
    )
    with pytest.raises(verify.ReleaseError, match=r"ca-certificates .* \(all\) is missing"):
        verify.check_packages(
            "the linux/amd64 image", PACKAGES[:1] + PACKAGES[2:], PACKAGES, "amd64"
        )


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
    from the archive says its version and holds the SBOM's Debian packages, helm lint
    --strict, the SBOM against the lock, the checksums), and what verify refuses on the
    real chart, changed."""
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
    # The SBOM lists the image's Debian packages: its base's, Python's and dpkg's own.
    listed = sbom.components_of(json.loads((dist / files["sbom"]).read_text()))
    assert listed.distro == "debian-12"
    debian = {p.name: p for p in listed.debian}
    assert {"base-files", "ca-certificates", "dpkg", "libc6", "python3.11"} <= set(debian)
    assert debian["libc6"].architecture == "amd64"
    assert debian["ca-certificates"].architecture == "all"
    verified = [line for line in done.stdout.splitlines() if line.startswith("verified ")]
    assert verified == [
        "verified SHA256SUMS: 5 files, every one matches",
        f"verified {files['image']}: {NATIVE} (x86_64): each runs, says mirrorgate {VERSION} "
        "and holds exactly the locked distributions and the SBOM's Debian packages",
        f"verified {files['chart']}: version and appVersion {VERSION}, helm lint --strict passes",
        f"verified {files['sbom']}: CycloneDX 1.5, exactly the {len(locked_in_image())} "
        f"locked distributions and {len(debian)} Debian packages of debian-12",
        f"verified {files['plugin-amd64']}: a static linux/amd64 executable",
        f"verified {files['plugin-arm64']}: a static linux/arm64 executable",
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


def _elf(machine: int, *, interpreter: bool = False, e_type: int = 2) -> bytes:
    """A 64-bit little-endian ELF header with one program header (PT_LOAD or PT_INTERP)."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HH", header, 16, e_type, machine)
    struct.pack_into("<Q", header, 32, 64)  # e_phoff: right after this header
    struct.pack_into("<HH", header, 54, 56, 1)  # e_phentsize, e_phnum
    program = bytearray(56)
    struct.pack_into("<I", program, 0, 3 if interpreter else 1)
    return bytes(header + program)


@pytest.mark.parametrize(
    ("content", "arch", "problem"),
    [
        (_elf(62), "amd64", None),
        (_elf(183), "arm64", None),
        (_elf(62), "arm64", "machine 62; expected an executable \\(2\\) for arm64 \\(183\\)"),
        (_elf(62, interpreter=True), "amd64", "dynamically linked"),
        (_elf(62, e_type=3), "amd64", "ELF type 3"),
        (b"#!/bin/sh\n", "amd64", "not a 64-bit little-endian ELF file"),
    ],
)
def test_the_plugin_check_wants_a_static_binary_of_its_architecture(
    tmp_path: Path, content: bytes, arch: str, problem: str | None
) -> None:
    path = tmp_path / f"mirrorgate-credential-provider-{VERSION}-linux-{arch}"
    path.write_bytes(content)
    if problem is None:
        assert verify.check_plugin(path, arch) == f"{path.name}: a static linux/{arch} executable"
    else:
        with pytest.raises(verify.ReleaseError, match=problem):
            verify.check_plugin(path, arch)


def test_the_built_plugins_pass_the_release_check(tmp_path: Path) -> None:
    """plugins/build.sh, as `make release` runs it, builds what the check accepts."""
    out = tmp_path / "plugins"
    subprocess.run(["bash", "plugins/build.sh", str(out)], cwd=REPO_ROOT, check=True, timeout=1200)
    for arch in verify.PLUGIN_ARCHITECTURES:
        built = out / f"linux-{arch}" / verify.PLUGIN
        assert verify.check_plugin(built, arch).endswith(f"a static linux/{arch} executable")
