"""Which rule an image falls under, and the name it gets on the mirror."""

from __future__ import annotations

import pytest

from mirrorgate import policy
from mirrorgate.policy import matching, reference
from mirrorgate.policy.rules import Mirror, MirrorRule, Source

SHA256 = "sha256:" + "0123456789abcdef" * 4

ISSUE_RULES = [
    {"source": "docker.io", "mirror": "harbor.corp.example/dockerhub-proxy"},
    {"source": "quay.io/prometheus", "mirror": "mirror.corp.example/prometheus"},
    {"source": "*.gcr.io", "mirror": "mirror.corp.example/gcr"},
]

PRECEDENCE_RULES = [
    {"source": "quay.io", "mirror": "m.example/quay"},  # 0
    {"source": "quay.io/org", "mirror": "m.example/quay-org"},  # 1
    {"source": "quay.io/org/team", "mirror": "m.example/quay-team"},  # 2
    {"source": "*.gcr.io", "mirror": "m.example/gcr"},  # 3
    {"source": "*.eu.gcr.io", "mirror": "m.example/eu-gcr"},  # 4
    {"source": "eu.gcr.io", "mirror": "m.example/eu-gcr-exact"},  # 5
    {"source": "*.example.com", "mirror": "m.example/any"},  # 6
    {"source": "localhost:5000", "mirror": "m.example/local"},  # 7
    {"source": "registry:5000/x", "mirror": "m.example/reg"},  # 8
    {"source": "docker.io/library", "mirror": "m.example/official"},  # 9
    {"source": "docker.io", "mirror": "m.example/hub"},  # 10
]


def _policy(rules: list[dict[str, str]]) -> policy.Policy:
    return policy.load({"mirrors": rules})


# image, outcome, index of the deciding rule (None when no rule)
PRECEDENCE = [
    pytest.param("quay.io/org/team/app:v1", "rewrite", 2, id="longest-path-prefix"),
    pytest.param("quay.io/org/other:v1", "rewrite", 1, id="shorter-path-prefix"),
    pytest.param("quay.io/org", "rewrite", 1, id="path-equal-to-prefix"),
    pytest.param("quay.io/organisation/app", "rewrite", 0, id="prefix-is-whole-components"),
    pytest.param("quay.io/app", "rewrite", 0, id="exact-host"),
    pytest.param("eu.gcr.io/p/app", "rewrite", 5, id="exact-host-beats-wildcard"),
    pytest.param("x.eu.gcr.io/p/app", "rewrite", 4, id="longest-wildcard"),
    pytest.param("us.gcr.io/p/app", "rewrite", 3, id="wildcard"),
    pytest.param("a.b.us.gcr.io/p/app", "rewrite", 3, id="wildcard-deep-subdomain"),
    pytest.param("gcr.io/p/app", "unmatched", None, id="wildcard-not-bare-suffix"),
    pytest.param("evilgcr.io/p/app", "unmatched", None, id="wildcard-label-boundary"),
    pytest.param("us.gcr.io.evil.net/p/app", "unmatched", None, id="wildcard-suffix-only"),
    pytest.param("example.com/app", "unmatched", None, id="wildcard-not-apex"),
    pytest.param("localhost:5000/app", "rewrite", 7, id="host-with-port"),
    pytest.param("localhost/app", "unmatched", None, id="port-is-part-of-host"),
    pytest.param("localhost:5001/app", "unmatched", None, id="other-port"),
    pytest.param("registry:5000/x/y", "rewrite", 8, id="dotless-host-port-with-path"),
    pytest.param("registry:5000/z", "unmatched", None, id="dotless-host-port-other-path"),
    pytest.param("registry/x/y", "rewrite", 10, id="dotless-host-is-hub-org"),
    pytest.param("nginx", "rewrite", 9, id="familiar-official"),
    pytest.param("bitnami/redis", "rewrite", 10, id="familiar-org"),
    pytest.param("index.docker.io/library/nginx", "rewrite", 9, id="index-alias"),
    pytest.param("registry-1.docker.io/library/nginx", "rewrite", 9, id="registry-1-alias"),
    pytest.param("registry-1.docker.io/bitnami/redis", "rewrite", 10, id="registry-1-alias-org"),
    pytest.param("ghcr.io/org/app", "unmatched", None, id="no-rule"),
    pytest.param("m.example/quay/app", "on-mirror", 0, id="on-mirror"),
    pytest.param("m.example/quay-org/app", "on-mirror", 1, id="on-mirror-sibling-path"),
    pytest.param("m.example/quay", "on-mirror", 0, id="mirror-path-itself"),
    pytest.param("m.example/quayx/app", "unmatched", None, id="mirror-prefix-whole-components"),
    pytest.param("quay.io/Org/app", "invalid", None, id="upper-case-path-invalid"),
]


@pytest.mark.parametrize(("image", "outcome", "index"), PRECEDENCE)
def test_precedence(image: str, outcome: str, index: int | None) -> None:
    """The most specific source wins: longest path prefix, then host, then longest wildcard."""
    found = _policy(PRECEDENCE_RULES).resolve(image)
    assert found.outcome == outcome
    assert (found.rule.index if found.rule is not None else None) == index


# rules, image, rewritten image
REWRITES = [
    pytest.param(
        ISSUE_RULES,
        "nginx:1.25",
        "harbor.corp.example/dockerhub-proxy/library/nginx:1.25",
        id="issue-familiar",
    ),
    pytest.param(
        ISSUE_RULES,
        "quay.io/prometheus/node-exporter:v1.8",
        "mirror.corp.example/prometheus/node-exporter:v1.8",
        id="issue-path-prefix",
    ),
    pytest.param(
        ISSUE_RULES,
        "eu.gcr.io/p/app",
        "mirror.corp.example/gcr/eu.gcr.io/p/app",
        id="issue-wildcard-keeps-host",
    ),
    pytest.param(
        ISSUE_RULES,
        "nginx",
        "harbor.corp.example/dockerhub-proxy/library/nginx",
        id="no-latest-added",
    ),
    pytest.param(
        ISSUE_RULES,
        f"nginx@{SHA256}",
        f"harbor.corp.example/dockerhub-proxy/library/nginx@{SHA256}",
        id="digest",
    ),
    pytest.param(
        ISSUE_RULES,
        f"nginx:1.25@{SHA256}",
        f"harbor.corp.example/dockerhub-proxy/library/nginx:1.25@{SHA256}",
        id="tag-and-digest",
    ),
    pytest.param(
        ISSUE_RULES,
        "docker.io/bitnami/redis:7",
        "harbor.corp.example/dockerhub-proxy/bitnami/redis:7",
        id="hub-org",
    ),
    pytest.param(
        ISSUE_RULES,
        "index.docker.io/library/nginx:1",
        "harbor.corp.example/dockerhub-proxy/library/nginx:1",
        id="index-alias",
    ),
    pytest.param(
        ISSUE_RULES,
        "quay.io/prometheus:v2",
        "mirror.corp.example/prometheus:v2",
        id="image-equal-to-source-path",
    ),
    pytest.param(
        [{"source": "localhost:5000", "mirror": "mirror.corp.example:8443/local"}],
        "localhost:5000/team/app:dev",
        "mirror.corp.example:8443/local/team/app:dev",
        id="localhost-port-source",
    ),
    pytest.param(
        [{"source": "docker.io", "mirror": "localhost:5001"}],
        "nginx:1",
        "localhost:5001/library/nginx:1",
        id="mirror-without-path",
    ),
    pytest.param(
        [{"source": "[2001:db8::1]:5000", "mirror": "m.example/v6"}],
        "[2001:db8::1]:5000/app:1",
        "m.example/v6/app:1",
        id="ipv6-source",
    ),
    pytest.param(
        [{"source": "docker.io/library", "mirror": "m.example/official"}],
        "nginx:1",
        "m.example/official/nginx:1",
        id="library-prefix-stripped",
    ),
    pytest.param(
        [{"source": "*.gcr.io", "mirror": "m.example"}],
        f"us.gcr.io/p/a@{SHA256}",
        f"m.example/us.gcr.io/p/a@{SHA256}",
        id="wildcard-mirror-without-path",
    ),
]


@pytest.mark.parametrize(("rules", "image", "new_image"), REWRITES)
def test_rewrite(rules: list[dict[str, str]], image: str, new_image: str) -> None:
    """Rewritten = mirror + normalised path after the source prefix, tag and digest as written."""
    found = _policy(rules).resolve(image)
    assert (found.outcome, found.new_image) == ("rewrite", new_image)
    assert found.image == image


def test_source_path_image_with_pathless_mirror_is_not_sent_to_docker_hub() -> None:
    """An image named exactly the source prefix has no name on a pathless mirror: left as is."""
    found = _policy([{"source": "quay.io/prometheus", "mirror": "mirror.corp.example"}]).resolve(
        "quay.io/prometheus:v1"
    )
    assert found.outcome == "invalid"
    assert found.new_image is None
    assert found.error == "mirrors[0]'s mirror has no repository path to hold this image"


def test_rewrite_past_255_characters_is_invalid() -> None:
    """A mirror path that pushes the repository past 255 characters leaves the image invalid."""
    long_path = "/".join(["p" * 60] * 4)
    found = _policy([{"source": "docker.io", "mirror": f"m.example/{long_path}"}]).resolve(
        "nginx:1"
    )
    assert found.outcome == "invalid"
    assert found.error == (
        "the name on mirrors[0]'s mirror would be invalid: repository name "
        "must not be more than 255 characters"
    )


@pytest.mark.parametrize(
    ("globs", "image", "excluded"),
    [
        pytest.param(
            ["registry.k8s.io/pause:*"], "registry.k8s.io/pause:3.9", True, id="glob-with-tag"
        ),
        pytest.param(
            ["registry.k8s.io/pause:*"],
            "registry.k8s.io/pause",
            False,
            id="glob-with-tag-needs-a-tag",
        ),
        pytest.param(
            ["registry.k8s.io/pause:*"],
            f"registry.k8s.io/pause:3.9@{SHA256}",
            True,
            id="glob-with-tag-and-digest",
        ),
        pytest.param(["docker.io/library/nginx"], "nginx:1.25", True, id="name-glob-any-tag"),
        pytest.param(["docker.io/library/nginx"], f"nginx@{SHA256}", True, id="name-glob-digest"),
        pytest.param(["docker.io/library/nginx"], "nginx-extra:1", False, id="name-glob-whole"),
        pytest.param(["nginx:*"], "nginx:1.25", False, id="familiar-glob-never-matches"),
        pytest.param(["docker.io/library/*"], "nginx:1", True, id="normalised-library"),
        # Behaviour change (issue 28): a glob's host is compared as the network
        # sees it, so an alias in a glob means Docker Hub, as in the image.
        pytest.param(
            ["index.docker.io/*"],
            "index.docker.io/library/nginx",
            True,
            id="alias-glob-is-docker-io",
        ),
        pytest.param(["index.docker.io/*"], "nginx:1", True, id="alias-glob-familiar-image"),
        pytest.param(["*:debug"], "quay.io/a/b:debug", True, id="tag-glob"),
        pytest.param(["quay.io/a/?"], "quay.io/a/b", True, id="question-mark"),
        pytest.param(["quay.io/a/[bc]"], "quay.io/a/d", False, id="character-class"),
    ],
)
def test_image_exclusion(globs: list[str], image: str, excluded: bool) -> None:
    """Image globs match the normalised reference, or its name for any tag and digest."""
    loaded = policy.load(
        {
            "mirrors": [
                {"source": "docker.io", "mirror": "m.example/hub"},
                {"source": "quay.io", "mirror": "m.example/quay"},
                {"source": "registry.k8s.io", "mirror": "m.example/k8s"},
                {"source": "index.docker.io/x", "mirror": "m.example/x"},
            ],
            "exclude": {"images": globs},
        }
    )
    assert (loaded.resolve(image).outcome == "excluded") is excluded


def test_excluded_before_on_mirror() -> None:
    """An exclusion glob wins even over an image already on a mirror."""
    loaded = policy.load(
        {
            "mirrors": [{"source": "docker.io", "mirror": "m.example/hub"}],
            "exclude": {"images": ["m.example/*"]},
        }
    )
    assert loaded.resolve("m.example/hub/library/nginx").outcome == "excluded"


@pytest.mark.parametrize(
    ("image", "error"),
    [
        pytest.param("Nginx", "repository name must be lowercase", id="upper-case"),
        pytest.param("nginx:", "invalid reference format", id="empty-tag"),
        pytest.param("nginx@sha256:" + "a" * 63, "invalid sha256 digest length", id="digest"),
    ],
)
def test_invalid_image(image: str, error: str) -> None:
    """An unparsable image resolves to 'invalid' with the parser's reason."""
    found = _policy(ISSUE_RULES).resolve(image)
    assert (found.outcome, found.error, found.rule, found.new_image) == (
        "invalid",
        error,
        None,
        None,
    )


def test_resolution_is_pure() -> None:
    """Resolving the same string twice gives equal answers (the admission cache keeps one)."""
    loaded = _policy(ISSUE_RULES)
    assert loaded.resolve("nginx") == loaded.resolve("nginx")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("a/b/c", ["a/b/c", "a/b", "a", ""], id="three"),
        pytest.param("a", ["a", ""], id="one"),
        pytest.param("ab/cd", ["ab/cd", "ab", ""], id="two"),
    ],
)
def test_prefixes(path: str, expected: list[str]) -> None:
    """Path prefixes are whole components, longest first, ending with the empty prefix."""
    assert list(matching._prefixes(path)) == expected


@pytest.mark.parametrize(
    ("source", "mirror", "image", "name"),
    [
        pytest.param(
            Source("docker.io", "", False),
            Mirror("m.example", "hub"),
            "nginx",
            "m.example/hub/library/nginx",
            id="host",
        ),
        pytest.param(
            Source("quay.io", "org", False),
            Mirror("m.example", "q"),
            "quay.io/org/a/b",
            "m.example/q/a/b",
            id="path",
        ),
        pytest.param(
            Source("quay.io", "org", False),
            Mirror("m.example", "q"),
            "quay.io/org",
            "m.example/q",
            id="path-equal",
        ),
        pytest.param(
            Source("gcr.io", "", True),
            Mirror("m.example", ""),
            "eu.gcr.io/p",
            "m.example/eu.gcr.io/p",
            id="wildcard",
        ),
    ],
)
def test_rewritten_name(source: Source, mirror: Mirror, image: str, name: str) -> None:
    """rewritten_name joins the mirror and the remainder of the path."""
    rule = MirrorRule(index=0, source=source, mirror=mirror, credentials=())
    assert matching.rewritten_name(rule, reference.parse_normalized(image)) == name


def test_rule_index_with_no_rules() -> None:
    """An empty index matches nothing."""
    index = matching.RuleIndex([])
    ref = reference.parse_normalized("nginx")
    assert (index.source_rule(ref), index.mirror_rule(ref)) == (None, None)
