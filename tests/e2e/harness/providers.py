"""A token server with project robots and the test plugin configured for them.

Shared by the unit tests of the provider source and the end-to-end tests:
`RobotIssuer` is the e2e token server (TLS on loopback, in a thread) with robots
that mint short-lived passwords, and `config` writes the kubelet
CredentialProviderConfig that points the real test plugin at it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mirrorgate.certs.authority import CertificateAuthority
from tests.e2e.harness import plugins
from tests.e2e.harness.token_server import Robot, TokenServer, TokenSigner

API_VERSION = "credentialprovider.kubelet.k8s.io/v1"


@dataclass
class RobotIssuer:
    server: TokenServer
    ca_path: Path
    bin_dir: Path
    secrets: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def mint_url(self) -> str:
        return f"{self.server.url}/robot-token"

    def add_robot(self, name: str, project: str) -> None:
        secret = self.secrets[name] = secrets.token_urlsafe(18)
        self.server.robots[name] = Robot(secret=secret, project=project)

    def provider(
        self,
        name: str,
        robot: str,
        *,
        args: list[str] | None = None,
        match_images: list[str] | None = None,
        default_cache_duration: str = "60s",
        api_version: str = API_VERSION,
    ) -> dict[str, Any]:
        """One provider entry running the test plugin (installed as `name`) for `robot`."""
        plugins.install(self.bin_dir, name)
        return {
            "name": name,
            "matchImages": match_images or ["*.example"],
            "defaultCacheDuration": default_cache_duration,
            "apiVersion": api_version,
            "args": args or [],
            "env": [
                {"name": "TOKEN_URL", "value": self.mint_url},
                {"name": "ROBOT", "value": robot},
                {"name": "ROBOT_SECRET", "value": self.secrets[robot]},
                {"name": "CA_FILE", "value": str(self.ca_path)},
            ],
        }

    def write_config(self, path: Path, *providers: dict[str, Any]) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1",
                    "kind": "CredentialProviderConfig",
                    "providers": list(providers),
                },
                indent=2,
            )
        )
        return path


def start_issuer(
    workdir: Path, *, server: TokenServer | None = None, ca_path: Path | None = None
) -> RobotIssuer:
    """A RobotIssuer on `server` (the registry stack's) or on a token server of its own."""
    workdir.mkdir(parents=True, exist_ok=True)
    if server is None or ca_path is None:
        ca = CertificateAuthority.generate(common_name="mirrorgate provider test CA")
        serving = ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])
        ca_path = workdir / "ca.crt"
        ca_path.write_bytes(ca.cert_pem)
        (workdir / "tls.crt").write_bytes(serving.cert_pem)
        (workdir / "tls.key").write_bytes(serving.key_pem)
        server = TokenServer(
            users={},
            tls_cert=workdir / "tls.crt",
            tls_key=workdir / "tls.key",
            signer=TokenSigner(),
        )
        server.start()
    return RobotIssuer(server=server, ca_path=ca_path, bin_dir=workdir / "plugins")


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RobotIssuer]:
    """The test token server with robot-a (project team-a), for the provider plugin tests."""
    issuer = start_issuer(tmp_path_factory.mktemp("issuer"))
    issuer.add_robot("robot-a", "team-a")
    yield issuer
    issuer.server.stop()
