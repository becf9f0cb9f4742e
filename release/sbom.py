"""The release's CycloneDX SBOM: the image's Python distributions and Debian packages.

Made from the image itself, not from the lock: ``release.sh`` lists what the
image's interpreter has installed (``importlib.metadata``) and what its dpkg
database holds (release/dpkg.py), and this module writes both as CycloneDX 1.5
JSON after checking the Python listing against image/requirements.lock, so an
SBOM that disagrees with the lock is never written. The subject
(``metadata.component``) is the image, mirrorgate X.Y.Z; the components are
exactly the locked distributions it holds, each with its PyPI package URL,
then its installed Debian packages, each with its Debian package URL
(``pkg:deb/debian/NAME@VERSION?arch=ARCH&distro=debian-12``). No timestamp, a
fixed order and a serial number derived from the contents: the same image
gives the same file, byte for byte.

    podman run ... python3 -c LISTING | python -m release.sbom --version X.Y.Z \\
        --debian DPKG-LISTING --os-release OS-RELEASE > FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from packageurl import PackageURL
from packaging.utils import canonicalize_name

from release.dpkg import DebianPackage, DpkgError, distro_of, packages_of
from release.lock import locked_in_image

__all__ = ["LISTING", "Components", "bom", "check", "components_of", "locked_distributions", "main"]

# Run by the image's python3: name → version of every installed distribution.
LISTING = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)
SPEC_VERSION = "1.5"


class SbomError(Exception):
    """The image, the lock and the SBOM disagree: says on what."""


class Components(NamedTuple):
    """What an SBOM lists: canonical name → version of the Python distributions, and the
    Debian packages with the one distro they are of."""

    python: dict[str, str]
    debian: list[DebianPackage]
    distro: str


def pypi_purl(name: str, version: str) -> str:
    return PackageURL(type="pypi", name=canonicalize_name(name), version=version).to_string()


def deb_purl(package: DebianPackage, distro: str) -> str:
    qualifiers = {"arch": package.architecture, "distro": distro}
    return PackageURL(
        type="deb",
        namespace="debian",
        name=package.name,
        version=package.version,
        qualifiers=qualifiers,
    ).to_string()


def locked_distributions(version: str, installed: Mapping[str, str]) -> dict[str, str]:
    """Canonical name → version of ``installed`` without mirrorgate, which must be
    mirrorgate ``version`` plus exactly the locked distributions."""
    found = {str(canonicalize_name(name)): v for name, v in installed.items()}
    if found.pop("mirrorgate", None) != version:
        raise SbomError(f"the image does not hold mirrorgate {version}")
    _same("the image", found, "image/requirements.lock", locked_in_image())
    return found


def bom(
    version: str, installed: Mapping[str, str], debian: Sequence[DebianPackage], distro: str
) -> dict[str, Any]:
    """The SBOM of an image of mirrorgate ``version`` holding ``installed`` (name → version,
    the locked distributions plus mirrorgate itself) and the Debian packages ``debian`` of
    ``distro`` (release/dpkg.py), in that order, each part sorted."""
    components = [
        {"type": "library", "bom-ref": purl, "name": name, "version": v, "purl": purl}
        for name, v in sorted(locked_distributions(version, installed).items())
        for purl in [pypi_purl(name, v)]
    ]
    components += [
        {
            "type": "library",
            "bom-ref": purl,
            "name": package.name,
            "version": package.version,
            "purl": purl,
        }
        for package in sorted(debian)
        for purl in [deb_purl(package, distro)]
    ]
    serial = uuid.uuid5(
        uuid.NAMESPACE_URL, "mirrorgate-sbom:" + json.dumps([version, components], sort_keys=True)
    )
    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{serial}",
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "bom-ref": "mirrorgate-image",
                "name": "mirrorgate",
                "version": version,
            },
            "tools": {
                "components": [
                    {"type": "application", "name": "release/sbom.py", "version": version}
                ]
            },
        },
        "components": components,
    }


def components_of(document: Mapping[str, Any]) -> Components:
    """An SBOM's PyPI and Debian components (checking the envelope, and that each purl is
    its component's name and version), refusing any other kind and a duplicate."""
    if document.get("bomFormat") != "CycloneDX" or document.get("specVersion") != SPEC_VERSION:
        raise SbomError(f"not a CycloneDX {SPEC_VERSION} document")
    python: dict[str, str] = {}
    debian: dict[DebianPackage, str] = {}
    for component in document.get("components", []):
        name, version, purl = component["name"], component["version"], str(component.get("purl"))
        refused = SbomError(
            f"component {name!r}: a duplicate, or its purl {purl!r} is not its "
            "PyPI or Debian name and version"
        )
        if purl.startswith("pkg:pypi/"):
            if purl != pypi_purl(name, version) or canonicalize_name(name) in python:
                raise refused
            python[canonicalize_name(name)] = version
        elif purl.startswith("pkg:deb/"):
            qualifiers = PackageURL.from_string(purl).qualifiers
            package = DebianPackage(name, version, qualifiers.get("arch", ""))
            distro = qualifiers.get("distro", "")
            if purl != deb_purl(package, distro) or package in debian:
                raise refused
            debian[package] = distro
        else:
            raise refused
    if not debian:
        raise SbomError("lists no Debian package: the image's dpkg database is missing")
    distros = sorted(set(debian.values()))
    if len(distros) != 1:
        raise SbomError(f"the Debian packages are of {len(distros)} distros, {distros}, not one")
    return Components(python, sorted(debian), distros[0])


def check(document: Mapping[str, Any]) -> Components:
    """An SBOM lists exactly the locked distributions the image holds, and Debian packages."""
    listed = components_of(document)
    _same("the SBOM", listed.python, "image/requirements.lock", locked_in_image())
    return listed


def _same(what: str, found: Mapping[str, str], reference: str, expected: Mapping[str, str]) -> None:
    problems = [
        f"{name} {version} is not in {reference}"
        for name, version in sorted(found.items())
        if name not in expected
    ]
    problems += [
        f"{name} {version} is missing"
        for name, version in sorted(expected.items())
        if name not in found
    ]
    problems += [
        f"{name} is {found[name]}, {reference} pins {version}"
        for name, version in sorted(expected.items())
        if name in found and found[name] != version
    ]
    if problems:
        raise SbomError(f"{what} disagrees with {reference}: " + "; ".join(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m release.sbom",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", required=True, help="the release's version")
    parser.add_argument(
        "--debian", required=True, type=Path, help="the image's dpkg-query listing (dpkg.FORMAT)"
    )
    parser.add_argument("--os-release", required=True, type=Path, help="the image's os-release")
    args = parser.parse_args(argv)
    try:
        listing = json.load(sys.stdin)
        if not isinstance(listing, dict):
            raise SbomError("the image's listing is not a JSON object")
        debian = packages_of(args.debian.read_text())
        document = bom(args.version, listing, debian, distro_of(args.os_release.read_text()))
    except (SbomError, DpkgError, ValueError, OSError) as error:
        print(f"release.sbom: {error}", file=sys.stderr)
        return 1
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
