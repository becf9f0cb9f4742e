"""The Debian packages of the release image, read from its dpkg database.

``release.sh`` runs ``dpkg-query -W -f`` with ``FORMAT`` below in the image
(one package a line, tab-separated) and reads the image's ``/etc/os-release``;
this module turns both into values for the SBOM, or refuses them naming the
line and what is wrong with it. Only packages dpkg
calls ``installed`` are the image's: ``config-files`` and ``not-installed``
ones left no files behind, and any other state is a broken install, refused.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["FORMAT", "DebianPackage", "DpkgError", "distro_of", "packages_of"]

# dpkg-query expands the \t and \n itself.
FORMAT = r"${Package}\t${Version}\t${Architecture}\t${db:Status-Status}\n"
FIELDS = ("package", "version", "architecture", "status")

# Debian policy 5.6.1, 5.6.12 and dpkg-architecture's names (amd64, arm64, all, ...).
_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*")
_ARCHITECTURE = re.compile(r"[a-z0-9][a-z0-9-]*")
# os-release(5): VERSION_ID and VERSION_CODENAME are lower-case letters, digits, ".", "_", "-".
_RELEASE = re.compile(r"[a-z0-9][a-z0-9._-]*")
# Left no package in the image: removed (its configuration files kept) or purged.
_ABSENT = {"config-files", "not-installed"}


class DpkgError(Exception):
    """The image's dpkg listing or os-release is not what dpkg and Debian write: says where."""


class DebianPackage(NamedTuple):
    name: str
    version: str
    architecture: str


def packages_of(listing: str) -> list[DebianPackage]:
    """The installed packages of a ``dpkg-query -W -f FORMAT`` listing, sorted by name
    and architecture (one order for the same database, whatever dpkg's)."""
    found: dict[tuple[str, str], DebianPackage] = {}
    for number, line in enumerate(listing.splitlines(), 1):
        where = f"the image's dpkg listing, line {number}"
        fields = line.split("\t")
        if len(fields) != len(FIELDS):
            raise DpkgError(
                f"{where}: {line!r} has {len(fields)} tab-separated fields, "
                f"not {len(FIELDS)} ({', '.join(FIELDS)})"
            )
        name, version, architecture, status = fields
        if not _NAME.fullmatch(name):
            raise DpkgError(f"{where}: {name!r} is not a Debian package name")
        if not _VERSION.fullmatch(version):
            raise DpkgError(f"{where}: {name}'s version {version!r} is not a Debian version")
        if not _ARCHITECTURE.fullmatch(architecture):
            raise DpkgError(
                f"{where}: {name}'s architecture {architecture!r} is not a Debian architecture"
            )
        if status in _ABSENT:
            continue
        if status != "installed":
            raise DpkgError(
                f"{where}: {name} is {status!r}, not installed: the image's packages "
                "are not a finished install"
            )
        if (name, architecture) in found:
            raise DpkgError(f"{where}: {name}:{architecture} is listed twice")
        found[name, architecture] = DebianPackage(name, version, architecture)
    if not found:
        raise DpkgError("the image's dpkg listing names no installed package")
    return [found[key] for key in sorted(found)]


def distro_of(os_release: str) -> str:
    """The package URL's ``distro`` of a Debian image: ``debian-<VERSION_ID>`` from its
    /etc/os-release (``debian-12``), or ``debian-<VERSION_CODENAME>`` where a suite has no
    number yet (testing, unstable)."""
    fields: dict[str, str] = {}
    for line in os_release.splitlines():
        key, separator, value = line.partition("=")
        if separator and not key.startswith("#"):
            fields[key.strip()] = value.strip().strip("\"'")
    if fields.get("ID") != "debian":
        raise DpkgError(f"the image's os-release says ID={fields.get('ID')!r}, not 'debian'")
    release = fields.get("VERSION_ID") or fields.get("VERSION_CODENAME", "")
    if not _RELEASE.fullmatch(release):
        raise DpkgError(
            f"the image's os-release has no VERSION_ID or VERSION_CODENAME to name the "
            f"release by (found {release!r})"
        )
    return f"debian-{release}"
