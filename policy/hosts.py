"""The registry host grammar of a policy: ``host[:port]``, and a mirror's ``host[:port][/path]``.

One statement for policy files and ``mirrorgate credentials add --registry``.
"""

from __future__ import annotations

import re

from mirrorgate.policy import reference
from mirrorgate.policy.quoting import quote

__all__ = [
    "DOCKER_HUB_ALIASES",
    "canonical_host",
    "mirror_problem",
    "network_host",
    "registry_host_problem",
]

# Registries that Docker Hub answers on. distribution/reference folds only
# index.docker.io into docker.io; registry-1.docker.io is the API host that
# people copy from client logs.
DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


# HTTPS's default port: ``quay.io:443`` is the same server as ``quay.io``.
_HTTPS_PORT = ":443"


def network_host(host: str, *, https: bool = True) -> str:
    """``host[:port]`` as the network sees it: the key every host comparison uses.

    The image grammar (distribution/reference) keeps a domain's case as
    written, but DNS does not tell ``Quay.IO`` from ``quay.io``; and over
    HTTPS an explicit ``:443`` reaches the server that no port reaches. So a
    host is compared in lower case and, where it is reached over HTTPS (every
    source registry; a mirror unless its rule says ``http://``), without
    ``:443``. Over plain HTTP 443 is just another port, and stays.
    """
    host = host.lower()
    if https and host.endswith(_HTTPS_PORT):
        host = host[: -len(_HTTPS_PORT)]
    return host


def canonical_host(host: str) -> str:
    """A source registry's :func:`network_host`, with Docker Hub's aliases all docker.io."""
    host = network_host(host)
    return reference.DEFAULT_DOMAIN if host in DOCKER_HUB_ALIASES else host


_PORT_RE = re.compile(r":([0-9]+)\Z")


def registry_host_problem(value: str) -> str | None:
    """Why ``value`` does not start with a registry ``host[:port]``, or None when it does.

    ``value`` may go on with ``/path``; only the host is judged here.
    """
    if "://" in value:
        return (
            "write it without a scheme such as https:// (only mirrors[].mirror takes "
            "one: http:// for a plain-HTTP mirror)"
        )
    host = value.partition("/")[0]
    if host.lower() != host:
        return "it has upper-case letters (registry hosts are written in lower case)"
    if not reference.is_valid_domain(host):
        return "the host must be letters, digits, '-' and '.', then an optional :port"
    # The test the runtime applies to the first path component: without a
    # dot, a colon or "localhost" it would be a Docker Hub namespace.
    if host != reference.LOCALHOST and not any(c in host for c in ".:"):
        return "without a '.', a ':port' or localhost it would be read as a Docker Hub name"
    # The grammar allows any digits; a connection needs a TCP port.
    port = _PORT_RE.search(host)
    if port is not None and not 1 <= int(port[1]) <= 65535:
        return f"port {port[1]} is outside 1-65535"
    return None


def mirror_problem(value: str) -> str | None:
    """Why ``value`` is not a mirror ``host[:port][/path]``, or None when it is one.

    One statement for policy files and ``mirrorgate credentials add --registry``.
    """
    problem = registry_host_problem(value)
    if problem is not None:
        return f"{_quote(value)} is not a valid registry host: {problem}"
    host, _, repo = value.rstrip("/").partition("/")
    if repo and reference.split_name(f"{host}/{repo}") != (host, repo):
        return f"{_quote(value)} has an invalid repository path {_quote(repo)}"
    if canonical_host(host) == reference.DEFAULT_DOMAIN:
        return f"{_quote(value)} is Docker Hub itself, not a mirror"
    return None


def _quote(value: object) -> str:
    return quote(value, json_style=True)
