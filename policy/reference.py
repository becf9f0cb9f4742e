"""Container image references, read the way Docker, containerd and the kubelet read them.

This is a port of the grammar and normalisation of the canonical Go package
``github.com/distribution/reference``::

    reference        := name [ ":" tag ] [ "@" digest ]
    name             := [domain '/'] remote-name
    domain           := host [':' port-number]
    host             := domain-name | "[" IPv6 "]"
    domain-name      := component ['.' component]*
    component        := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
    port-number      := /[0-9]+/
    remote-name      := path-component ['/' path-component]*
    path-component   := alpha-numeric [separator alpha-numeric]*
    alpha-numeric    := /[a-z0-9]+/
    separator        := /[_.]|__|[-]+/
    tag              := /[\\w][\\w.-]{0,127}/
    digest           := algorithm ":" encoded
    algorithm        := /[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*/
    encoded          := /[0-9a-fA-F]{32,}/

Normalisation (Go's ``ParseNormalizedNamed``): the first path component is a
domain only when it is ``localhost``, contains ``.`` or ``:``, or has an upper
case letter; otherwise the image is on ``docker.io``, and single-component
names get ``library/``. ``index.docker.io`` is canonicalised to ``docker.io``.
Tag and digest are kept exactly as written: no ``:latest`` is ever added,
because that changes the string GitOps tools compare.

Why a port rather than a library: the only Python implementation accepts a
trailing newline (``re.match`` with ``$``); every pattern here uses
``fullmatch`` with ASCII semantics, as Go's RE2 does.
"""

from __future__ import annotations

import dataclasses
import re

from mirrorgate.policy.quoting import quote

__all__ = [
    "DEFAULT_DOMAIN",
    "REFERENCE_LENGTH_MAX",
    "ImageReference",
    "InvalidReferenceError",
    "is_valid_domain",
    "parse",
    "parse_normalized",
]

DEFAULT_DOMAIN = "docker.io"
LEGACY_DEFAULT_DOMAIN = "index.docker.io"
OFFICIAL_REPO_PREFIX = "library/"
LOCALHOST = "localhost"
# Since distribution/reference aaca75e (2024) only the path is length-checked.
NAME_TOTAL_LENGTH_MAX = 255

# The longest reference any runtime can pull. The grammar bounds the path
# (255), the tag (128 after its first character: 128 in all) and, through
# the supported digest algorithms, the digest (sha512: 7 + 128); it does not
# bound the domain, but a host that is looked up cannot be longer than a DNS
# name (253 characters, RFC 1035 2.3.4; a bracketed IPv6 literal is shorter)
# and a port has at most 5 digits. Anything longer is answered "invalid"
# without being parsed, memoised or quoted whole.
HOST_LENGTH_MAX = 253
PORT_LENGTH_MAX = 5
TAG_LENGTH_MAX = 128
DIGEST_LENGTH_MAX = len("sha512:") + 128
REFERENCE_LENGTH_MAX = (
    HOST_LENGTH_MAX
    + 1
    + PORT_LENGTH_MAX
    + 1
    + NAME_TOTAL_LENGTH_MAX
    + 1
    + TAG_LENGTH_MAX
    + 1
    + DIGEST_LENGTH_MAX
)

_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_DOMAIN_NAME_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_NAME_COMPONENT}(?:\.{_DOMAIN_NAME_COMPONENT})*"
_IPV6_ADDRESS = r"\[(?:[a-fA-F0-9:]+)\]"
_HOST = rf"(?:{_DOMAIN_NAME}|{_IPV6_ADDRESS})"
_DOMAIN_AND_PORT = rf"{_HOST}(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN_AND_PORT}/)?{_REMOTE_NAME}"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9a-fA-F]{32,}"

_REFERENCE_RE = re.compile(rf"({_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII)
_NAME_RE = re.compile(rf"(?:({_DOMAIN_AND_PORT})/)?({_REMOTE_NAME})", re.ASCII)
_DOMAIN_RE = re.compile(_DOMAIN_AND_PORT, re.ASCII)
_IDENTIFIER_RE = re.compile(r"[a-f0-9]{64}", re.ASCII)

# go-digest: the algorithms a real kubelet or containerd accepts, with the
# exact hex length each one requires (lower case only).
_DIGEST_ALGORITHM_RE = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*", re.ASCII)
_DIGEST_HEX_LENGTH = {"sha256": 64, "sha384": 96, "sha512": 128}
_DIGEST_ENCODED_RE = re.compile(r"[a-f0-9]+", re.ASCII)


class InvalidReferenceError(ValueError):
    """An image reference that no container runtime would accept.

    ``reason`` names the rule that was broken, in the words of the Go package
    (for example ``"repository name must be lowercase"``); ``code`` is the
    name of the Go sentinel error, for comparison with the canonical parser.
    """

    def __init__(self, reference: str, reason: str, code: str) -> None:
        super().__init__(f"invalid image reference {quote(reference)}: {reason}")
        self.reference = reference
        self.reason = reason
        self.code = code


@dataclasses.dataclass(frozen=True, slots=True)
class ImageReference:
    """A parsed reference: ``domain/path[:tag][@digest]``.

    ``domain`` is empty only for references from the strict ``parse`` that
    carry no domain; ``parse_normalized`` always fills it in.
    """

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """The repository with its domain, without tag or digest."""
        return f"{self.domain}/{self.path}" if self.domain else self.path

    @property
    def familiar_name(self) -> str:
        """The short form people type: ``docker.io/library/nginx`` is ``nginx``."""
        if self.domain != DEFAULT_DOMAIN:
            return self.name
        remainder = self.path.removeprefix(OFFICIAL_REPO_PREFIX)
        return self.path if "/" in remainder else remainder

    @property
    def familiar(self) -> str:
        """The familiar name with tag and digest as written."""
        return self.familiar_name + str(self)[len(self.name) :]

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def _reject(reference: str, reason: str, code: str) -> InvalidReferenceError:
    return InvalidReferenceError(reference, reason, code)


def _check_digest(reference: str, digest: str) -> None:
    algorithm, _, encoded = digest.partition(":")
    if _DIGEST_ALGORITHM_RE.fullmatch(algorithm) is None:
        raise _reject(reference, "invalid digest format", "digest.ErrDigestInvalidFormat")
    length = _DIGEST_HEX_LENGTH.get(algorithm)
    if length is None:
        raise _reject(
            reference,
            f"unsupported digest algorithm {quote(algorithm)}",
            "digest.ErrDigestUnsupported",
        )
    if len(encoded) != length:
        raise _reject(
            reference, f"invalid {algorithm} digest length", "digest.ErrDigestInvalidLength"
        )
    if _DIGEST_ENCODED_RE.fullmatch(encoded) is None:
        raise _reject(reference, "invalid digest format", "digest.ErrDigestInvalidFormat")


def parse(text: str) -> ImageReference:
    """Parse ``text`` by the strict grammar, without normalisation (Go's ``Parse``)."""
    match = _REFERENCE_RE.fullmatch(text)
    if match is None:
        if not text:
            raise _reject(text, "repository name must have at least one component", "ErrNameEmpty")
        if _REFERENCE_RE.fullmatch(text.lower()) is not None:
            raise _reject(text, "repository name must be lowercase", "ErrNameContainsUppercase")
        raise _reject(text, "invalid reference format", "ErrReferenceInvalidFormat")
    name, tag, digest = match.groups()
    name_match = _NAME_RE.fullmatch(name)
    assert name_match is not None  # the reference pattern embeds the name pattern
    domain, path = name_match[1] or "", name_match[2]
    if len(path) > NAME_TOTAL_LENGTH_MAX:
        raise _reject(
            text,
            f"repository name must not be more than {NAME_TOTAL_LENGTH_MAX} characters",
            "ErrNameTooLong",
        )
    if digest is not None:
        _check_digest(text, digest)
    return ImageReference(domain=domain, path=path, tag=tag, digest=digest)


def _split_docker_domain(name: str) -> tuple[str, str]:
    maybe_domain, slash, maybe_remote = name.partition("/")
    if not slash:
        # Familiar single-element names ("ubuntu:22.04") must not be read as host:port.
        return DEFAULT_DOMAIN, OFFICIAL_REPO_PREFIX + name
    if maybe_domain == LOCALHOST:
        domain, remote = maybe_domain, maybe_remote
    elif maybe_domain == LEGACY_DEFAULT_DOMAIN:
        domain, remote = DEFAULT_DOMAIN, maybe_remote
    elif any(c in maybe_domain for c in ".:") or maybe_domain.lower() != maybe_domain:
        # A dot or colon marks a host or IP; upper case is never a valid
        # repository namespace, so it must be a domain too.
        domain, remote = maybe_domain, maybe_remote
    else:
        domain, remote = DEFAULT_DOMAIN, name
    if domain == DEFAULT_DOMAIN and "/" not in remote:
        remote = OFFICIAL_REPO_PREFIX + remote
    return domain, remote


def parse_normalized(text: str) -> ImageReference:
    """Parse a reference as a container runtime does (Go's ``ParseNormalizedNamed``).

    ``nginx:1.25`` becomes ``docker.io/library/nginx:1.25``; tag and digest
    are kept as written.
    """
    if _IDENTIFIER_RE.fullmatch(text) is not None:
        raise _reject(
            text, "cannot specify 64-byte hexadecimal strings", "ErrReferenceInvalidFormat"
        )
    domain, remainder = _split_docker_domain(text)
    remote_name = remainder.split(":", 1)[0]
    if remote_name.lower() != remote_name:
        raise _reject(text, "repository name must be lowercase", "ErrNameContainsUppercase")
    try:
        reference = parse(f"{domain}/{remainder}")
    except InvalidReferenceError as error:
        # Quote what the user wrote, not the normalised string we built.
        raise _reject(text, error.reason, error.code) from None
    if not reference.domain:
        # Unreachable for valid input, kept so a grammar change cannot
        # silently produce a domain-less reference.
        raise _reject(text, "invalid reference format", "ErrReferenceInvalidFormat")
    return reference


def is_valid_domain(text: str) -> bool:
    """Whether ``text`` is a registry ``host[:port]`` by the grammar."""
    return _DOMAIN_RE.fullmatch(text) is not None


def split_name(text: str) -> tuple[str, str] | None:
    """``(domain, path)`` of a valid repository name, or None."""
    match = _NAME_RE.fullmatch(text)
    if match is None:
        return None
    return match[1] or "", match[2]
