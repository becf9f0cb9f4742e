"""Checks a release directory as its user would, before anything is published:

* ``SHA256SUMS`` lists exactly the other files, and each matches;
* the OCI archive holds an image for every platform asked for, and each, run
  from the archive (a foreign one through qemu), runs as its architecture,
  prints ``mirrorgate X.Y.Z`` for ``--version``, holds exactly the locked
  distributions and exactly the SBOM's Debian packages (of its own architecture);
* each kubelet plugin binary is a static ELF executable of its architecture;
* the chart is stamped ``version`` and ``appVersion`` X.Y.Z and passes
  ``helm lint --strict``;
* the SBOM is valid CycloneDX 1.5 (its JSON schema, strict) and lists exactly the
  locked distributions of the image, and its Debian packages.

    python -m release.verify --dist DIST --version X.Y.Z --platforms "linux/amd64 ..." \\
        --helm HELM

Exit 0 with one line per check, or 1 naming every problem found.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import struct
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from release import dpkg, sbom

__all__ = [
    "ReleaseError",
    "check_chart",
    "check_image",
    "check_packages",
    "check_plugin",
    "check_sbom",
    "check_sums",
    "main",
]

SUMS = "SHA256SUMS"
PODMAN = Path(__file__).resolve().parents[1] / "image" / "podman.sh"
# Root in this VM lacks CAP_SYS_RESOURCE: limits at or below the host's (tests/image/podman.py).
ULIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=2048:2048")


class ReleaseError(Exception):
    """A release file is not what it should be: says which and how."""


PLUGIN = "mirrorgate-credential-provider"
PLUGIN_ARCHITECTURES = ("amd64", "arm64")
"""The kubelet plugin is cross-compiled, so every release carries both, whatever PLATFORMS."""
ELF_MACHINES = {"amd64": 62, "arm64": 183}
"""ELF ``e_machine``: EM_X86_64 and EM_AARCH64."""


def artifacts(version: str) -> dict[str, str]:
    """What a release directory holds, beside SHA256SUMS: role → file name."""
    return {
        "image": f"mirrorgate-{version}.oci.tar",
        "chart": f"mirrorgate-{version}.tgz",
        "sbom": f"mirrorgate-{version}.cdx.json",
        **{f"plugin-{arch}": f"{PLUGIN}-{version}-linux-{arch}" for arch in PLUGIN_ARCHITECTURES},
    }


def check_plugin(path: Path, arch: str) -> str:
    """``path`` is a 64-bit little-endian ELF executable for ``arch`` with no program
    interpreter: static, so that it runs on a node whatever its libc."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ReleaseError(f"{path.name}: not a 64-bit little-endian ELF file")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_type != 2 or e_machine != ELF_MACHINES[arch]:
        raise ReleaseError(
            f"{path.name}: ELF type {e_type}, machine {e_machine}; expected an executable "
            f"(2) for {arch} ({ELF_MACHINES[arch]})"
        )
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    for index in range(phnum):
        (p_type,) = struct.unpack_from("<I", data, phoff + index * phentsize)
        if p_type == 3:  # PT_INTERP: linked against a dynamic loader
            raise ReleaseError(f"{path.name}: dynamically linked (it names an interpreter)")
    return f"{path.name}: a static linux/{arch} executable"


def check_sums(dist: Path) -> str:
    """SHA256SUMS (``sha256sum`` format) lists exactly the other files, and each matches."""
    listed: dict[str, str] = {}
    for number, line in enumerate((dist / SUMS).read_text().splitlines(), 1):
        digest, separator, name = line.partition("  ")
        if not separator or len(digest) != 64 or "/" in name:
            raise ReleaseError(f"{SUMS} line {number}: not '<sha256>  <file>'")
        listed[name] = digest
    present = {path.name for path in dist.iterdir()} - {SUMS}
    if set(listed) != present:
        raise ReleaseError(f"{SUMS} lists {sorted(listed)}, the directory holds {sorted(present)}")
    for name, digest in listed.items():
        actual = _sha256(dist / name)
        if actual != digest:
            raise ReleaseError(f"{name}: sha256 {actual}, {SUMS} says {digest}")
    return f"{SUMS}: {len(listed)} files, every one matches"


def check_sbom(path: Path, version: str) -> str:
    """The SBOM is CycloneDX of mirrorgate ``version`` with exactly the locked distributions,
    and Debian packages."""
    text = path.read_text()
    invalid = JsonStrictValidator(SchemaVersion.V1_5).validate_str(text)
    if invalid is not None:
        raise ReleaseError(
            f"{path.name}: not valid CycloneDX {sbom.SPEC_VERSION}: {str(invalid).splitlines()[0]}"
        )
    try:
        document = json.loads(text)
        listed = sbom.check(document)
    except (ValueError, sbom.SbomError) as error:
        raise ReleaseError(f"{path.name}: {error}") from None
    subject = document.get("metadata", {}).get("component", {})
    if (subject.get("name"), subject.get("version")) != ("mirrorgate", version):
        raise ReleaseError(
            f"{path.name}: describes {subject.get('name')} "
            f"{subject.get('version')}, not mirrorgate {version}"
        )
    return (
        f"{path.name}: CycloneDX {sbom.SPEC_VERSION}, exactly the "
        f"{len(listed.python)} locked distributions and {len(listed.debian)} Debian packages "
        f"of {listed.distro}"
    )


def check_chart(path: Path, version: str, helm: str) -> str:
    """The packaged chart is stamped with ``version`` and passes ``helm lint --strict``."""
    with tarfile.open(path) as archive:
        member = archive.extractfile("mirrorgate/Chart.yaml")
        if member is None:
            raise ReleaseError(f"{path.name}: no mirrorgate/Chart.yaml")
        chart = yaml.safe_load(member.read())
    stamped = (str(chart.get("version")), str(chart.get("appVersion")))
    if stamped != (version, version):
        raise ReleaseError(
            f"{path.name}: version {stamped[0]}, appVersion {stamped[1]}; both should be {version}"
        )
    lint = subprocess.run(
        [helm, "lint", "--strict", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if lint.returncode != 0:
        raise ReleaseError(f"{path.name}: helm lint --strict failed:\n{lint.stdout}{lint.stderr}")
    return f"{path.name}: version and appVersion {version}, helm lint --strict passes"


# uname's machine for each architecture: that the image really runs as what its
# manifest says (an amd64 image labelled arm64 would run natively here, unnoticed).
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
PROBE = (
    "import importlib.metadata as m, json, platform, subprocess\n"
    "print(json.dumps({'machine': platform.machine(), 'distributions': "
    "{d.metadata['Name']: d.version for d in m.distributions()}, 'debian': "
    f"subprocess.run(['dpkg-query', '-W', '-f', {dpkg.FORMAT!r}], capture_output=True, "
    "text=True, check=True).stdout}))"
)


def check_image(path: Path, version: str, platforms: Sequence[str], sbom_file: Path) -> str:
    """The archive's index has exactly ``platforms``; each image, pulled from the archive,
    runs as its architecture, says ``version``, holds exactly the locked distributions and
    exactly the Debian packages that the SBOM ``sbom_file`` lists (made from the native image:
    each package of an architecture is that of the image run).

    A foreign architecture runs through qemu: release.sh runs this under image/emulation.sh.
    """
    try:
        packages = sbom.components_of(json.loads(sbom_file.read_text())).debian
    except (ValueError, sbom.SbomError) as error:
        raise ReleaseError(f"{path.name}: its Debian packages not checked: {error}") from None
    with tarfile.open(path) as archive:
        index = _json_member(archive, "index.json")
        [entry] = index["manifests"]  # the one list, as `podman manifest push` writes it
        digest = entry["digest"].removeprefix("sha256:")
        listed = _json_member(archive, f"blobs/sha256/{digest}")
    found = sorted(
        f"{m['platform']['os']}/{m['platform']['architecture']}"
        for m in listed.get("manifests", [])
    )
    if found != sorted(platforms):
        raise ReleaseError(f"{path.name}: holds images for {found}, not {sorted(platforms)}")
    ran = []
    for platform in found:
        machine = _run_from_archive(path, platform, version, packages)
        ran.append(f"{platform} ({machine})")
    return (
        f"{path.name}: {', '.join(ran)}: each runs, says mirrorgate {version} and holds "
        "exactly the locked distributions and the SBOM's Debian packages"
    )


def _run_from_archive(
    path: Path, platform: str, version: str, listed: Sequence[dpkg.DebianPackage]
) -> str:
    # A store of its own: the image run is the archive's, never one already here.
    with tempfile.TemporaryDirectory(prefix="mirrorgate-release-check-") as work:
        store = ("--root", f"{work}/root", "--runroot", f"{work}/run")
        image = _podman(
            *store, "pull", "--quiet", "--platform", platform, f"oci-archive:{path}"
        ).stdout.strip()
        run = (
            *store,
            "run",
            "--rm",
            "--read-only",
            "--user",
            "65532:65532",
            "--network=none",
            *ULIMITS,
        )
        said = _podman(*run, image, "--version", check=False)
        probed = _podman(*run, "--entrypoint", "python3", image, "-c", PROBE, check=False)
        _podman(*store, "rmi", "--all", "--force", check=False)
    if said.stdout.strip() != f"mirrorgate {version}":
        raise ReleaseError(
            f"{path.name}: the {platform} image says {said.stdout.strip()!r} "
            f"{said.stderr.strip()}, not 'mirrorgate {version}'"
        )
    try:
        probe = json.loads(probed.stdout)
        sbom.locked_distributions(version, probe["distributions"])
        found = dpkg.packages_of(probe["debian"])
    except (ValueError, KeyError, TypeError, sbom.SbomError, dpkg.DpkgError) as error:
        raise ReleaseError(
            f"{path.name}: the {platform} image: {error} {probed.stderr.strip()}"
        ) from None
    machine = str(probe.get("machine"))
    architecture = platform.removeprefix("linux/")
    if machine != MACHINES.get(architecture):
        raise ReleaseError(f"{path.name}: the {platform} image runs as {machine}")
    check_packages(f"{path.name}: the {platform} image", found, listed, architecture)
    return machine


def check_packages(
    what: str,
    found: Sequence[dpkg.DebianPackage],
    listed: Sequence[dpkg.DebianPackage],
    architecture: str,
) -> None:
    """``found`` are the SBOM's ``listed`` packages, those of an architecture as
    ``architecture``'s (the SBOM is the native image's; ``all`` is every image's)."""
    expected = {
        p._replace(architecture=architecture) if p.architecture != "all" else p for p in listed
    }
    unlisted = sorted(set(found) - expected)
    absent = sorted(expected - set(found))
    if unlisted or absent:
        named = [f"{p.name} {p.version} ({p.architecture}) is not in the SBOM" for p in unlisted]
        named += [f"{p.name} {p.version} ({p.architecture}) is missing" for p in absent]
        raise ReleaseError(f"{what} disagrees with the SBOM's Debian packages: " + "; ".join(named))


def _json_member(archive: tarfile.TarFile, name: str) -> dict[str, Any]:
    member = archive.extractfile(name)
    if member is None:
        raise ReleaseError(f"no {name} in the archive")
    loaded = json.loads(member.read())
    if not isinstance(loaded, dict):
        raise ReleaseError(f"{name} in the archive is not a JSON object")
    return loaded


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", str(PODMAN), *args], capture_output=True, text=True, timeout=600, check=False
    )
    if check and done.returncode != 0:
        raise ReleaseError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m release.verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dist", required=True, type=Path)
    parser.add_argument("--version", required=True)
    parser.add_argument("--platforms", required=True, help="space-separated, as PLATFORMS")
    parser.add_argument("--helm", required=True, help="the helm binary")
    args = parser.parse_args(argv)
    files = {role: args.dist / name for role, name in artifacts(args.version).items()}
    checks: list[Callable[[], str]] = [
        lambda: check_sums(args.dist),
        lambda: check_image(files["image"], args.version, args.platforms.split(), files["sbom"]),
        lambda: check_chart(files["chart"], args.version, args.helm),
        lambda: check_sbom(files["sbom"], args.version),
        *(
            functools.partial(check_plugin, files[f"plugin-{arch}"], arch)
            for arch in PLUGIN_ARCHITECTURES
        ),
    ]
    problems = 0
    for run in checks:
        try:
            print(f"verified {run()}")
        except (ReleaseError, OSError, KeyError, ValueError, tarfile.TarError) as error:
            print(f"release.verify: {error}", file=sys.stderr)
            problems += 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
