"""A small registry v2 client: Basic/Bearer challenges, digest-verified pulls, pushes."""

from __future__ import annotations

import base64
import json
import re
import ssl
from types import TracebackType
from typing import Any

import httpx

from tests.e2e.harness.dockerconfig import Credentials
from tests.e2e.harness.oci import OciImage, sha256_digest

MANIFEST_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryHTTPError(Exception):
    """A registry (or its token server) answered with an error status.

    `status` is the HTTP status (401 for refused credentials). The message names the
    host, method and path, and the registry's error code, never a credential.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class DigestMismatchError(Exception):
    """Content did not hash to the digest the registry or the reference promised."""


def _error_summary(response: httpx.Response) -> str:
    # distribution answers {"errors":[{"code":..,"message":..}]}; keep just code+message.
    try:
        errors = response.json().get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or "no detail"
    except (ValueError, AttributeError):
        return response.text[:200] or "no body"


class RegistryClient:
    """Talks to one registry host over TLS, authenticating like a container runtime does."""

    def __init__(
        self,
        host: str,
        *,
        ca_file: str,
        credentials: Credentials | None,
        timeout: float = 30.0,
    ) -> None:
        self.host = host
        self._credentials = credentials
        self._authorization: str | None = None
        self.auth_scheme: str | None = None  # "basic" or "bearer" once authenticated
        # trust_env=False: no proxy variables or SSL_CERT_FILE may reroute loopback traffic.
        self._http = httpx.Client(
            base_url=f"https://{host}",
            verify=ssl.create_default_context(cafile=ca_file),
            timeout=timeout,
            trust_env=False,
            follow_redirects=True,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- authentication ---------------------------------------------------------------

    def _basic(self) -> str:
        assert self._credentials is not None
        pair = f"{self._credentials.username}:{self._credentials.password}"
        return "Basic " + base64.b64encode(pair.encode()).decode()

    def _authenticate(self, challenge: str, scope: str, where: str) -> None:
        scheme, _, rest = challenge.partition(" ")
        params = dict(_CHALLENGE_PARAM.findall(rest))
        if self._credentials is None:
            raise RegistryHTTPError(401, f"{where}: credentials required, none given")
        if scheme.lower() == "basic":
            self._authorization = self._basic()
            self.auth_scheme = "basic"
            return
        if scheme.lower() == "bearer" and "realm" in params:
            query = {"service": params.get("service", ""), "scope": scope}
            response = self._http.get(
                params["realm"], params=query, headers={"Authorization": self._basic()}
            )
            if response.status_code != 200:
                raise RegistryHTTPError(
                    response.status_code,
                    f"{where}: token server refused the credentials ({_error_summary(response)})",
                )
            body = response.json()
            self._authorization = "Bearer " + (body.get("token") or body["access_token"])
            self.auth_scheme = "bearer"
            return
        raise RegistryHTTPError(401, f"{where}: unsupported challenge scheme {scheme!r}")

    def _request(
        self,
        method: str,
        url: str,
        *,
        scope: str,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        where = f"{method} {self.host}{httpx.URL(url).path}"
        for attempt in range(2):
            sent = dict(headers or {})
            if self._authorization:
                sent["Authorization"] = self._authorization
            response = self._http.request(method, url, headers=sent, content=content)
            if response.status_code != 401 or attempt == 1:
                break
            self._authenticate(response.headers.get("WWW-Authenticate", ""), scope, where)
        if response.status_code >= 400:
            raise RegistryHTTPError(response.status_code, f"{where}: {_error_summary(response)}")
        return response

    # -- reading ----------------------------------------------------------------------

    def ping(self) -> int:
        """Status of GET /v2/ after authenticating (200 when the credentials work)."""
        return self._request("GET", "/v2/", scope="").status_code

    def manifest(self, name: str, reference: str) -> tuple[str, dict[str, Any]]:
        """(digest, parsed manifest), the digest checked against the body and the reference."""
        response = self._request(
            "GET",
            f"/v2/{name}/manifests/{reference}",
            scope=f"repository:{name}:pull",
            headers={"Accept": MANIFEST_ACCEPT},
        )
        digest = sha256_digest(response.content)
        announced = response.headers.get("Docker-Content-Digest")
        if announced and announced != digest:
            raise DigestMismatchError(f"{name}:{reference}: header {announced} != body {digest}")
        if reference.startswith("sha256:") and reference != digest:
            raise DigestMismatchError(f"{name}@{reference}: got {digest}")
        manifest: dict[str, Any] = json.loads(response.content)
        return digest, manifest

    def blob(self, name: str, digest: str) -> bytes:
        """The blob's bytes, verified against its digest."""
        response = self._request(
            "GET", f"/v2/{name}/blobs/{digest}", scope=f"repository:{name}:pull"
        )
        if sha256_digest(response.content) != digest:
            raise DigestMismatchError(f"{name}: blob {digest} has the wrong content")
        return response.content

    def pull(self, name: str, reference: str) -> str:
        """Fetch the manifest and every blob it names, verifying each; returns the digest."""
        digest, manifest = self.manifest(name, reference)
        descriptors = [manifest["config"], *manifest.get("layers", [])]
        for descriptor in descriptors:
            self.blob(name, descriptor["digest"])
        return digest

    # -- writing ----------------------------------------------------------------------

    def push(self, name: str, tag: str, image: OciImage) -> str:
        """Upload the blobs (monolithic) and the manifest; returns the registry's digest."""
        scope = f"repository:{name}:pull,push"
        for digest, data in image.blobs.items():
            started = self._request("POST", f"/v2/{name}/blobs/uploads/", scope=scope)
            location = httpx.URL(started.headers["Location"])
            self._request(
                "PUT",
                str(location.copy_merge_params({"digest": digest})),
                scope=scope,
                headers={"Content-Type": "application/octet-stream"},
                content=data,
            )
        response = self._request(
            "PUT",
            f"/v2/{name}/manifests/{tag}",
            scope=scope,
            headers={"Content-Type": image.media_type},
            content=image.manifest,
        )
        return str(response.headers.get("Docker-Content-Digest", ""))
