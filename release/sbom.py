"""The release's CycloneDX SBOM: the Python distributions in the image.

Made from the image itself, not from the lock: ``release.sh`` lists what the
image's interpreter has installed (``importlib.metadata``), and this module
writes that list as CycloneDX 1.5 JSON after checking it against
image/requirements.lock, so an SBOM that disagrees with the lock is never
written. The subject (``metadata.component``) is the image, mirrorgate X.Y.Z;
the components are exactly the locked distributions it holds, each with its
PyPI package URL. No timestamp, and a serial number derived from the
contents: the same image gives the same file, byte for byte.

    podman run ... python3 -c LISTING | python -m release.sbom --version X.Y.Z > FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from packaging.utils import canonicalize_name

from release.lock import locked_in_image

__all__ = ["LISTING", "bom", "components_of", "main"]

# Run by the image's python3: name → version of every installed distribution.
LISTING = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)
SPEC_VERSION = "1.5"


class SbomError(Exception):
    """The image, the lock and the SBOM disagree: says on what."""


def purl(name: str, version: str) -> str:
    return f"pkg:pypi/{canonicalize_name(name)}@{version}"


def bom(version: str, installed: Mapping[str, str]) -> dict[str, Any]:
    """The SBOM of an image of mirrorgate ``version`` holding ``installed`` (name → version),
    which must be the locked distributions plus mirrorgate itself."""
    found = {str(canonicalize_name(name)): v for name, v in installed.items()}
    if found.pop("mirrorgate", None) != version:
        raise SbomError(f"the image does not hold mirrorgate {version}")
    _same("the image", found, "image/requirements.lock", locked_in_image())
    components = [
        {
            "type": "library",
            "bom-ref": purl(name, v),
            "name": name,
            "version": v,
            "purl": purl(name, v),
        }
        for name, v in sorted(found.items())
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


def components_of(document: Mapping[str, Any]) -> dict[str, str]:
    """Canonical name → version of an SBOM's PyPI components (checking the envelope)."""
    if document.get("bomFormat") != "CycloneDX" or document.get("specVersion") != SPEC_VERSION:
        raise SbomError(f"not a CycloneDX {SPEC_VERSION} document")
    listed: dict[str, str] = {}
    for component in document.get("components", []):
        name, version = canonicalize_name(component["name"]), component["version"]
        if component.get("purl") != purl(name, version) or name in listed:
            raise SbomError(
                f"component {component['name']!r}: a duplicate, or its purl is "
                "not its PyPI name and version"
            )
        listed[name] = version
    return listed


def check(document: Mapping[str, Any]) -> None:
    """An SBOM lists exactly the locked distributions the image holds."""
    _same("the SBOM", components_of(document), "image/requirements.lock", locked_in_image())


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
    parser = argparse.ArgumentParser(prog="python -m release.sbom", description=__doc__)
    parser.add_argument("--version", required=True, help="the release's version")
    args = parser.parse_args(argv)
    try:
        listing = json.load(sys.stdin)
        if not isinstance(listing, dict):
            raise SbomError("the image's listing is not a JSON object")
        document = bom(args.version, listing)
    except (SbomError, ValueError) as error:
        print(f"release.sbom: {error}", file=sys.stderr)
        return 1
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
