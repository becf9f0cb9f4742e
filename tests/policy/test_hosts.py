"""Hosts are compared as the network sees them: rules, exclude.images, the already-mirrored check.

The image grammar keeps a domain's case as written (the conformance corpus
holds the parser to that), but DNS and HTTPS do not tell ``Quay.IO`` or
``quay.io:443`` from ``quay.io``: the runtime pulls all three from one server.
"""

from __future__ import annotations

import pytest

from mirrorgate import policy
from mirrorgate.policy import hosts

POLICY = policy.load(
    {
        "mirrors": [
            {"source": "registry.k8s.io", "mirror": "harbor.corp.example/k8s"},  # 0
            {"source": "quay.io", "mirror": "harbor.corp.example/quay"},  # 1
            {"source": "docker.io", "mirror": "harbor.corp.example/hub"},  # 2
            {"source": "*.gcr.io", "mirror": "harbor.corp.example/gcr"},  # 3
            {"source": "ghcr.io", "mirror": "http://cache.corp.example/ghcr"},  # 4
            {"source": "registry.example", "mirror": "mirror.example:443/reg"},  # 5
        ],
        "exclude": {"images": ["registry.k8s.io/pause:*", "Docker.io:443/library/busybox"]},
    }
)

# image, outcome, the rule's index (None: no rule), image on the mirror (rewrite only)
CASES = [
    pytest.param("Registry.K8s.io/pause:3.9", "excluded", None, None, id="excluded-any-case"),
    pytest.param("registry.k8s.io:443/pause:3.9", "excluded", None, None, id="excluded-443"),
    pytest.param("registry.k8s.io/pause:3.9", "excluded", None, None, id="excluded-as-written"),
    pytest.param("busybox:1", "excluded", None, None, id="glob-host-respelled-too"),
    pytest.param("registry-1.docker.io:443/busybox", "excluded", None, None, id="glob-alias"),
    pytest.param("Harbor.Corp.Example/quay/x:1", "on-mirror", 1, None, id="mirror-any-case"),
    pytest.param("harbor.corp.example:443/quay/x:1", "on-mirror", 1, None, id="mirror-443"),
    pytest.param("Cache.Corp.Example/ghcr/x", "on-mirror", 4, None, id="http-mirror-any-case"),
    pytest.param(
        "cache.corp.example:443/ghcr/x", "unmatched", None, None, id="http-mirror-443-is-a-port"
    ),
    pytest.param("mirror.example/reg/x", "on-mirror", 5, None, id="mirror-written-with-443"),
    pytest.param(
        "quay.io:443/org/app:1",
        "rewrite",
        1,
        "harbor.corp.example/quay/org/app:1",
        id="source-443",
    ),
    pytest.param(
        "QUAY.IO/org/app", "rewrite", 1, "harbor.corp.example/quay/org/app", id="source-upper"
    ),
    pytest.param(
        "registry-1.docker.io:443/nginx:1",
        "rewrite",
        2,
        "harbor.corp.example/hub/library/nginx:1",
        id="hub-alias-443",
    ),
    pytest.param(
        "Index.Docker.io:443/library/nginx",
        "rewrite",
        2,
        "harbor.corp.example/hub/library/nginx",
        id="hub-alias-upper-443",
    ),
    pytest.param(
        "EU.gcr.io:443/p/app",
        "rewrite",
        3,
        "harbor.corp.example/gcr/eu.gcr.io/p/app",
        id="wildcard-upper-443",
    ),
    pytest.param(
        "Registry.K8s.io/kube-proxy:v1",
        "rewrite",
        0,
        "harbor.corp.example/k8s/kube-proxy:v1",
        id="rewritten-on-the-mirror-as-configured",
    ),
    pytest.param("quay.io:4443/org/app", "unmatched", None, None, id="another-port"),
    pytest.param("registry-1.docker.io:5000/nginx", "unmatched", None, None, id="hub-other-port"),
]


@pytest.mark.parametrize(("image", "outcome", "index", "new_image"), CASES)
def test_hosts_compared_as_the_network_sees_them(
    image: str, outcome: str, index: int | None, new_image: str | None
) -> None:
    """Case and HTTPS's default port do not change what a host is; another port does."""
    found = POLICY.resolve(image)
    assert found.outcome == outcome, found
    assert (found.rule.index if found.rule is not None else None) == index
    assert found.new_image == new_image


@pytest.mark.parametrize(
    ("image", "host"),
    [
        pytest.param("Quay.io:443/org/app", "quay.io", id="source"),
        pytest.param("Registry-1.Docker.io:443/nginx", "docker.io", id="hub-alias"),
        pytest.param("Harbor.Corp.Example:443/quay/x", "harbor.corp.example", id="https-mirror"),
        pytest.param("Cache.Corp.Example/ghcr/x", "cache.corp.example", id="http-mirror"),
        pytest.param("Registry.K8s.io/pause:3.9", "registry.k8s.io", id="excluded"),
    ],
)
def test_resolution_names_the_host_as_compared(image: str, host: str) -> None:
    """What explain shows: the spelling of the host that met the rule."""
    assert POLICY.resolve(image).host == host


@pytest.mark.parametrize(
    ("written", "https", "seen"),
    [
        ("Quay.IO", True, "quay.io"),
        ("quay.io:443", True, "quay.io"),
        ("quay.io:443", False, "quay.io:443"),
        ("quay.io:4430", True, "quay.io:4430"),
        ("[2001:DB8::1]:443", True, "[2001:db8::1]"),
        ("localhost:5000", True, "localhost:5000"),
    ],
)
def test_network_host(written: str, https: bool, seen: str) -> None:
    """Lower case; ``:443`` is dropped only where the host is reached over HTTPS."""
    assert hosts.network_host(written, https=https) == seen


@pytest.mark.parametrize(
    ("mirrors", "path", "fragment"),
    [
        pytest.param(
            [
                {"source": "quay.io", "mirror": "m.example/a"},
                {"source": "quay.io:443", "mirror": "m.example/b"},
            ],
            "mirrors[1].source",
            "is already the source of mirrors[0]",
            id="source-443-is-the-same-source",
        ),
        pytest.param(
            [
                {"source": "quay.io", "mirror": "m.example/a"},
                {"source": "ghcr.io", "mirror": "m.example:443/a"},
            ],
            "mirrors[1].mirror",
            "is already the mirror of mirrors[0]",
            id="mirror-443-is-the-same-mirror",
        ),
        pytest.param(
            [
                {"source": "quay.io", "mirror": "m.example/a"},
                {"source": "ghcr.io", "mirror": "m.example:443/a/b"},
            ],
            "mirrors[1].mirror",
            "mirror paths must not nest",
            id="mirror-443-nests",
        ),
        pytest.param(
            [{"source": "quay.io", "mirror": "registry-1.docker.io:443/x"}],
            "mirrors[0].mirror",
            "is Docker Hub itself, not a mirror",
            id="hub-alias-443-is-not-a-mirror",
        ),
    ],
)
def test_respellings_of_one_host_are_one_host_in_a_policy(
    mirrors: list[dict[str, str]], path: str, fragment: str
) -> None:
    """Two spellings of one source or mirror collide as the same one would."""
    with pytest.raises(policy.PolicyError) as raised:
        policy.load({"mirrors": mirrors})
    assert any(e.path == path and fragment in e.message for e in raised.value.errors), str(
        raised.value
    )


def test_http_mirror_keeps_443_as_a_port() -> None:
    """Over plain HTTP, ``:443`` is a port like any other: two mirrors, not one."""
    loaded = policy.load(
        {
            "mirrors": [
                {"source": "quay.io", "mirror": "http://m.example/a"},
                {"source": "ghcr.io", "mirror": "http://m.example:443/a"},
            ]
        }
    )
    assert loaded.resolve("m.example:443/a/x").rule == loaded.rules[1]
    assert loaded.resolve("m.example/a/x").rule == loaded.rules[0]
