"""An authenticated upstream registry and a TLS + htpasswd pull-through mirror in front of it.

Topology (all loopback, free ports, one temp dir):

    token server (thread)  <--  upstream registry (auth: token)  <--  mirror (proxy mode,
                                                                       htpasswd, TLS)

Start order matters: the mirror GETs the upstream's /v2/ at start-up to discover the
token realm, and panics if the upstream is not answering yet.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import httpx

from mirrorgate.certs.authority import CertificateAuthority
from tests.e2e.harness import dockerconfig
from tests.e2e.harness.binaries import docker_registry
from tests.e2e.harness.dockerconfig import Credentials
from tests.e2e.harness.oci import OciImage, build_image
from tests.e2e.harness.procs import ManagedProcess, free_port, stop_all, wait_until
from tests.e2e.harness.registry_client import RegistryClient
from tests.e2e.harness.token_server import ISSUER, TokenServer, TokenSigner

REPOSITORY = "library/hello"
TAG = "1.0"
# Cost 5, not the default 12: the registry re-checks bcrypt on every request, and
# cost 12 costs ~200 ms per request on a 2-core machine (cost 5: ~5 ms).
BCRYPT_COST = 5
READY_TIMEOUT = 30.0


# distribution's combined access log: `… "GET /v2/x/manifests/1 HTTP/1.1" 401 156 "" "agent"`.
_ACCESS = re.compile(
    r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3}) \S+ '
    r'"[^"]*" "(?P<agent>[^"]*)"'
)


# distribution's own log lines: `key=value` or `key="quoted value"`.
_FIELD = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|\S+)')


@dataclass(frozen=True)
class Access:
    """One request a registry answered, from its access log."""

    method: str
    path: str
    status: int
    agent: str

    def is_for(self, repository: str) -> bool:
        return self.path.startswith(f"/v2/{repository}/")


def htpasswd_line(username: str, password: str) -> str:
    """One htpasswd entry; distribution accepts bcrypt only (`$apr1$` is always a 401)."""
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode()
    return f"{username}:{hashed}"


def parse_image(image: str) -> tuple[str, str, str]:
    """Split "HOST:PORT/name[:tag|@digest]" into (host, name, reference)."""
    host, sep, rest = image.partition("/")
    if not sep or not ("." in host or ":" in host or host == "localhost"):
        raise ValueError(f"image {image!r} must start with an explicit registry host")
    if "@" in rest:
        name, _, reference = rest.partition("@")
    elif ":" in rest.rsplit("/", 1)[-1]:
        name, _, reference = rest.rpartition(":")
    else:
        name, reference = rest, "latest"
    return host, name, reference


def _ready_401(url: str, ca_file: Path) -> str | None:
    """None once `url` answers 401 (serving, auth on); otherwise why not yet."""
    try:
        response = httpx.get(
            url,
            verify=ssl.create_default_context(cafile=str(ca_file)),
            timeout=2,
            trust_env=False,
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if response.status_code == 401 else f"HTTP {response.status_code}"


@dataclass
class RegistryStack:
    """The running pair of registries; what the `registry` fixture yields.

    `host` is the mirror ("127.0.0.1:PORT"); `username`/`password` log in to it.
    `upstream_image` is what a Pod would name; `mirror_image` the same image via the
    mirror; `digest` the manifest digest both serve.
    """

    host: str
    username: str
    password: str = field(repr=False)
    ca_path: Path
    upstream_host: str
    upstream_username: str
    upstream_password: str = field(repr=False)
    repository: str
    tag: str
    digest: str
    image: OciImage = field(repr=False)
    workdir: Path
    processes: list[ManagedProcess] = field(default_factory=list, repr=False)
    token_server: TokenServer | None = field(default=None, repr=False)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def upstream_image(self) -> str:
        return f"{self.upstream_host}/{self.repository}:{self.tag}"

    @property
    def mirror_image(self) -> str:
        return f"{self.host}/{self.repository}:{self.tag}"

    def dockerconfigjson(
        self, username: str | None = None, password: str | None = None, host: str | None = None
    ) -> dict[str, Any]:
        """A correct `.dockerconfigjson` for the mirror (override a field to break it)."""
        return dockerconfig.encode(
            self.host if host is None else host,
            self.username if username is None else username,
            self.password if password is None else password,
        )

    def pull(self, image: str, dockerconfigjson: Mapping[str, Any]) -> str:
        """Pull manifest + blobs of `image` with the secret's credentials; returns the digest.

        Raises RegistryHTTPError (with `.status`, 401 for refused or missing credentials)
        or DigestMismatchError; neither message contains a credential.
        """
        host, name, reference = parse_image(image)
        credentials = dockerconfig.credentials_for(dockerconfigjson, host, name)
        with RegistryClient(host, ca_file=str(self.ca_path), credentials=credentials) as client:
            return client.pull(name, reference)

    def access_log(self, registry: str) -> list[Access]:
        """Every request `registry` ("mirror" or "upstream") has answered so far."""
        return [
            Access(m["method"], m["path"], int(m["status"]), m["agent"])
            for m in _ACCESS.finditer(self.log_text(registry))
        ]

    def log_text(self, registry: str) -> str:
        """The whole log of `registry` ("mirror" or "upstream"), credentials redacted.

        A mirror stopped and started again (`start_mirror`) has a process, and
        a log, per start: their logs in order.
        """
        found = [p for p in self.processes if p.name == f"registry-{registry}"]
        assert found, f"no registry-{registry} process"
        return "".join(p.log_text() for p in found)

    def describe(self, lines: int = 30) -> str:
        """Log tails of both registries, credentials redacted, for failure reports."""
        return "\n\n".join(p.describe_failure(lines) for p in self.processes)

    def stop(self) -> None:
        try:
            stop_all(self.processes)
        finally:
            if self.token_server is not None:
                self.token_server.stop()


def _registry_config(
    *,
    workdir: Path,
    name: str,
    addr: str,
    tls_cert: Path | None,
    tls_key: Path | None,
    auth: dict[str, Any] | None,
    proxy: dict[str, str] | None = None,
) -> Path:
    """A registry's config; without ``tls_cert`` it serves plain HTTP, without ``auth`` anyone."""
    config: dict[str, Any] = {
        "version": "0.1",
        # The mirror at debug: each request's handler line then names the user it
        # authenticated (`msg=GetImageManifest auth.user.name=...`); at info only errors do.
        "log": {"level": "debug" if name == "mirror" else "info", "formatter": "text"},
        "storage": {"filesystem": {"rootdirectory": str(workdir / f"{name}-data")}},
        "http": {
            "addr": addr,
            # Set explicitly: otherwise each start logs a warning and picks a random one.
            "secret": secrets.token_hex(16),
        },
    }
    if tls_cert is not None:
        config["http"]["tls"] = {"certificate": str(tls_cert), "key": str(tls_key)}
    if auth is not None:
        config["auth"] = auth
    if proxy is not None:
        config["proxy"] = proxy
    path = workdir / f"{name}.yml"
    # JSON is YAML, and json.dumps quotes every path and password correctly.
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)  # holds the upstream password
    return path


def _start_registry(
    stack: RegistryStack, name: str, config: Path, host: str, redact: list[str]
) -> ManagedProcess:
    """Start one registry of the stack and wait until its /v2/ answers 401."""
    # Go reads SSL_CERT_FILE on Linux: the mirror trusts our CA for the upstream
    # and the token realm without touching the system trust store.
    env = {"SSL_CERT_FILE": str(stack.ca_path)} if name == "mirror" else {}
    proc = ManagedProcess(
        f"registry-{name}",
        [str(docker_registry()), "serve", str(config)],
        # Appended to, so that a restarted mirror keeps the log of its first life.
        stack.workdir / f"{name}-{len(stack.processes)}.log",
        env=env,
        redact=redact,
    )
    stack.processes.append(proc)
    try:
        stack.timings[f"{name}_ready_s"] = wait_until(
            functools.partial(_ready_401, f"https://{host}/v2/", stack.ca_path),
            timeout=READY_TIMEOUT,
            what=f"registry {name} at https://{host}/v2/",
            alive=proc.exited,
        )
    except (TimeoutError, RuntimeError) as exc:
        raise RuntimeError(f"{exc}\n{proc.describe_failure()}") from None
    return proc


def stop_mirror(stack: RegistryStack) -> None:
    """Stop the mirror (the upstream keeps running); `start_mirror` brings it back."""
    mirrors = [p for p in stack.processes if p.name == "registry-mirror" and p.exited() is None]
    for proc in mirrors:
        proc.stop()


def start_mirror(stack: RegistryStack) -> None:
    """Start the mirror again on the same address, data and htpasswd file."""
    _start_registry(
        stack,
        "mirror",
        stack.workdir / "mirror.yml",
        stack.host,
        [stack.upstream_password, stack.password],
    )


def set_mirror_password(stack: RegistryStack, password: str) -> None:
    """Change the mirror user's password at the mirror only (re-read on its next request)."""
    htpasswd = stack.workdir / "mirror.htpasswd"
    temporary = htpasswd.with_suffix(".tmp")
    temporary.write_text(htpasswd_line(stack.username, password) + "\n")
    temporary.replace(htpasswd)  # a new mtime: the registry reloads it


def add_mirror_users(stack: RegistryStack, users: Mapping[str, str]) -> None:
    """More users (username → password) at the mirror, beside its own (robots, one per
    team, of one proxy project): its htpasswd file is replaced whole, and re-read."""
    htpasswd = stack.workdir / "mirror.htpasswd"
    lines = htpasswd.read_text().splitlines()
    lines += [htpasswd_line(username, password) for username, password in users.items()]
    temporary = htpasswd.with_suffix(".tmp")
    temporary.write_text("\n".join(lines) + "\n")
    temporary.replace(htpasswd)  # a new mtime: the registry reloads it


def start_registry_stack(workdir: Path, address: str = "127.0.0.1") -> RegistryStack:
    """Start token server, upstream and mirror on ``address`` (an IP of this host); seed the
    upstream; stop all on any error."""
    docker_registry()  # fail early, naming the package, when it is missing
    workdir.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority.generate(common_name="mirrorgate e2e registry CA")
    serving = ca.issue_serving(dns_names=["localhost"], ips=[address])
    ca_path = workdir / "ca.crt"
    tls_cert, tls_key = workdir / "tls.crt", workdir / "tls.key"
    ca_path.write_bytes(ca.cert_pem)
    tls_cert.write_bytes(serving.cert_pem)
    tls_key.write_bytes(serving.key_pem)
    tls_key.chmod(0o600)

    upstream_user, upstream_password = "upstream-puller", secrets.token_urlsafe(18)
    mirror_user, mirror_password = "mirror-puller", secrets.token_urlsafe(18)
    redact = [upstream_password, mirror_password]

    signer = TokenSigner()
    token_cert = workdir / "token-signer.crt"
    token_cert.write_bytes(signer.cert_pem)
    token_server = TokenServer(
        users={upstream_user: upstream_password},
        tls_cert=tls_cert,
        tls_key=tls_key,
        signer=signer,
        address=address,
    )
    upstream_host = f"{address}:{free_port()}"
    mirror_host = f"{address}:{free_port()}"
    image = build_image()
    stack = RegistryStack(
        host=mirror_host,
        username=mirror_user,
        password=mirror_password,
        ca_path=ca_path,
        upstream_host=upstream_host,
        upstream_username=upstream_user,
        upstream_password=upstream_password,
        repository=REPOSITORY,
        tag=TAG,
        digest=image.digest,
        image=image,
        workdir=workdir,
        token_server=token_server,
    )
    try:
        token_server.start()
        upstream_config = _registry_config(
            workdir=workdir,
            name="upstream",
            addr=upstream_host,
            tls_cert=tls_cert,
            tls_key=tls_key,
            auth={
                "token": {
                    "realm": token_server.realm,
                    "service": "mirrorgate-e2e-upstream",
                    "issuer": ISSUER,
                    "rootcertbundle": str(token_cert),
                }
            },
        )
        htpasswd = workdir / "mirror.htpasswd"
        # The file must exist before start: a missing path makes the registry create
        # one with a random user, so a typo would lock every test out silently.
        htpasswd.write_text(htpasswd_line(mirror_user, mirror_password) + "\n")
        mirror_config = _registry_config(
            workdir=workdir,
            name="mirror",
            addr=mirror_host,
            tls_cert=tls_cert,
            tls_key=tls_key,
            auth={"htpasswd": {"realm": "mirrorgate-e2e-mirror", "path": str(htpasswd)}},
            proxy={
                "remoteurl": f"https://{upstream_host}",
                "username": upstream_user,
                "password": upstream_password,
            },
        )
        _start_registry(stack, "upstream", upstream_config, upstream_host, redact)
        _start_registry(stack, "mirror", mirror_config, mirror_host, redact)

        with RegistryClient(
            upstream_host,
            ca_file=str(ca_path),
            credentials=Credentials(upstream_user, upstream_password),
        ) as upstream:
            pushed = upstream.push(REPOSITORY, TAG, image)
        if pushed != image.digest:
            raise RuntimeError(f"upstream stored {pushed}, expected {image.digest}")
        return stack
    except BaseException:
        stack.stop()
        raise


@dataclass
class DevCache:
    """A pull-through cache of the upstream, as dev clusters run them (`start_dev_cache`).

    ``ca_path`` is its private CA (None: plain HTTP); ``username``/``password`` its
    login (None: anyone may pull).
    """

    host: str
    process: ManagedProcess
    ca_path: Path | None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    htpasswd: Path | None = None

    def access_log(self) -> list[Access]:
        return [
            Access(m["method"], m["path"], int(m["status"]), m["agent"])
            for m in _ACCESS.finditer(self.process.log_text())
        ]

    def authorized(self) -> list[Access]:
        """The requests its htpasswd check let in (distribution's ``authorized request``
        line), each with the status its access log gave it: with one user in the file,
        each is a request made with that user's current password."""
        statuses: dict[str, int] = {}
        let_in: list[dict[str, str]] = []
        for fields in self._records():
            if fields.get("msg") == "authorized request":
                let_in.append(fields)
            elif fields.get("msg") == "response completed" and "http.request.id" in fields:
                statuses[fields["http.request.id"]] = int(fields["http.response.status"])
        return [
            Access(
                f["http.request.method"],
                f["http.request.uri"],
                statuses.get(f["http.request.id"], 0),
                f.get("http.request.useragent", ""),
            )
            for f in let_in
        ]

    def refused(self) -> list[tuple[str, str]]:
        """The path and distribution's reason of each request its htpasswd check refused:
        "invalid authorization credential" when none came, "authentication failure" for a
        wrong one."""
        return [
            (fields.get("http.request.uri", ""), fields["msg"])
            for fields in self._records()
            if fields.get("msg", "").startswith("error authorizing context")
        ]

    def _records(self) -> list[dict[str, str]]:
        """Its log, one ``key: value`` mapping per line."""
        return [
            {key: value.strip('"') for key, value in _FIELD.findall(line)}
            for line in self.process.log_text().splitlines()
        ]

    def set_password(self, password: str) -> None:
        """Change its user's password (the registry re-reads the file on its next request)."""
        assert self.htpasswd is not None, "a cache without login"
        assert self.username is not None
        temporary = self.htpasswd.with_suffix(".tmp")
        temporary.write_text(htpasswd_line(self.username, password) + "\n")
        temporary.replace(self.htpasswd)
        self.password = password


def _ready(url: str, ca_file: Path | None, status: int) -> str | None:
    """None once `url` answers `status`; otherwise why not yet."""
    try:
        response = httpx.get(
            url,
            timeout=2,
            trust_env=False,
            verify=(ssl.create_default_context(cafile=str(ca_file)) if ca_file else True),
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if response.status_code == status else f"HTTP {response.status_code}"


def start_dev_cache(
    stack: RegistryStack,
    workdir: Path,
    *,
    address: str,
    tls: bool,
    login: bool,
    stack_certificate: bool = False,
    username: str = "dev-puller",
) -> DevCache:
    """A pull-through cache of the stack's upstream on ``address`` (an IP), on a free port.

    ``tls``: HTTPS with a certificate for ``address`` from a private CA of its own
    (``ca.crt`` in ``workdir``); otherwise plain HTTP, as kind's local registry.
    ``stack_certificate``: HTTPS with the stack's own certificate instead (it names the
    stack's address, any port): a mirror whoever trusts the stack's CA trusts already.
    ``login``: htpasswd with ``username`` and a password of its own; otherwise anonymous
    pulls.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    host = f"{address}:{free_port()}"
    tls_cert = tls_key = ca_path = None
    if stack_certificate:
        assert stack.host.rpartition(":")[0] == address, "the stack's certificate names its own"
        ca_path, tls_cert = stack.ca_path, stack.workdir / "tls.crt"
        tls_key = stack.workdir / "tls.key"
    elif tls:
        ca = CertificateAuthority.generate(common_name="mirrorgate e2e dev cache CA")
        serving = ca.issue_serving(dns_names=[], ips=[address])
        ca_path, tls_cert, tls_key = workdir / "ca.crt", workdir / "tls.crt", workdir / "tls.key"
        ca_path.write_bytes(ca.cert_pem)
        tls_cert.write_bytes(serving.cert_pem)
        tls_key.write_bytes(serving.key_pem)
        tls_key.chmod(0o600)
    password = htpasswd = None
    auth = None
    if login:
        password = secrets.token_urlsafe(18)
        htpasswd = workdir / "htpasswd"
        htpasswd.write_text(htpasswd_line(username, password) + "\n")
        auth = {"htpasswd": {"realm": "mirrorgate-e2e-dev-cache", "path": str(htpasswd)}}
    config = _registry_config(
        workdir=workdir,
        name="cache",
        addr=host,
        tls_cert=tls_cert,
        tls_key=tls_key,
        auth=auth,
        proxy={
            "remoteurl": f"https://{stack.upstream_host}",
            "username": stack.upstream_username,
            "password": stack.upstream_password,
        },
    )
    proc = ManagedProcess(
        "registry-dev-cache",
        [str(docker_registry()), "serve", str(config)],
        workdir / "cache.log",
        env={"SSL_CERT_FILE": str(stack.ca_path)},
        redact=[stack.upstream_password, password or ""],
    )
    scheme = "https" if tls or stack_certificate else "http"
    try:
        wait_until(
            functools.partial(_ready, f"{scheme}://{host}/v2/", ca_path, 401 if login else 200),
            timeout=READY_TIMEOUT,
            what=f"dev cache at {scheme}://{host}/v2/",
            alive=proc.exited,
        )
    except BaseException:
        proc.stop()
        raise
    return DevCache(
        host=host,
        process=proc,
        ca_path=ca_path,
        username=username if login else None,
        password=password,
        htpasswd=htpasswd,
    )
