"""A Pod's container images, found where the API server keeps them: the one walk over
its container lists."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping
from typing import Literal

from mirrorgate.policy.quoting import quote

__all__ = [
    "CONTAINER_FIELDS",
    "CONTAINER_NAME_LENGTH_MAX",
    "ContainerField",
    "ImageSite",
    "as_mapping",
    "container_count",
    "container_lists",
    "find_image_sites",
    "spec_sites",
]

ContainerField = Literal["containers", "initContainers", "ephemeralContainers"]
CONTAINER_FIELDS: tuple[ContainerField, ...] = (
    "containers",
    "initContainers",
    "ephemeralContainers",
)
# Container names are DNS labels (RFC 1123); admission sees a Pod before the
# API server validates it, so a longer one can still arrive here.
CONTAINER_NAME_LENGTH_MAX = 63


@dataclasses.dataclass(slots=True)
class ImageSite:
    """One container's image in a Pod (treat it as immutable).

    Not frozen: a Pod of 20 containers makes 20 of these per admission, and a
    frozen dataclass pays an object.__setattr__ call per field.
    """

    field: ContainerField
    index: int
    name: str
    image: str
    unique: bool = True
    """No other container of the same list has this name."""

    @property
    def key(self) -> str:
        """The container's key in the original-images annotation.

        ``containers/<name>``; when the name appears more than once in its
        list (a Pod the API server refuses later, but which admission sees
        first), every such container is ``containers[<index>]/<name>``, so
        that each original is kept. Names are DNS labels, so neither form
        can be mistaken for the other.
        """
        if self.unique:
            return f"{self.field}/{self.name}"
        return f"{self.field}[{self.index}]/{self.name}"

    @property
    def shown(self) -> str:
        """The key for messages: a name beyond any valid one is quoted as a bounded prefix."""
        if len(self.name) <= CONTAINER_NAME_LENGTH_MAX:
            return self.key
        return f"{self.field}/{quote(self.name)}"

    @property
    def pointer(self) -> str:
        """JSON Pointer to the image; container names never need escaping here."""
        return f"/spec/{self.field}/{self.index}/image"


def as_mapping(value: object) -> Mapping[str, object]:
    """``value`` if it is a mapping, else an empty one: a Pod's parts as planning reads them."""
    # Decoded JSON is always a dict; the exact-type test skips the ABC machinery.
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return {}


def container_lists(
    spec: Mapping[str, object], fields: Collection[ContainerField] = CONTAINER_FIELDS
) -> Iterator[tuple[ContainerField, object]]:
    """Each of ``fields``, in the API's order, with what ``spec`` holds there (None: absent).

    The one walk over a Pod's container lists: planning, its shape key and
    admission's container count all take it.
    """
    every_field = fields is CONTAINER_FIELDS
    for field in CONTAINER_FIELDS:
        if every_field or field in fields:
            yield field, spec.get(field)


def container_count(spec: object, fields: Collection[ContainerField] = CONTAINER_FIELDS) -> int:
    """The containers in ``spec``'s lists among ``fields`` (anything but a list counts none)."""
    if type(spec) is not dict:
        return 0
    return sum(
        len(containers)
        for _, containers in container_lists(spec, fields)
        if type(containers) is list
    )


def find_image_sites(
    pod: Mapping[str, object],
    *,
    fields: Collection[ContainerField] = CONTAINER_FIELDS,
) -> tuple[list[ImageSite], list[str]]:
    """Every container image of ``pod`` in ``fields``, and warnings for malformed ones."""
    return spec_sites(as_mapping(pod.get("spec")), fields)


def spec_sites(
    spec: Mapping[str, object], fields: Collection[ContainerField] = CONTAINER_FIELDS
) -> tuple[list[ImageSite], list[str]]:
    """:func:`find_image_sites` on a Pod's ``spec``."""
    sites: list[ImageSite] = []
    warnings: list[str] = []
    for field, containers in container_lists(spec, fields):
        if containers is None:
            continue
        if not isinstance(containers, list):
            warnings.append(f"spec.{field} is not a list; left as written")
            continue
        first = len(sites)
        _find_sites(field, containers, sites, warnings)
        if len(sites) - first > 1:
            _mark_repeated_names(sites[first:])
    return sites, warnings


def _mark_repeated_names(sites: list[ImageSite]) -> None:
    names = [site.name for site in sites]
    if len(set(names)) == len(names):
        return
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    for site in sites:
        site.unique = seen[site.name] == 1


def _find_sites(
    field: ContainerField, containers: list[object], sites: list[ImageSite], warnings: list[str]
) -> None:
    for index, container in enumerate(containers):
        # Exact-type tests first: decoded JSON is dicts and strs, and this
        # loop runs for every container of every Pod.
        if type(container) is dict:
            name, image = container.get("name"), container.get("image")
            if type(name) is str and name and type(image) is str:
                sites.append(ImageSite(field, index, name, image))
                continue
        if not isinstance(container, Mapping):
            warnings.append(f"spec.{field}[{index}] is not a mapping; left as written")
            continue
        name, image = container.get("name"), container.get("image")
        if not isinstance(name, str) or not name:
            warnings.append(f"spec.{field}[{index}] has no name; left as written")
        elif image is None:
            continue  # the API server reports a missing image itself
        elif not isinstance(image, str):
            where = (
                f"{field}/{name}"
                if len(name) <= CONTAINER_NAME_LENGTH_MAX
                else f"{field}/{quote(name)}"
            )
            warnings.append(f"{where}: image is not a string; left as written")
        else:
            sites.append(ImageSite(field, index, name, image))
