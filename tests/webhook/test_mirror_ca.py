"""One private-CA bundle for the probes and the export (`serve --mirror-ca`,
`export containerd --mirror-ca`, the chart's `mirrorCA`), reloaded while serve runs."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

import pytest

from mirrorgate.certs import CertificateAuthority
from mirrorgate.webhook import cli
from mirrorgate.webhook.commands import export
from mirrorgate.webhook.commands.serve import reloaders
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.mirrorhealth import probes
from tests.webhook.serving import write_atomically

POLICY = """
mirrors:
  - source: docker.io
    mirror: harbor.corp.example/hub
  - source: quay.io
    mirror: cache.corp.example:5443/quay
    caFile: /etc/mirrors/cache.crt
  - source: ghcr.io
    mirror: http://kind-registry:5000/ghcr
  - source: registry.k8s.io
    mirror: lab.corp.example/k8s
    insecureSkipVerify: true
"""


@pytest.fixture
def bundle(tmp_path: Path, ca: CertificateAuthority) -> Path:
    path = tmp_path / "mirror-ca.crt"
    write_atomically(path, b"# the corporate root\n" + ca.cert_pem)
    return path


def test_export_gives_every_verified_https_mirror_the_bundle_beside_its_hosts_toml(
    tmp_path: Path, bundle: Path, ca: CertificateAuthority
) -> None:
    out, err = io.StringIO(), io.StringIO()
    argv = ["export", "containerd", "--policy", str(tmp_path / "p.yaml"), "--out"]
    (tmp_path / "p.yaml").write_text(POLICY)
    assert cli.main([*argv, str(tmp_path / "d"), "--mirror-ca", str(bundle)], out=out, err=err) == 0
    tables = {
        path.parent.name: tomllib.loads(path.read_text())["host"]
        for path in (tmp_path / "d").glob("*/hosts.toml")
    }
    cas = {host: [t.get("ca") for t in table.values()] for host, table in tables.items()}
    # Verified HTTPS without a caFile: the copy beside it, for the source and for the
    # mirror host itself (rewritten images name it). A rule's own caFile, plain HTTP
    # and insecureSkipVerify are as the policy says.
    assert cas == {
        "docker.io": [export.MIRROR_CA_FILE],
        "harbor.corp.example": [export.MIRROR_CA_FILE],
        "quay.io": ["/etc/mirrors/cache.crt"],
        "cache.corp.example:5443": ["/etc/mirrors/cache.crt"],
        "ghcr.io": [None],
        "kind-registry:5000": [None],
        "registry.k8s.io": [None],
        "lab.corp.example": [None],
    }
    copies = sorted(p.parent.name for p in (tmp_path / "d").glob(f"*/{export.MIRROR_CA_FILE}"))
    assert copies == ["docker.io", "harbor.corp.example"]
    # The certificates themselves, re-encoded: the comment is not carried over.
    assert (tmp_path / "d" / "docker.io" / export.MIRROR_CA_FILE).read_bytes() == ca.cert_pem


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read: No such file or directory"),
        (b"hello\n", "no PEM certificate found"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not a valid PEM"),
    ],
)
def test_a_bad_bundle_is_refused_naming_the_file(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "bundle.crt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        reloaders.MirrorCA(str(path), interval=1.0)
    assert str(caught.value).startswith(f"--mirror-ca {path}: ")
    assert message in str(caught.value)


def test_a_changed_bundle_replaces_the_old_and_a_bad_one_is_kept_out(
    bundle: Path, ca: CertificateAuthority, other_ca: CertificateAuthority
) -> None:
    watched = reloaders.MirrorCA(str(bundle), interval=1.0)
    heard: list[str] = []
    watched.subscribe(lambda: heard.append(watched.current()))
    assert watched.current() == ca.cert_pem.decode()
    write_atomically(bundle, other_ca.cert_pem)
    assert watched.watcher.poll()
    assert heard == [other_ca.cert_pem.decode()]
    write_atomically(bundle, b"half written")
    watched.watcher.poll()
    assert (watched.current(), len(heard)) == (other_ca.cert_pem.decode(), 1)


def test_the_probes_trust_the_bundle_beside_the_system_store_unless_a_rule_has_its_own(
    ca: CertificateAuthority, other_ca: CertificateAuthority, tmp_path: Path
) -> None:
    system = probes.tls_context(None)
    added = probes.tls_context(None, mirror_ca=ca.cert_pem.decode())
    assert added.cert_store_stats()["x509_ca"] == system.cert_store_stats()["x509_ca"] + 1
    own = tmp_path / "own.crt"
    own.write_bytes(other_ca.cert_pem)
    alone = probes.tls_context(str(own), mirror_ca=ca.cert_pem.decode())
    assert alone.cert_store_stats()["x509_ca"] == 1
