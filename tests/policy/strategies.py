"""Testing strategies for Hypothesis-based tests of the policy package.

References are built from the grammar in ``policy/reference.py``; policies and
Pods are built from small pools of hosts and paths, so that generated images
actually meet generated rules (sources, mirrors, exclusions, credentials).

Mirrors are always ``<host>/m<i>`` with one distinct path component per rule:
that is the shape of the policy contract's examples and keeps mirror prefixes
disjoint (nested mirror prefixes are a separate, explicit test).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from mirrorgate import policy

# --- image references ------------------------------------------------------

_ALNUM = st.text("abcxyz0189", min_size=1, max_size=5)
_SEPARATOR = st.sampled_from([".", "_", "__", "-", "--"])


@st.composite
def path_components(draw: st.DrawFn) -> str:
    """One repository path component: alphanumerics joined by separators."""
    parts = [draw(_ALNUM)]
    for _ in range(draw(st.integers(0, 2))):
        parts.append(draw(_SEPARATOR))
        parts.append(draw(_ALNUM))
    return "".join(parts)


def paths(max_components: int = 4) -> st.SearchStrategy[str]:
    """A repository path of whole components."""
    return st.lists(path_components(), min_size=1, max_size=max_components).map("/".join)


_DOMAIN_COMPONENT = st.one_of(
    _ALNUM, st.tuples(_ALNUM, st.sampled_from(["-", "--"]), _ALNUM).map("".join)
)


@st.composite
def domains(draw: st.DrawFn) -> str:
    """A registry ``host[:port]`` that normalisation reads as a domain."""
    kind = draw(st.sampled_from(["dotted", "port", "localhost", "ipv6", "upper"]))
    port = draw(st.integers(1, 65535))
    if kind == "localhost":
        return draw(st.sampled_from(["localhost", f"localhost:{port}"]))
    if kind == "ipv6":
        return draw(st.sampled_from(["[::1]", "[2001:db8::1]", "[fe80::1:2]"])) + f":{port}"
    labels = draw(st.lists(_DOMAIN_COMPONENT, min_size=1, max_size=3))
    if kind == "dotted":
        return ".".join([*labels, "example"])
    if kind == "upper":
        return ".".join(labels).upper() + "X"
    return f"{'.'.join(labels)}:{port}"


def tags() -> st.SearchStrategy[str]:
    """A tag by the grammar ``[\\w][\\w.-]{0,127}`` (kept short)."""
    return st.tuples(st.sampled_from("aZ09_"), st.text("aZ09_.-", max_size=8)).map("".join)


def digests() -> st.SearchStrategy[str]:
    """A digest a container runtime accepts: sha256, sha384 or sha512, lower-case hex."""
    return st.sampled_from([("sha256", 32), ("sha384", 48), ("sha512", 64)]).flatmap(
        lambda alg: st.binary(min_size=alg[1], max_size=alg[1]).map(
            lambda raw: f"{alg[0]}:{raw.hex()}"
        )
    )


@st.composite
def suffixes(draw: st.DrawFn) -> str:
    """``[:tag][@digest]`` in any of the four combinations."""
    tag = draw(st.none() | tags())
    digest = draw(st.none() | digests())
    return (f":{tag}" if tag is not None else "") + (f"@{digest}" if digest is not None else "")


@st.composite
def references(draw: st.DrawFn) -> str:
    """A valid reference as a user might write it: familiar, Docker Hub or another host."""
    kind = draw(st.sampled_from(["familiar", "hub", "index", "host"]))
    path = draw(paths())
    if kind == "familiar" and "." not in path.split("/")[0]:
        name = path  # a dotted first component would be read as a host
    elif kind in ("familiar", "hub"):
        name = f"docker.io/{path}"
    elif kind == "index":
        name = f"index.docker.io/{path}"
    else:
        name = f"{draw(domains())}/{path}"
    return name + draw(suffixes())


# --- policies ----------------------------------------------------------------

SOURCE_HOSTS = (
    "docker.io",
    "index.docker.io",
    "registry-1.docker.io",
    "quay.io",
    "ghcr.io",
    "gcr.io",
    "eu.gcr.io",
    "registry.k8s.io",
    "localhost:5000",
    "registry:5000",
)
SOURCE_PATHS = ("prometheus", "org", "org/team", "library")
WILDCARDS = ("*.gcr.io", "*.corp.example", "*.k8s.io")
MIRROR_HOSTS = ("mirror.corp.example", "mirror.corp.example:8443", "localhost:5001")
CREDENTIALS = ("cred-a", "cred-b")
NAMESPACES = ("default", "team-a", "team-b", "prod", "kube-system")
NAMESPACE_GLOBS = ("*", "team-*", "prod", "default")
IMAGE_GLOBS = ("registry.k8s.io/pause:*", "docker.io/library/busybox", "quay.io/org/*", "*:v1*")


def _canonical(source: str) -> str:
    host, slash, rest = source.partition("/")
    if host in ("index.docker.io", "registry-1.docker.io"):
        host = "docker.io"
    return host + slash + rest


@st.composite
def sources(draw: st.DrawFn) -> str:
    """A rule source: a host, a host plus path prefix, or a wildcard host."""
    kind = draw(st.sampled_from(["host", "path", "wildcard"]))
    if kind == "wildcard":
        return draw(st.sampled_from(WILDCARDS))
    host = draw(st.sampled_from(SOURCE_HOSTS))
    if kind == "host":
        return host
    return f"{host}/{draw(st.sampled_from(SOURCE_PATHS))}"


@st.composite
def policy_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid policy document (as decoded from YAML)."""
    rule_sources = draw(st.lists(sources(), min_size=1, max_size=5, unique_by=_canonical))
    mirrors: list[dict[str, Any]] = []
    for i, source in enumerate(rule_sources):
        rule: dict[str, Any] = {
            "source": source,
            "mirror": f"{draw(st.sampled_from(MIRROR_HOSTS))}/m{i}",
        }
        credential = draw(st.none() | st.sampled_from(CREDENTIALS))
        if credential is not None:
            rule["credential"] = credential
        mirrors.append(rule)
    credentials = {
        name: {
            "namespaces": draw(st.lists(st.sampled_from(NAMESPACE_GLOBS), min_size=1, max_size=2))
        }
        for name in CREDENTIALS
        if draw(st.booleans()) or any(r.get("credential") == name for r in mirrors)
    }
    document: dict[str, Any] = {"mirrors": mirrors, "credentials": credentials}
    if draw(st.booleans()):
        document["exclude"] = {
            "images": draw(st.lists(st.sampled_from(IMAGE_GLOBS), max_size=2)),
            "namespaces": draw(st.lists(st.sampled_from(("prod", "team-b")), max_size=1)),
        }
    return document


def policies() -> st.SearchStrategy[policy.Policy]:
    """A loaded :class:`policy.Policy`."""
    return policy_documents().map(policy.load)


# --- images and Pods ---------------------------------------------------------

INVALID_IMAGES = (
    "",
    " nginx",
    "nginx:",
    "Nginx",
    "docker/Docker",
    "ubuntu\n",
    "a" * 64,
    "nginx@sha256:abc",
    "[::1]:5000",
    "nginx@md5:" + "0" * 32,
)


@st.composite
def pooled_images(draw: st.DrawFn) -> str:
    """An image on one of the hosts the policy strategies know about."""
    host = draw(
        st.sampled_from(
            (
                "",
                "docker.io/",
                "index.docker.io/",
                "registry-1.docker.io/",
                "quay.io/",
                "ghcr.io/",
                "gcr.io/",
                "eu.gcr.io/",
                "asia.eu.gcr.io/",
                "registry.k8s.io/",
                "localhost:5000/",
                "registry:5000/",
                "a.corp.example/",
                "eu.gcr.io:443/",
            )
        )
    )
    first = draw(st.sampled_from((*SOURCE_PATHS, "pause", "busybox", "nginx")))
    rest = draw(st.lists(path_components(), max_size=2))
    return host + "/".join([first, *rest]) + draw(suffixes())


@st.composite
def mirrored_images(draw: st.DrawFn, mirrors: Sequence[str] = ()) -> str:
    """An image already under one of ``mirrors`` (or a mirror-like prefix of the pools)."""
    if mirrors:
        prefix = draw(st.sampled_from(mirrors))
    else:
        prefix = f"{draw(st.sampled_from(MIRROR_HOSTS))}/m{draw(st.integers(0, 4))}"
    return f"{prefix}/{draw(paths(2))}{draw(suffixes())}"


@st.composite
def source_images(draw: st.DrawFn, sources: Sequence[str]) -> str:
    """An image under one of the rule ``sources`` (a subdomain for a wildcard)."""
    source = draw(st.sampled_from(sources))
    if source.startswith("*."):
        source = f"{draw(_DOMAIN_COMPONENT)}{source[1:]}"
    return f"{source}/{draw(paths(2))}{draw(suffixes())}"


@st.composite
def images(draw: st.DrawFn, mirrors: Sequence[str] = (), sources: Sequence[str] = ()) -> str:
    """Any image string a Pod may carry: under a source or a mirror, random, or invalid."""
    n = draw(st.integers(0, 9))
    if sources and n < 3:
        return draw(source_images(sources))
    if n < 5:
        return draw(pooled_images())
    if n < 7:
        return draw(references())
    if n < 9:
        return draw(mirrored_images(mirrors))
    return draw(st.sampled_from(INVALID_IMAGES))


_CONTAINER_NAMES = st.sampled_from(("app", "web", "init", "debug", "side-car", "a", "b"))


@st.composite
def container_lists(
    draw: st.DrawFn, mirrors: Sequence[str] = (), sources: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Containers with distinct names and images from :func:`images`."""
    names = draw(st.lists(_CONTAINER_NAMES, max_size=3, unique=True))
    return [{"name": name, "image": draw(images(mirrors, sources))} for name in names]


@st.composite
def pods(
    draw: st.DrawFn, mirrors: Sequence[str] = (), sources: Sequence[str] = ()
) -> dict[str, Any]:
    """A Pod with a mix of container kinds, maybe prior annotations and pull secrets."""
    spec: dict[str, Any] = {}
    for field in policy.CONTAINER_FIELDS:
        if draw(st.booleans()):
            spec[field] = draw(container_lists(mirrors, sources))
    if draw(st.booleans()):
        # Image volumes among others, named like containers: their keys must not collide.
        spec["volumes"] = [
            {"name": name, "image": {"reference": draw(images(mirrors, sources))}}
            if draw(st.booleans())
            else {"name": name, "emptyDir": {}}
            for name in draw(st.lists(_CONTAINER_NAMES, max_size=3, unique=True))
        ]
    if draw(st.booleans()):
        secrets = draw(
            st.lists(
                st.sampled_from(("regcred", *(policy.pull_secret_name(c) for c in CREDENTIALS))),
                max_size=3,
            )
        )
        spec["imagePullSecrets"] = [{"name": s} for s in secrets]
    metadata: dict[str, Any] = dict(
        draw(st.sampled_from([{"name": "app"}, {"generateName": "app-"}, {}]))
    )
    if draw(st.booleans()):
        annotations: dict[str, str] = {"team": "a"}
        if draw(st.booleans()):
            existing = {
                f"containers/{n}": draw(images(mirrors))
                for n in draw(st.lists(_CONTAINER_NAMES, max_size=2, unique=True))
            }
            annotations[policy.ORIGINAL_IMAGES_ANNOTATION] = json.dumps(existing)
        metadata["annotations"] = annotations
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "spec": spec}
    with_metadata: bool = bool(metadata) or draw(st.booleans())
    if with_metadata:
        pod["metadata"] = metadata
    return pod


def namespaces() -> st.SearchStrategy[str]:
    """A namespace from the pool the grant and exclusion globs refer to."""
    return st.sampled_from(NAMESPACES)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], str, policy.Policy]:
    """A policy, a Pod whose images may already sit under its mirrors, and a namespace."""
    document = draw(policy_documents())
    mirrors = [rule["mirror"] for rule in document["mirrors"]]
    sources = [rule["source"] for rule in document["mirrors"]]
    return draw(pods(mirrors, sources)), draw(namespaces()), policy.load(document)


@st.composite
def respellings(draw: st.DrawFn, image: str) -> str:
    """``image`` with its host spelled another way the network reads as the same host:
    letters in any case, and ``:443`` added where no port is written (HTTPS's default).

    A familiar name (no host written) is returned as it is, and so is a first component
    that is a host only by its upper case (``0X/app``): in lower case the grammar reads it
    as a Docker Hub namespace, another registry altogether.
    """
    try:
        ref = policy.parse_normalized(image)
    except policy.InvalidReferenceError:
        return image
    if not image.startswith(f"{ref.domain}/"):
        return image
    if ref.domain.lower() != "localhost" and not any(c in ref.domain for c in ".:"):
        return image
    host = "".join(c.upper() if draw(st.booleans()) else c.lower() for c in ref.domain)
    if re.search(r":[0-9]+\Z", host) is None and draw(st.booleans()):
        host += ":443"
    return host + image[len(ref.domain) :]
