"""The image-reference parser, case by case from the grammar, plus properties.

The cases are the project's own, written from the grammar in
``policy/reference.py`` (the shared Go corpus is run by test_conformance.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorgate.policy import reference
from tests.policy import strategies

SHA256 = "sha256:" + "0123456789abcdef" * 4
SHA512 = "sha512:" + "fedcba9876543210" * 8

# input, normalised str(), domain, path, tag, digest, familiar
NORMALIZED = [
    pytest.param(
        "nginx",
        "docker.io/library/nginx",
        "docker.io",
        "library/nginx",
        None,
        None,
        "nginx",
        id="familiar-name",
    ),
    pytest.param(
        "nginx:1.25",
        "docker.io/library/nginx:1.25",
        "docker.io",
        "library/nginx",
        "1.25",
        None,
        "nginx:1.25",
        id="familiar-tag",
    ),
    pytest.param(
        "docker.io/nginx",
        "docker.io/library/nginx",
        "docker.io",
        "library/nginx",
        None,
        None,
        "nginx",
        id="docker.io-adds-library",
    ),
    pytest.param(
        "docker.io/library/nginx",
        "docker.io/library/nginx",
        "docker.io",
        "library/nginx",
        None,
        None,
        "nginx",
        id="docker.io-library",
    ),
    pytest.param(
        "index.docker.io/nginx",
        "docker.io/library/nginx",
        "docker.io",
        "library/nginx",
        None,
        None,
        "nginx",
        id="index.docker.io-folded",
    ),
    pytest.param(
        "index.docker.io/bitnami/redis:7",
        "docker.io/bitnami/redis:7",
        "docker.io",
        "bitnami/redis",
        "7",
        None,
        "bitnami/redis:7",
        id="index.docker.io-org",
    ),
    pytest.param(
        "library/nginx",
        "docker.io/library/nginx",
        "docker.io",
        "library/nginx",
        None,
        None,
        "nginx",
        id="library-prefix",
    ),
    pytest.param(
        "bitnami/redis",
        "docker.io/bitnami/redis",
        "docker.io",
        "bitnami/redis",
        None,
        None,
        "bitnami/redis",
        id="hub-org",
    ),
    pytest.param(
        "library/a/b",
        "docker.io/library/a/b",
        "docker.io",
        "library/a/b",
        None,
        None,
        "library/a/b",
        id="library-nested-keeps-prefix",
    ),
    pytest.param(
        "registry-1.docker.io/nginx",
        "registry-1.docker.io/nginx",
        "registry-1.docker.io",
        "nginx",
        None,
        None,
        "registry-1.docker.io/nginx",
        id="registry-1.docker.io-not-folded",
    ),
    pytest.param(
        "localhost/app",
        "localhost/app",
        "localhost",
        "app",
        None,
        None,
        "localhost/app",
        id="localhost",
    ),
    pytest.param(
        "localhost:5000/app:v1",
        "localhost:5000/app:v1",
        "localhost:5000",
        "app",
        "v1",
        None,
        "localhost:5000/app:v1",
        id="localhost-port",
    ),
    pytest.param(
        "localhost:5000",
        "docker.io/library/localhost:5000",
        "docker.io",
        "library/localhost",
        "5000",
        None,
        "localhost:5000",
        id="bare-localhost-port-is-a-tag",
    ),
    pytest.param(
        "registry:5000/x",
        "registry:5000/x",
        "registry:5000",
        "x",
        None,
        None,
        "registry:5000/x",
        id="dotless-host-with-port",
    ),
    pytest.param(
        "registry/x",
        "docker.io/registry/x",
        "docker.io",
        "registry/x",
        None,
        None,
        "registry/x",
        id="dotless-host-without-port-is-hub-org",
    ),
    pytest.param(
        "quay.io:443/org/app",
        "quay.io:443/org/app",
        "quay.io:443",
        "org/app",
        None,
        None,
        "quay.io:443/org/app",
        id="host-port",
    ),
    pytest.param(
        "10.0.0.1:5000/app",
        "10.0.0.1:5000/app",
        "10.0.0.1:5000",
        "app",
        None,
        None,
        "10.0.0.1:5000/app",
        id="ipv4-port",
    ),
    pytest.param(
        "[2001:db8::1]:5000/x",
        "[2001:db8::1]:5000/x",
        "[2001:db8::1]:5000",
        "x",
        None,
        None,
        "[2001:db8::1]:5000/x",
        id="ipv6-port",
    ),
    pytest.param("[::1]/x:t", "[::1]/x:t", "[::1]", "x", "t", None, "[::1]/x:t", id="ipv6-no-port"),
    pytest.param(
        "Foo/bar",
        "Foo/bar",
        "Foo",
        "bar",
        None,
        None,
        "Foo/bar",
        id="upper-case-first-component-is-a-domain",
    ),
    pytest.param(
        "Registry.Example/app",
        "Registry.Example/app",
        "Registry.Example",
        "app",
        None,
        None,
        "Registry.Example/app",
        id="upper-case-domain",
    ),
    pytest.param(
        f"nginx@{SHA256}",
        f"docker.io/library/nginx@{SHA256}",
        "docker.io",
        "library/nginx",
        None,
        SHA256,
        f"nginx@{SHA256}",
        id="digest",
    ),
    pytest.param(
        f"nginx:1.25@{SHA256}",
        f"docker.io/library/nginx:1.25@{SHA256}",
        "docker.io",
        "library/nginx",
        "1.25",
        SHA256,
        f"nginx:1.25@{SHA256}",
        id="tag-and-digest",
    ),
    pytest.param(
        f"ghcr.io/o/a@{SHA512}",
        f"ghcr.io/o/a@{SHA512}",
        "ghcr.io",
        "o/a",
        None,
        SHA512,
        f"ghcr.io/o/a@{SHA512}",
        id="sha512-digest",
    ),
    pytest.param(
        "o/a__b.c-d---e/f_g:_T.a-g",
        "docker.io/o/a__b.c-d---e/f_g:_T.a-g",
        "docker.io",
        "o/a__b.c-d---e/f_g",
        "_T.a-g",
        None,
        "o/a__b.c-d---e/f_g:_T.a-g",
        id="separators-and-tag-characters",
    ),
    pytest.param(
        "a.b/c", "a.b/c", "a.b", "c", None, None, "a.b/c", id="dotted-first-component-is-a-domain"
    ),
    pytest.param(
        "x:" + "t" * 128,
        "docker.io/library/x:" + "t" * 128,
        "docker.io",
        "library/x",
        "t" * 128,
        None,
        "x:" + "t" * 128,
        id="tag-128-chars",
    ),
    pytest.param(
        "a" * 247,
        "docker.io/library/" + "a" * 247,
        "docker.io",
        "library/" + "a" * 247,
        None,
        None,
        "a" * 247,
        id="path-255-chars-with-library",
    ),
    pytest.param(
        "example.com/" + "a" * 255,
        "example.com/" + "a" * 255,
        "example.com",
        "a" * 255,
        None,
        None,
        "example.com/" + "a" * 255,
        id="path-255-chars",
    ),
    pytest.param(
        "a" * 63,
        "docker.io/library/" + "a" * 63,
        "docker.io",
        "library/" + "a" * 63,
        None,
        None,
        "a" * 63,
        id="63-chars-not-an-identifier",
    ),
    pytest.param(
        "docker.io",
        "docker.io/library/docker.io",
        "docker.io",
        "library/docker.io",
        None,
        None,
        "docker.io",
        id="bare-host-is-a-name",
    ),
]


@pytest.mark.parametrize(
    ("text", "normalized", "domain", "path", "tag", "digest", "familiar"), NORMALIZED
)
def test_parse_normalized(
    text: str,
    normalized: str,
    domain: str,
    path: str,
    tag: str | None,
    digest: str | None,
    familiar: str,
) -> None:
    """A valid reference normalises as a container runtime reads it."""
    ref = reference.parse_normalized(text)
    assert (ref.domain, ref.path, ref.tag, ref.digest) == (domain, path, tag, digest)
    assert str(ref) == normalized
    assert ref.name == f"{domain}/{path}"
    assert ref.familiar == familiar
    assert reference.parse_normalized(normalized) == ref


@pytest.mark.parametrize(
    ("text", "familiar_name"),
    [
        pytest.param("nginx:1", "nginx", id="official"),
        pytest.param("docker.io/library/nginx@" + SHA256, "nginx", id="official-digest"),
        pytest.param("bitnami/redis", "bitnami/redis", id="hub-org"),
        pytest.param("quay.io/org/app:v1", "quay.io/org/app", id="other-host"),
        pytest.param("localhost/app", "localhost/app", id="localhost"),
    ],
)
def test_familiar_name(text: str, familiar_name: str) -> None:
    """The familiar name drops docker.io and library/ only, never the tag or digest."""
    assert reference.parse_normalized(text).familiar_name == familiar_name


# input, code, reason
INVALID = [
    pytest.param("", "ErrReferenceInvalidFormat", "invalid reference format", id="empty"),
    pytest.param(
        "ubuntu:", "ErrReferenceInvalidFormat", "invalid reference format", id="empty-tag"
    ),
    pytest.param(
        " ubuntu", "ErrReferenceInvalidFormat", "invalid reference format", id="leading-space"
    ),
    pytest.param(
        "ubuntu ", "ErrReferenceInvalidFormat", "invalid reference format", id="trailing-space"
    ),
    pytest.param(
        "ubuntu\n", "ErrReferenceInvalidFormat", "invalid reference format", id="trailing-newline"
    ),
    pytest.param(
        "ubuntu:22.04\n",
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="trailing-newline-after-tag",
    ),
    pytest.param(
        "docker/Docker",
        "ErrNameContainsUppercase",
        "repository name must be lowercase",
        id="upper-case-path",
    ),
    pytest.param(
        "Nginx",
        "ErrNameContainsUppercase",
        "repository name must be lowercase",
        id="upper-case-familiar",
    ),
    pytest.param(
        "quay.io/Org/app",
        "ErrNameContainsUppercase",
        "repository name must be lowercase",
        id="upper-case-path-on-host",
    ),
    pytest.param(
        "0123456789abcdef" * 4,
        "ErrReferenceInvalidFormat",
        "cannot specify 64-byte hexadecimal strings",
        id="64-hex-identifier",
    ),
    pytest.param(
        "a" * 248,
        "ErrNameTooLong",
        "repository name must not be more than 255 characters",
        id="path-256-chars-with-library",
    ),
    pytest.param(
        "example.com/" + "a" * 256,
        "ErrNameTooLong",
        "repository name must not be more than 255 characters",
        id="path-256-chars",
    ),
    pytest.param(
        "x:" + "t" * 129,
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="tag-129-chars",
    ),
    pytest.param(
        "x:.tag", "ErrReferenceInvalidFormat", "invalid reference format", id="tag-starts-with-dot"
    ),
    pytest.param(
        "[2001:db8::1]:5000",
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="ipv6-without-path",
    ),
    pytest.param(
        "[2001:db8::1]", "ErrReferenceInvalidFormat", "invalid reference format", id="ipv6-bare"
    ),
    pytest.param(
        "2001:db8::1/x",
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="ipv6-without-brackets",
    ),
    pytest.param(
        "[fe80::1%eth0]:5000/x",
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="ipv6-zone",
    ),
    pytest.param(
        "-host.example/x",
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="domain-starts-with-dash",
    ),
    pytest.param(
        "host.example:/x", "ErrReferenceInvalidFormat", "invalid reference format", id="empty-port"
    ),
    pytest.param(
        "a//b", "ErrReferenceInvalidFormat", "invalid reference format", id="empty-path-component"
    ),
    pytest.param(
        "a/b/", "ErrReferenceInvalidFormat", "invalid reference format", id="trailing-slash"
    ),
    pytest.param(
        "a-/b",
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="component-ends-with-separator",
    ),
    pytest.param(
        "a___b", "ErrReferenceInvalidFormat", "invalid reference format", id="three-underscores"
    ),
    pytest.param("a..b", "ErrReferenceInvalidFormat", "invalid reference format", id="two-dots"),
    pytest.param(
        "nginx@sha256:" + "a" * 31,
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="digest-31-hex",
    ),
    pytest.param(
        "nginx@sha256:" + "a" * 63,
        "digest.ErrDigestInvalidLength",
        "invalid sha256 digest length",
        id="sha256-63-hex",
    ),
    pytest.param(
        "nginx@sha256:" + "a" * 65,
        "digest.ErrDigestInvalidLength",
        "invalid sha256 digest length",
        id="sha256-65-hex",
    ),
    pytest.param(
        "nginx@sha512:" + "a" * 64,
        "digest.ErrDigestInvalidLength",
        "invalid sha512 digest length",
        id="sha512-64-hex",
    ),
    pytest.param(
        "nginx@sha256:" + "A" * 64,
        "digest.ErrDigestInvalidFormat",
        "invalid digest format",
        id="sha256-upper-hex",
    ),
    pytest.param(
        "nginx:1@SHA256:" + "a" * 64,
        "digest.ErrDigestInvalidFormat",
        "invalid digest format",
        id="upper-case-algorithm",
    ),
    pytest.param(
        "nginx@SHA256:" + "a" * 64,
        "ErrNameContainsUppercase",
        "repository name must be lowercase",
        id="upper-case-algorithm-no-tag",
    ),
    pytest.param(
        "nginx@md5:" + "a" * 32,
        "digest.ErrDigestUnsupported",
        "unsupported digest algorithm 'md5'",
        id="unsupported-algorithm",
    ),
    pytest.param(
        "nginx@sha256+b64:" + "a" * 64,
        "digest.ErrDigestUnsupported",
        "unsupported digest algorithm 'sha256+b64'",
        id="unsupported-composite",
    ),
    pytest.param(
        "nginx@" + "a" * 64,
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="digest-without-algorithm",
    ),
    pytest.param(
        "nginx@sha256:" + "a" * 64 + ":x",
        "ErrReferenceInvalidFormat",
        "invalid reference format",
        id="digest-then-tag",
    ),
    pytest.param(
        "nginx:1.25:1.26", "ErrReferenceInvalidFormat", "invalid reference format", id="two-tags"
    ),
    pytest.param("ngïnx", "ErrReferenceInvalidFormat", "invalid reference format", id="non-ascii"),
]


@pytest.mark.parametrize(("text", "code", "reason"), INVALID)
def test_parse_normalized_rejects(text: str, code: str, reason: str) -> None:
    """An invalid reference raises InvalidReferenceError with the Go sentinel and reason."""
    with pytest.raises(reference.InvalidReferenceError) as caught:
        reference.parse_normalized(text)
    assert (caught.value.code, caught.value.reason) == (code, reason)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("ubuntu:", id="familiar"),
        pytest.param("ubuntu\n", id="trailing-newline"),
        pytest.param("quay.io/org/app@sha256:" + "a" * 63, id="digest-length"),
        pytest.param("a" * 248, id="too-long"),
    ],
)
def test_error_quotes_the_input(text: str) -> None:
    """The error names the reference as written, not its normalised rewrite."""
    with pytest.raises(reference.InvalidReferenceError) as caught:
        reference.parse_normalized(text)
    assert caught.value.reference == text
    assert str(caught.value) == f"invalid image reference {text!r}: {caught.value.reason}"


# input, domain, path (strict Parse: no normalisation)
STRICT = [
    pytest.param("nginx", "", "nginx", id="no-domain"),
    pytest.param("docker.io/nginx", "docker.io", "nginx", id="docker.io-not-expanded"),
    pytest.param("index.docker.io/nginx", "index.docker.io", "nginx", id="index-not-folded"),
    pytest.param("foo/bar", "foo", "bar", id="first-component-read-as-domain"),
    pytest.param("Foo/bar:1", "Foo", "bar", id="upper-case-domain"),
    pytest.param("localhost:5000", "", "localhost", id="localhost-port-is-a-tag"),
]


@pytest.mark.parametrize(("text", "domain", "path"), STRICT)
def test_parse_strict(text: str, domain: str, path: str) -> None:
    """The strict parse splits domain and path without normalising."""
    ref = reference.parse(text)
    assert (ref.domain, ref.path) == (domain, path)
    assert str(ref) == text


@pytest.mark.parametrize(
    ("text", "code"),
    [
        pytest.param("", "ErrNameEmpty", id="empty"),
        pytest.param("Nginx", "ErrNameContainsUppercase", id="upper-case"),
        pytest.param("nginx\n", "ErrReferenceInvalidFormat", id="trailing-newline"),
        pytest.param("example.com/" + "a" * 256, "ErrNameTooLong", id="too-long"),
    ],
)
def test_parse_strict_rejects(text: str, code: str) -> None:
    """The strict parse reports the Go sentinel names."""
    with pytest.raises(reference.InvalidReferenceError) as caught:
        reference.parse(text)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        pytest.param("docker.io", True, id="host"),
        pytest.param("localhost:5000", True, id="localhost-port"),
        pytest.param("[2001:db8::1]:5000", True, id="ipv6-port"),
        pytest.param("Registry.Example", True, id="upper-case"),
        pytest.param("host.example:", False, id="empty-port"),
        pytest.param("host.example/x", False, id="with-path"),
        pytest.param("-host", False, id="leading-dash"),
        pytest.param("host.example\n", False, id="trailing-newline"),
    ],
)
def test_is_valid_domain(text: str, valid: bool) -> None:
    """A registry host[:port] is recognised by the domain grammar alone."""
    assert reference.is_valid_domain(text) is valid


def test_invalid_reference_error_is_value_error() -> None:
    """InvalidReferenceError is a ValueError, so generic handlers catch it."""
    assert issubclass(reference.InvalidReferenceError, ValueError)


@settings(max_examples=100, deadline=None)
@given(strategies.references())
def test_normalized_round_trip(text: str) -> None:
    """parse_normalized(str(ref)) == ref for every valid reference."""
    ref = reference.parse_normalized(text)
    assert reference.parse_normalized(str(ref)) == ref
    first, slash, _ = ref.familiar_name.partition("/")
    if not slash or not any(c in first for c in ".:"):
        # As in Go, "docker.io/a.b/c" is familiar "a.b/c", which reads as a host.
        assert reference.parse_normalized(ref.familiar) == ref


@settings(max_examples=100, deadline=None)
@given(strategies.references())
def test_tag_and_digest_kept_as_written(text: str) -> None:
    """Normalisation never adds :latest and keeps tag and digest exactly as written."""
    before, at, digest = text.partition("@")
    last = before.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else None
    ref = reference.parse_normalized(text)
    assert (ref.tag, ref.digest) == (tag, digest or None)
    assert str(ref).endswith((f":{tag}" if tag is not None else "") + at + digest)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.text(max_size=40),
        strategies.references().map(lambda s: s + "\n"),
        st.text(alphabet="abcAB09:/@.-_[]", max_size=40),
    )
)
def test_arbitrary_text_only_raises_invalid_reference(text: str) -> None:
    """Parsing any text either succeeds or raises InvalidReferenceError, nothing else."""
    for parse in (reference.parse, reference.parse_normalized):
        try:
            ref = parse(text)
        except reference.InvalidReferenceError:
            continue
        assert isinstance(ref, reference.ImageReference)
