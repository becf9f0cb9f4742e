"""The image's trust store: Debian's CA store for public mirrors and cloud APIs, and the
chart's `mirrorCA` added to it: by serve itself for its probes (`--mirror-ca`, the
mounted bundle), and by the chart's own initContainer for the credential-provider
plugins, run from the image as the kubelet runs it (the `image` marker; the chart
rendered by the pinned helm). Both consumers are checked: mirrorgate's own probes
(Python's ssl) and a Go program verifying as the plugins do (`go/tls-get`), each with a
real handshake."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mirrorgate import certs
from tests.e2e.harness import helm as h
from tests.e2e.harness.binaries import built_binary
from tests.e2e.harness.testimages import go_binary
from tests.image.podman import RUN_AS, ULIMITS, podman
from tests.webhook.test_probes import answer, https_server

pytestmark = [pytest.mark.image, pytest.mark.e2e]

KEY = "bundle.pem"
# Debian's bundle: the first file Go's crypto/x509 reads on Linux (the credential-provider
# plugins), and the one Debian's OpenSSL (Python's ssl) is built to load.
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Run inside the image: the trust store mirrorgate's probes use (probes.tls_context
# without a caFile, with the --mirror-ca bundle given as argv[2]), what it holds, and a
# probe of the mirror given as argv[1].
PROBE = """\
import json, os, sys
from mirrorgate.webhook.commands.serve import reloaders
from mirrorgate.webhook.mirrorhealth import probes
bundle = reloaders.read_bundle(sys.argv[2]) if sys.argv[2:] else None
context = probes.tls_context(None, mirror_ca=bundle)
names = {value for cert in context.get_ca_certs() for rdn in cert["subject"]
         for key, value in rdn if key == "commonName"}
answer = probes.check_mirror(sys.argv[1], context=context, timeout=10) if sys.argv[1:] else None
with open("/etc/ssl/certs/ca-certificates.crt") as system:
    in_system_bundle = system.read().count("-----BEGIN CERTIFICATE-----")
print(json.dumps({"cas": context.cert_store_stats()["x509_ca"], "names": sorted(names),
                  "in_system_bundle": in_system_bundle, "env": os.environ.get("SSL_CERT_FILE"),
                  "probe": answer}))
"""
PUBLIC_ROOT = "ISRG Root X1"  # Let's Encrypt's
PRIVATE_CA = "mirror-ca.trust-store.test"


def _probe(image: str, *args: str, options: tuple[str, ...] = ()) -> dict[str, Any]:
    done = podman(
        "run",
        "--rm",
        "--read-only",
        "--user",
        RUN_AS,
        "--network=host",
        *ULIMITS,
        *options,
        "--entrypoint",
        "python3",
        image,
        "-c",
        PROBE,
        *args,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@pytest.fixture(scope="module")
def tls_get(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go consumer, a static binary to mount into the image."""
    path = tmp_path_factory.mktemp("go") / "tls-get"
    path.write_bytes(go_binary("tls-get", sources=Path(__file__).resolve().parent / "go"))
    path.chmod(0o755)
    return path


def _go_get(image: str, tls_get: Path, *args: str, options: tuple[str, ...] = ()) -> dict[str, Any]:
    done = podman(
        "run",
        "--rm",
        "--read-only",
        "--user",
        RUN_AS,
        "--network=host",
        *ULIMITS,
        "-v",
        f"{tls_get}:/tls-get:ro",
        *options,
        "--entrypoint",
        "/tls-get",
        image,
        *args,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_the_system_roots_are_debian_s_ca_store(image: str, tls_get: Path) -> None:
    """As the Deployment's user, with nothing set: Python's default context loads
    Debian's roots from its bundle, and Go finds the same roots."""
    found = _probe(image)
    assert found["env"] is None
    assert found["cas"] > 100
    assert found["in_system_bundle"] == found["cas"]
    assert PUBLIC_ROOT in found["names"]
    assert _go_get(image, tls_get) == {"roots": found["cas"]}


@pytest.fixture(scope="module")
def chart_pod(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The Deployment's Pod spec as the chart renders it for `mirrorCA`, with plugins."""
    home = tmp_path_factory.mktemp("helm-home")
    plugins = {
        "credentialProviders.config.apiVersion": "kubelet.config.k8s.io/v1",
        "credentialProviders.config.kind": "CredentialProviderConfig",
        "credentialProviders.config.providers[0].name": "ecr-credential-provider",
        "credentialProviders.config.providers[0].matchImages[0]": "*.dkr.ecr.*.amazonaws.com",
        "credentialProviders.config.providers[0].defaultCacheDuration": "12h",
        "credentialProviders.config.providers[0].apiVersion": (
            "credentialprovider.kubelet.k8s.io/v1"
        ),
        "credentialProviders.image.repository": "registry.example/providers",
        "credentialProviders.image.digest": "sha256:" + "c" * 64,
    }
    objects = h.template(
        built_binary("helm"),
        home,
        {"mirrorCA.configMap": "mirror-ca", "mirrorCA.key": KEY, **plugins},
    )
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _volumes(container: dict[str, Any], hosts: dict[str, Path]) -> list[str]:
    """podman -v options for the container's mounts of the chart's volumes."""
    return [
        arg
        for mount in container["volumeMounts"]
        if mount["name"] in hosts
        for arg in (
            "-v",
            f"{hosts[mount['name']]}:{mount['mountPath']}"
            + (":ro" if mount.get("readOnly") else ""),
        )
    ]


def _lay_out(tmp_path: Path, bundle: bytes) -> dict[str, Path]:
    """The two volumes as the kubelet lays them out: the ConfigMap's key a root-owned 0644
    file, the emptyDir a directory anyone may write."""
    mirror_ca, trust = tmp_path / "mirror-ca", tmp_path / "trust-store"
    mirror_ca.mkdir()
    trust.mkdir()
    trust.chmod(0o777)
    (mirror_ca / KEY).write_bytes(bundle)
    (mirror_ca / KEY).chmod(0o644)
    return {"mirror-ca": mirror_ca, "trust-store": trust}


def _init(image: str, spec: dict[str, Any], hosts: dict[str, Path]) -> tuple[int, str]:
    """The chart's trust-store initContainer, run from the image with its own command."""
    (init,) = [c for c in spec["initContainers"] if c["name"] == "trust-store"]
    done = podman(
        "run",
        "--rm",
        "--read-only",
        "--user",
        RUN_AS,
        "--network=none",
        *ULIMITS,
        *_volumes(init, hosts),
        "--entrypoint",
        json.dumps(init["command"]),
        image,
        check=False,
    )
    return done.returncode, done.stderr


def test_mirror_ca_is_added_to_the_system_roots(
    image: str, chart_pod: dict[str, Any], tls_get: Path, tmp_path: Path
) -> None:
    """The chart's containers, run from the image: serve's probes (the bundle its
    --mirror-ca names, no SSL_CERT_FILE) and the plugin host's Go plugins (the
    initContainer's trust store, which SSL_CERT_FILE names) each reach a mirror whose
    certificate a private CA signed through the TLS handshake, and still trust every
    Debian root. Without `mirrorCA` both fail verification: the private CA is what
    made the difference."""
    ca = certs.CertificateAuthority.generate(common_name=PRIVATE_CA)
    pair = ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])
    hosts = _lay_out(tmp_path, ca.cert_pem)
    assert _init(image, chart_pod, hosts) == (0, "")
    (container,) = chart_pod["containers"]
    (host,) = [c for c in chart_pod["initContainers"] if c["name"] == "plugin-host"]
    assert "SSL_CERT_FILE" not in {e["name"] for e in container.get("env", [])}
    (bundle,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--mirror-ca=")]
    env = [arg for e in host["env"] for arg in ("--env", f"{e['name']}={e['value']}")]
    plugins = (*env, *_volumes(host, hosts))
    with https_server(pair, tmp_path, answer(401)) as mirror:
        given = _probe(image, mirror, bundle, options=tuple(_volumes(container, hosts)))
        alone = _probe(image, mirror)
        go_given, go_alone = (
            _go_get(image, tls_get, mirror, options=plugins),
            _go_get(image, tls_get, mirror),
        )
    assert given["env"] is None
    assert given["probe"] == [True, "HTTP 401"]
    assert given["cas"] == alone["cas"] + 1
    assert set(given["names"]) == {*alone["names"], PRIVATE_CA}
    assert PUBLIC_ROOT in given["names"]
    assert alone["probe"][0] is False
    assert alone["probe"][1].startswith("TLS verification failed: ")
    assert go_given == {"roots": given["cas"], "status": 401}
    assert go_alone["roots"] == alone["cas"]
    assert "x509: certificate signed by unknown authority" in go_alone["error"]
    # The mirror-ca volume is mounted in the plugin host too, for a plugin that names it
    # (a CA_FILE of its own).
    assert f"/etc/mirrorgate-ca/{KEY}" in {
        f"{m['mountPath']}/{KEY}" for m in host["volumeMounts"] if m["name"] == "mirror-ca"
    }


@pytest.mark.parametrize("bundle", [b"", b"not a certificate\n"], ids=["empty", "not-pem"])
def test_a_bundle_without_a_certificate_stops_the_pod(
    image: str, chart_pod: dict[str, Any], tmp_path: Path, bundle: bytes
) -> None:
    """A mirrorCA key holding no certificate fails the initContainer naming the file,
    instead of a replica starting with a trust store that verifies no private mirror."""
    hosts = _lay_out(tmp_path, bundle)
    assert _init(image, chart_pod, hosts) == (
        1,
        f"mirrorCA: /etc/mirrorgate-ca/{KEY} holds no PEM certificate\n",
    )
    assert os.listdir(hosts["trust-store"]) == []
