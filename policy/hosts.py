"""The registry host grammar of a policy: ``host[:port]``, and a mirror's ``host[:port][/path]``.

One statement for policy files and ``mirrorgate credentials add --registry``.
"""

from __future__ import annotations

import re

from mirrorgate.policy import reference
from mirrorgate.policy.quoting import quote

__all__ = ["DOCKER_HUB_ALIASES", "canonical_host", "mirror_problem", "registry_host_problem"]

# Registries that Docker Hub answers on. distribution/reference folds only
# index.docker.io into docker.io; registry-1.docker.io is the API host that
# people copy from client logs.
DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


def canonical_host(host: str) -> str:
    """Host names are case-insensitive; Docker Hub's aliases are all docker.io."""
    host = host.lower()
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
    if host in DOCKER_HUB_ALIASES:
        return f"{_quote(value)} is Docker Hub itself, not a mirror"
    return None


def _quote(value: object) -> str:
    return quote(value, json_style=True)
