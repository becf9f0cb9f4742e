"""Unit tests of the harness's own pure helpers (no binaries needed, so not `e2e`)."""

from __future__ import annotations

import base64

import pytest
from urllib3 import HTTPHeaderDict

from tests.e2e.harness import dockerconfig
from tests.e2e.harness.dockerconfig import Credentials, DockerConfigError
from tests.e2e.harness.kube import namespace_name, warning_messages
from tests.e2e.harness.oci import build_image, sha256_digest
from tests.e2e.harness.registry import parse_image


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_encode_then_read_back():
    """What encode() writes, credentials_for() reads, for the exact host only."""
    config = dockerconfig.encode("127.0.0.1:5002", "u", "p:w@s")
    assert dockerconfig.credentials_for(config, "127.0.0.1:5002") == Credentials("u", "p:w@s")
    assert dockerconfig.credentials_for(config, "127.0.0.1:5003") is None


def test_auth_field_wins_when_alone():
    """Like kubelet, `auth` alone is enough and any https:// or /v1/ decoration is ignored."""
    config = {"auths": {"https://127.0.0.1:5002/v1/": {"auth": _auth("a", "b")}}}
    assert dockerconfig.credentials_for(config, "127.0.0.1:5002") == Credentials("a", "b")


def test_inconsistent_entry_is_an_error():
    """auth and username/password that disagree would pull differently per runtime."""
    config = {"auths": {"h:1": {"auth": _auth("a", "b"), "username": "a", "password": "x"}}}
    with pytest.raises(DockerConfigError) as excinfo:
        dockerconfig.credentials_for(config, "h:1")
    assert "x" not in str(excinfo.value).replace("auths", "")


def test_most_specific_path_prefix_wins():
    """A key with a repository path beats the bare host for images under that path."""
    config = {
        "auths": {
            "h:1": {"auth": _auth("host", "p")},
            "h:1/team": {"auth": _auth("team", "p")},
        }
    }
    assert dockerconfig.credentials_for(config, "h:1", "team/app") == Credentials("team", "p")
    assert dockerconfig.credentials_for(config, "h:1", "teamx/app") == Credentials("host", "p")


def test_credentials_repr_hides_password():
    """Assertion rewriting prints reprs; the password must not be in them."""
    assert "s3cret" not in repr(Credentials("u", "s3cret"))


def test_image_is_deterministic():
    """Same input, same digest: tests can compare against a digest computed locally."""
    first, second = build_image(), build_image()
    assert first.digest == second.digest == sha256_digest(first.manifest)
    assert build_image("other\n").digest != first.digest


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("127.0.0.1:5000/library/hello:1.0", ("127.0.0.1:5000", "library/hello", "1.0")),
        ("localhost/a/b", ("localhost", "a/b", "latest")),
        ("h.example:1/a@sha256:00", ("h.example:1", "a", "sha256:00")),
    ],
)
def test_parse_image(image, expected):
    """Host, repository and tag or digest are split as a runtime splits them."""
    assert parse_image(image) == expected


def test_parse_image_needs_a_host():
    """Docker Hub short names are the webhook's business, not the pull client's."""
    with pytest.raises(ValueError, match="explicit registry host"):
        parse_image("library/hello:1.0")


def test_warning_messages_reads_every_header():
    """Repeated Warning headers, with escaped quotes, all come back as plain text."""
    headers = HTTPHeaderDict()
    headers.add("Warning", '299 - "first"')
    headers.add("Warning", '299 - "second \\"quoted\\""')
    assert warning_messages(headers) == ["first", 'second "quoted"']
    assert warning_messages({}) == []


def test_namespace_names_are_valid_and_unique():
    """Derived from any test id, still a DNS-1123 label of at most 63 characters."""
    names = {namespace_name("test_x[Some/Param-" + "y" * 80 + "]") for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert len(name) <= 63
        assert name.replace("-", "").isalnum()
        assert name == name.lower()
