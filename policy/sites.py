"""A Pod's images, found where the API server keeps them: the one walk over its container
lists and its image volumes."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping
from typing import Literal

from mirrorgate.policy.quoting import quote

__all__ = [
    "CONTAINER_FIELDS",
    "CONTAINER_NAME_LENGTH_MAX",
    "NEVER",
    "SITE_FIELDS",
    "VOLUMES",
    "ContainerField",
    "ImageSite",
    "SiteField",
    "as_mapping",
    "container_count",
    "container_lists",
    "find_image_sites",
    "image_volumes",
    "spec_sites",
]

ContainerField = Literal["containers", "initContainers", "ephemeralContainers"]
CONTAINER_FIELDS: tuple[ContainerField, ...] = (
    "containers",
    "initContainers",
    "ephemeralContainers",
)
VOLUMES: Literal["volumes"] = "volumes"
SiteField = Literal["containers", "initContainers", "ephemeralContainers", "volumes"]
"""Where a Pod names an image: its three container lists, and ``spec.volumes[].image.reference``
(image volumes, beta and on by default since Kubernetes 1.35)."""
SITE_FIELDS: tuple[SiteField, ...] = (*CONTAINER_FIELDS, VOLUMES)
NEVER = "Never"
"""The pull policy under which the kubelet never pulls (``imagePullPolicy``, an image
volume's ``pullPolicy``)."""
# Container (and volume) names are DNS labels (RFC 1123); admission sees a Pod before the
# API server validates it, so a longer one can still arrive here.
CONTAINER_NAME_LENGTH_MAX = 63


@dataclasses.dataclass(slots=True)
class ImageSite:
    """One container's image, or one image volume's reference, in a Pod (treat it as immutable).

    Not frozen: a Pod of 20 containers makes 20 of these per admission, and a
    frozen dataclass pays an object.__setattr__ call per field.
    """

    field: SiteField
    index: int
    name: str
    image: str
    unique: bool = True
    """No other container of the same list has this name."""
    pull_never: bool = False
    """Its ``imagePullPolicy`` (an image volume's ``pullPolicy``) is ``Never``: the kubelet
    runs only what the node already has."""

    @property
    def key(self) -> str:
        """The site's key in the original-images annotation.

        ``<field>/<name>``: ``containers/<name>``, ``initContainers/<name>``,
        ``ephemeralContainers/<name>``, and ``volumes/<name>`` for an image
        volume. The list comes first, so a volume's key can never be a
        container's, whatever the names. When the name appears more than once
        in its list (a Pod the API server refuses later, but which admission
        sees first), every such site is ``<field>[<index>]/<name>``, so that
        each original is kept. Names are DNS labels, so neither form can be
        mistaken for the other.
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
        """JSON Pointer to the image; names never need escaping here."""
        if self.field == VOLUMES:
            return f"/spec/volumes/{self.index}/image/reference"
        return f"/spec/{self.field}/{self.index}/image"


def as_mapping(value: object) -> Mapping[str, object]:
    """``value`` if it is a mapping, else an empty one: a Pod's parts as planning reads them."""
    # Decoded JSON is always a dict; the exact-type test skips the ABC machinery.
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return {}


def container_lists(
    spec: Mapping[str, object], fields: Collection[SiteField] = CONTAINER_FIELDS
) -> Iterator[tuple[ContainerField, object]]:
    """Each container list among ``fields``, in the API's order, with what ``spec`` holds
    there (None: absent).

    The one walk over a Pod's container lists: planning, its shape key and
    admission's container count all take it.
    """
    every_field = fields is CONTAINER_FIELDS or fields is SITE_FIELDS
    for field in CONTAINER_FIELDS:
        if every_field or field in fields:
            yield field, spec.get(field)


def image_volumes(spec: Mapping[str, object]) -> Iterator[tuple[int, object]]:
    """Each volume of ``spec`` that has an ``image`` member, with its index (a walk, not a check).

    The one walk over image volumes: planning, its shape key and admission's
    count all take it. Anything but a list of volumes yields nothing here;
    :func:`spec_sites` warns of it.
    """
    volumes = spec.get(VOLUMES)
    if type(volumes) is not list:
        return
    for index, volume in enumerate(volumes):
        if type(volume) is dict and "image" in volume:
            yield index, volume


def container_count(spec: object, fields: Collection[SiteField] = SITE_FIELDS) -> int:
    """The images planning walks in ``spec`` among ``fields``: each container of a list
    (anything but a list counts none), and each image volume when ``fields`` has volumes."""
    if type(spec) is not dict:
        return 0
    count = sum(
        len(containers)
        for _, containers in container_lists(spec, fields)
        if type(containers) is list
    )
    if VOLUMES in fields:
        count += sum(1 for _ in image_volumes(spec))
    return count


def find_image_sites(
    pod: Mapping[str, object],
    *,
    fields: Collection[SiteField] = SITE_FIELDS,
) -> tuple[list[ImageSite], list[str]]:
    """Every image of ``pod`` in ``fields``, and warnings for malformed ones."""
    return spec_sites(as_mapping(pod.get("spec")), fields)


def spec_sites(
    spec: Mapping[str, object], fields: Collection[SiteField] = SITE_FIELDS
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
    if VOLUMES in fields:
        volumes = spec.get(VOLUMES)
        if volumes is not None and type(volumes) is not list:
            warnings.append("spec.volumes is not a list; left as written")
        first = len(sites)
        _find_volume_sites(spec, sites, warnings)
        if len(sites) - first > 1:
            _mark_repeated_names(sites[first:])
    return sites, warnings


def _shown_name(field: SiteField, name: str) -> str:
    if len(name) <= CONTAINER_NAME_LENGTH_MAX:
        return f"{field}/{name}"
    return f"{field}/{quote(name)}"


def _find_volume_sites(
    spec: Mapping[str, object], sites: list[ImageSite], warnings: list[str]
) -> None:
    for index, volume in image_volumes(spec):
        assert type(volume) is dict
        name, source = volume.get("name"), volume["image"]
        if type(name) is not str or not name:
            warnings.append(f"spec.volumes[{index}] has no name; left as written")
        elif type(source) is not dict:
            warnings.append(
                f"{_shown_name(VOLUMES, name)}: image is not a mapping; left as written"
            )
        elif type(image := source.get("reference")) is str:
            never = source.get("pullPolicy") == NEVER
            sites.append(ImageSite(VOLUMES, index, name, image, pull_never=never))
        elif image is not None:  # a missing reference, the API server reports itself
            warnings.append(
                f"{_shown_name(VOLUMES, name)}: image.reference is not a string; left as written"
            )


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
                never = container.get("imagePullPolicy") == NEVER
                sites.append(ImageSite(field, index, name, image, pull_never=never))
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
            warnings.append(f"{_shown_name(field, name)}: image is not a string; left as written")
        else:
            never = container.get("imagePullPolicy") == NEVER
            sites.append(ImageSite(field, index, name, image, pull_never=never))
