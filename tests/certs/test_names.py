"""Service DNS names, DNS-name validation and the IP/DNS split."""

from __future__ import annotations

import pytest

from mirrorgate.certs import service_dns_names, split_identities, validate_dns_name


def test_service_dns_names_default_domain() -> None:
    """A Service gets its short, namespaced, .svc and fully qualified names, in that order."""
    assert service_dns_names(service="mirrorgate", namespace="infra") == [
        "mirrorgate",
        "mirrorgate.infra",
        "mirrorgate.infra.svc",
        "mirrorgate.infra.svc.cluster.local",
    ]


def test_service_dns_names_custom_domain() -> None:
    """The cluster domain is configurable."""
    assert service_dns_names(service="a", namespace="b", cluster_domain="k8s.example")[-1] == (
        "a.b.svc.k8s.example"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"service": "Mirrorgate", "namespace": "ns"}, "service name 'Mirrorgate'"),
        ({"service": "svc", "namespace": "my_ns"}, "namespace name 'my_ns'"),
        ({"service": "", "namespace": "ns"}, "service name ''"),
        ({"service": "svc", "namespace": "ns-"}, "namespace name 'ns-'"),
        ({"service": "a.b", "namespace": "ns"}, "service name 'a.b'"),
        ({"service": "s", "namespace": "n", "cluster_domain": "bad..domain"}, "'bad..domain'"),
    ],
)
def test_service_dns_names_rejects_bad_input(kwargs: dict[str, str], message: str) -> None:
    """Invalid Kubernetes names or cluster domains raise ValueError naming the value."""
    with pytest.raises(ValueError, match=message):
        service_dns_names(**kwargs)


@pytest.mark.parametrize(
    "name",
    ["a", "webhook.ns.svc", "*.example.com", "xn--bcher-kva.example", "A-1.Example.COM", "9x.io"],
)
def test_valid_dns_names(name: str) -> None:
    """Ordinary, wildcard, IDNA and mixed-case names are accepted unchanged."""
    assert validate_dns_name(name) == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must not be empty"),
        ("-a.com", "invalid label '-a'"),
        ("a-.com", "invalid label 'a-'"),
        ("a..b", "invalid label ''"),
        ("a.b.", "invalid label ''"),
        ("a_b.com", "invalid label 'a_b'"),
        ("x" * 64 + ".com", "invalid label 'x{64}'"),
        ("a." * 127 + "com", "longer than 253"),
        ("*.com", "wildcard needs at least two labels"),
        ("a.*.com", r"invalid label '\*'"),
        ("bücher.example", "not ASCII"),
        ("127.0.0.1", "is an IP address"),
        ("::1", "is an IP address"),
    ],
)
def test_invalid_dns_names(name: str, message: str) -> None:
    """Invalid names raise ValueError that quotes the name and says what is wrong."""
    with pytest.raises(ValueError, match=message) as info:
        validate_dns_name(name)
    assert repr(name) in str(info.value) or not name


def test_split_identities() -> None:
    """IPs and DNS names are separated, order kept, duplicates dropped, IPs canonical."""
    dns, ips = split_identities(
        ["svc.ns", "127.0.0.1", "0:0::1", "svc.ns", "::1", "localhost", "10.1.2.3"]
    )
    assert dns == ["svc.ns", "localhost"]
    assert ips == ["127.0.0.1", "::1", "10.1.2.3"]


def test_split_identities_names_bad_value() -> None:
    """A value that is neither an IP nor a DNS name raises ValueError naming it."""
    with pytest.raises(ValueError, match="'not valid'"):
        split_identities(["ok.example", "not valid"])
