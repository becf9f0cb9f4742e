"""In-cluster certificates against the real API server: created, injected, and healing."""

from __future__ import annotations

import base64
import copy
import datetime
import secrets
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from kubernetes import client as k8s

from mirrorgate import certs
from mirrorgate.webhook.cluster import kube as cluster_kube
from mirrorgate.webhook.cluster import selfcerts
from tests.commands import MIRRORGATE
from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.fixtures_secrets import ENFORCE_LABELS
from tests.e2e.harness.kube import create_pod
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.suite import Installed, MakeNamespace, e2e_policy, pod

pytestmark = pytest.mark.e2e

WEBHOOKS = 4
"""In manifests/base's two configurations: enforce and audit in the mutating one, the policy
ConfigMap's and the policy objects' validators in the validating one."""


def _grant_base_rbac(api: k8s.ApiClient, user: str, *, webhook_configuration: str) -> None:
    """manifests/base's RBAC for `user`, its webhook-configuration rule on another name.

    The base ClusterRole may touch only the configuration named `mirrorgate`,
    which the session's server owns; this test's server gets the same rules
    for its own configuration, and nothing more. It makes pull secrets too, so
    the reserved prefix lets it.
    """
    mg.allow_reserved_names(api, user)
    rbac = k8s.RbacAuthorizationV1Api(api)
    subject = kube.user_subject(user)
    kube.bind(rbac, f"{user}-base", ("ClusterRole", "mirrorgate"), subject)
    kube.bind(rbac, f"{user}-own", ("Role", "mirrorgate"), subject, namespace=mg.NAMESPACE)
    kube.bind(
        rbac, f"{user}-leader", ("Role", "mirrorgate-leader"), subject, namespace=mg.NAMESPACE
    )
    rbac.create_cluster_role(
        {  # type: ignore[arg-type]
            "metadata": {"name": f"{user}-webhook"},
            "rules": [
                {
                    "apiGroups": ["admissionregistration.k8s.io"],
                    "resources": [
                        "mutatingwebhookconfigurations",
                        "validatingwebhookconfigurations",
                    ],
                    "resourceNames": [webhook_configuration],
                    "verbs": ["get", "list", "watch", "patch"],
                }
            ],
        }
    )
    kube.bind(rbac, f"{user}-webhook", ("ClusterRole", f"{user}-webhook"), subject)


def _secret(api: k8s.ApiClient, name: str) -> dict[str, bytes] | None:
    try:
        secret = k8s.CoreV1Api(api).read_namespaced_secret(name, mg.NAMESPACE)
    except k8s.ApiException as error:
        if error.status == 404:
            return None
        raise
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _published(api: k8s.ApiClient, name: str) -> dict[str, str] | None:
    """The CA certificate ConfigMap ``name`` publishes."""
    return kube.config_map_data(api, mg.NAMESPACE, name)


def _ca_bundles(api: k8s.ApiClient, name: str) -> list[bytes]:
    """Every webhook's caBundle, the mutating configuration's then the validating one's."""
    admission = k8s.AdmissionregistrationV1Api(api)
    found: list[bytes] = []
    for read in (
        admission.read_mutating_webhook_configuration,
        admission.read_validating_webhook_configuration,
    ):
        try:
            configuration = read(name)
        except k8s.ApiException as error:
            if error.status != 404:
                raise
            continue
        found += [
            base64.b64decode(w.client_config.ca_bundle or "") for w in configuration.webhooks or ()
        ]
    return found


def _own_validators(installed: Installed, label: tuple[str, str]) -> dict[str, Any]:
    """The policy's validators for a test's configuration: only objects carrying its label
    (a cluster-scoped object's namespace selects nothing)."""
    validators = copy.deepcopy(installed.validators)
    for webhook in validators["webhooks"]:
        webhook["namespaceSelector"] = {"matchLabels": {label[0]: label[1]}}
        webhook["objectSelector"] = {"matchLabels": {label[0]: label[1]}}
    return validators


def _served_certificate(server: mg.Mirrorgate, ca_pem: bytes) -> bytes:
    """The leaf a new TLS connection gets, verified against `ca_pem` (raises if it fails)."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    host, port = server.url.removeprefix("https://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der).encode()


class _Admissions:
    """Creates Pods in the background and records any that were not mutated or refused."""

    def __init__(self, installed: Installed, api: k8s.ApiClient, namespace: str) -> None:
        self.installed, self.api, self.namespace = installed, api, namespace
        self.created = 0
        self.failures: list[tuple[int, str]] = []
        """(the Pod's number, what went wrong) of each Pod not mutated, or refused."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            name = f"during-{self.created}"
            try:
                stored, _ = create_pod(self.api, self.namespace, pod(self.installed, name=name))
                if stored["spec"]["containers"][0]["image"] != self.installed.registry.mirror_image:
                    self.failures.append((self.created, f"{name}: not rewritten"))
            except k8s.ApiException as error:
                self.failures.append((self.created, f"{name}: {error.status} {error.reason}"))
            self.created += 1
            self._stop.wait(0.2)

    def wait_for(self, more: int, what: str) -> None:
        """Until ``more`` Pods beyond those created so far have been admitted."""
        target = self.created + more
        wait_until(
            lambda: None if self.created >= target else "no admissions yet", timeout=15, what=what
        )

    def __enter__(self) -> _Admissions:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class _OwnServer(NamedTuple):
    server: mg.Mirrorgate
    secret: str  # its --tls-secret
    ca: str  # its --ca-secret and --ca-configmap
    name: str  # its webhook configuration
    label: tuple[str, str]  # the namespace label that configuration selects
    configuration: dict[str, Any]  # to register, without caBundle
    user: str  # whom it runs as


def _own_server(
    installed: Installed, tmp_path: Path, *args: str, replica_of: _OwnServer | None = None
) -> _OwnServer:
    """A server of the test's own with the base's RBAC, keeping its own certificates and
    webhook configuration (which selects only the test's namespaces); with ``replica_of``,
    another replica of that one, sharing its Secrets, configuration and user."""
    plane = installed.control_plane
    if replica_of is None:
        secret = f"e2e-tls-{secrets.token_hex(3)}"
        ca = f"e2e-ca-{secrets.token_hex(3)}"
        name = f"e2e-selfcerts-{secrets.token_hex(3)}"
        user = f"e2e-selfcerts-{secrets.token_hex(3)}"
        with plane.api_client() as api:
            _grant_base_rbac(api, user, webhook_configuration=name)
    else:
        secret, ca, name, user = (
            replica_of.secret,
            replica_of.ca,
            replica_of.name,
            replica_of.user,
        )
    label = ("e2e.mirrorgate.io/selfcerts", name)
    server = mg.start_mirrorgate(
        tmp_path,
        plane,
        policy=e2e_policy(installed.registry),
        tls_secret=secret,
        user=user,
        groups=(),
        args=[
            "--store",
            "kubernetes",
            "--webhook-config",
            name,
            "--ca-secret",
            ca,
            "--ca-configmap",
            ca,
            "--tls-name",
            "127.0.0.1",
            *args,
        ],
    )
    configuration = copy.deepcopy(installed.configuration)
    for webhook in configuration["webhooks"]:
        webhook["namespaceSelector"] = {"matchLabels": {label[0]: label[1]}}
    return _OwnServer(server, secret, ca, name, label, configuration, user)


def test_certificates_are_created_injected_and_heal(
    installed: Installed, make_namespace: MakeNamespace, tmp_path: Path
) -> None:
    """No Secret at first; then an expired and a deleted one: admission never stops."""
    plane = installed.control_plane
    server, secret, ca_secret, name, label, configuration, _ = _own_server(
        installed, tmp_path, "--cert-check-interval", "0.5"
    )
    with plane.api_client() as api:
        try:
            # Registered with no caBundle: the server fills it in, in both
            # configurations; Fail, so that a broken certificate shows.
            mg.register(api, configuration, server, name=name, failure_policy="Fail")
            mg.register(api, _own_validators(installed, label), server, name=name)
            stored = _secret(api, secret)
            authority_secret = _secret(api, ca_secret)
            assert stored is not None
            assert authority_secret is not None
            # The CA's key apart from the serving pair; its certificate alone published.
            assert set(stored) == {"ca.crt", "tls.crt", "tls.key"}
            assert set(authority_secret) == {"ca.crt", "ca.key"}
            ca = stored["ca.crt"]
            assert authority_secret["ca.crt"] == ca
            assert _published(api, ca_secret) == {"ca.crt": ca.decode()}
            wait_until(
                lambda: None if _ca_bundles(api, name) == [ca] * WEBHOOKS else "not injected",
                timeout=15,
                what="caBundle injected",
            )
            assert _served_certificate(server, ca) == stored["tls.crt"]
            leaf = certs.KeyPair(cert_pem=stored["tls.crt"], key_pem=stored["tls.key"])
            lifetime = leaf.not_valid_after - leaf.not_valid_before
            assert datetime.timedelta(days=89) < lifetime < datetime.timedelta(days=91)

            namespace = make_namespace({label[0]: label[1], **ENFORCE_LABELS})
            with _Admissions(installed, api, namespace) as admissions:
                # 1. An expired serving certificate from the same CA.
                authority = certs.CertificateAuthority.load(
                    cert_pem=ca, key_pem=authority_secret["ca.key"]
                )
                past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
                expired = authority.issue_serving(
                    dns_names=certs.service_dns_names(service="mirrorgate", namespace=mg.NAMESPACE),
                    ips=["127.0.0.1"],
                    valid_for=datetime.timedelta(days=1),
                    now=past,
                )
                body = k8s.CoreV1Api(api).read_namespaced_secret(secret, mg.NAMESPACE)
                assert body.data is not None
                body.data["tls.crt"] = base64.b64encode(expired.cert_pem).decode()
                body.data["tls.key"] = base64.b64encode(expired.key_pem).decode()
                k8s.CoreV1Api(api).replace_namespaced_secret(secret, mg.NAMESPACE, body)

                def renewed() -> str | None:
                    now = _secret(api, secret) or {}
                    fresh = now.get("tls.crt") not in (expired.cert_pem, stored["tls.crt"])
                    return None if fresh else "not renewed"

                wait_until(renewed, timeout=15, what="expired certificate renewed")
                healed = _secret(api, secret)
                assert healed is not None
                assert healed["ca.crt"] == ca  # the CA, and so caBundle, stays
                wait_until(
                    lambda: (
                        None
                        if _served_certificate(server, ca) == healed["tls.crt"]
                        else "old certificate served"
                    ),
                    timeout=10,
                    what="renewed cert served",
                )

                # 2. The CA's Secret deleted: a new CA, and caBundle follows it, still
                # trusting the old one (test_a_new_ca_is_trusted_beside_the_old_...).
                k8s.CoreV1Api(api).delete_namespaced_secret(ca_secret, mg.NAMESPACE)

                def recreated() -> str | None:
                    again = _secret(api, secret)
                    return None if again and again["ca.crt"] != ca else "not recreated"

                wait_until(recreated, timeout=15, what="deleted Secret recreated")
                again = _secret(api, secret)
                assert again is not None
                wait_until(
                    lambda: (
                        None
                        if _ca_bundles(api, name) == [again["ca.crt"] + ca] * WEBHOOKS
                        else "caBundle not updated"
                    ),
                    timeout=20,
                    what="caBundle follows",
                )
                # caBundle trusts the new CA before the new certificate is served.
                wait_until(
                    lambda: (
                        None
                        if _served_certificate(server, again["ca.crt"] + ca) == again["tls.crt"]
                        else "old certificate served"
                    ),
                    timeout=10,
                    what="new cert served",
                )
                wait_until(
                    lambda: (
                        None
                        if _published(api, ca_secret) == {"ca.crt": (again["ca.crt"] + ca).decode()}
                        else "new CA not published"
                    ),
                    timeout=10,
                    what="the new CA published",
                )
                admissions.wait_for(3, "a few more admissions on the new CA")
            assert admissions.created >= 10
            assert admissions.failures == []
        finally:
            mg.unregister(api, name)
            server.stop()


def _add_replica_webhook(api: k8s.ApiClient, name: str, server: mg.Mirrorgate) -> None:
    """A copy of the configuration's first webhook calling ``server``: each Pod then passes
    through both replicas, so that a certificate either serves shows at once."""
    admission = k8s.AdmissionregistrationV1Api(api)
    for _ in range(10):  # the servers set caBundle meanwhile: read again on a conflict
        body = api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
            admission.read_mutating_webhook_configuration(name)
        )
        webhook = copy.deepcopy(body["webhooks"][0])
        path = webhook["clientConfig"]["url"].split("/", 3)[3]
        webhook["name"] = f"replica-b.{webhook['name']}"
        webhook["clientConfig"] = {"url": f"{server.url}/{path}"}
        body["webhooks"].append(webhook)
        try:
            admission.replace_mutating_webhook_configuration(name, body)
        except k8s.ApiException as error:
            if error.status != 409:
                raise
            time.sleep(0.2)
            continue
        return
    raise AssertionError(f"{name} kept changing")


@pytest.mark.parametrize("how", ["restart", "next check"])
def test_a_new_ca_is_trusted_beside_the_old_while_replicas_switch(
    installed: Installed,
    make_namespace: MakeNamespace,
    tmp_path: Path,
    e2e_figures: dict[str, str],
    how: str,
) -> None:
    """Two replicas, A and B, each the endpoint of a webhook of its own (failurePolicy Fail,
    so that every Pod needs both). The CA Secret is deleted, as docs/operations.md's
    rotation says, and one replica makes the new CA: with "restart", a third one starting
    as a restarted Deployment's new Pod does (a fresh --tls-dir, not yet an endpoint); with
    "next check", A at its next check (every second). The others switch at a check of their
    own, 300 s away, or when they see caBundle change. No Pod may be refused meanwhile.
    Until `previous-ca.until`, caBundle and the ConfigMap carry both CAs; after it, the
    new one alone."""
    plane = installed.control_plane
    often = ("--cert-check-interval", "1")
    a = _own_server(installed, tmp_path / "a", *(often if how == "next check" else ()))
    b = _own_server(installed, tmp_path / "b", replica_of=a)
    others: list[mg.Mirrorgate] = []
    replicas = WEBHOOKS + 1
    with plane.api_client() as api:
        try:
            mg.register(api, a.configuration, a.server, name=a.name, failure_policy="Fail")
            mg.register(api, _own_validators(installed, a.label), a.server, name=a.name)
            _add_replica_webhook(api, a.name, b.server)
            authority = _secret(api, a.ca)
            assert authority is not None
            old = authority["ca.crt"]
            wait_until(
                lambda: None if _ca_bundles(api, a.name) == [old] * replicas else "not injected",
                timeout=15,
                what="caBundle injected",
            )
            assert _served_certificate(b.server, old) == _served_certificate(a.server, old)

            def serves_the_new_ca(server: mg.Mirrorgate) -> str | None:
                now = _secret(api, a.ca) or {}
                if now.get("ca.crt", old) == old:
                    return "no new CA yet"
                try:
                    _served_certificate(server, now["ca.crt"])
                except OSError:  # ssl.SSLError among them
                    return "a certificate from the old CA served"
                return None

            namespace = make_namespace({a.label[0]: a.label[1], **ENFORCE_LABELS})
            with _Admissions(installed, api, namespace) as admissions:
                admissions.wait_for(3, "admissions before the rotation")
                assert admissions.failures == []
                before = admissions.created
                k8s.CoreV1Api(api).delete_namespaced_secret(a.ca, mg.NAMESPACE)
                if how == "restart":
                    # It checks every second, so that the end of the overlap shows below.
                    c = _own_server(installed, tmp_path / "c", *often, replica_of=a)
                    others.append(c.server)
                wait_until(
                    lambda: serves_the_new_ca(a.server), timeout=20, what="A serves the new CA"
                )
                wait_until(
                    lambda: serves_the_new_ca(b.server), timeout=20, what="B serves the new CA"
                )
                admissions.wait_for(5, "admissions after the rotation")
                during = admissions.created - before
            refused = len(admissions.failures)
            e2e_figures[f"a new CA, two replicas (failurePolicy Fail, {how})"] = (
                f"{during} Pods created during the rotation, {refused} refused"
            )
            assert admissions.failures == []

            # Both CAs are trusted, and published, until previous-ca.until.
            rotated = _secret(api, a.ca)
            assert rotated is not None
            new = rotated["ca.crt"]
            assert set(rotated) == {"ca.crt", "ca.key", "previous-ca.crt", "previous-ca.until"}
            assert rotated["previous-ca.crt"] == old
            until = datetime.datetime.fromisoformat(rotated["previous-ca.until"].decode())
            soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=9)
            assert until > soon
            assert _ca_bundles(api, a.name) == [new + old] * replicas
            assert _published(api, a.ca) == {"ca.crt": (new + old).decode()}
            served = _secret(api, a.secret)
            assert served is not None
            assert set(served) == {"ca.crt", "tls.crt", "tls.key"}
            assert served["ca.crt"] == new

            # Once it has passed, the old CA is dropped everywhere.
            k8s.CoreV1Api(api).patch_namespaced_secret(
                a.ca,
                mg.NAMESPACE,
                {
                    "data": {
                        "previous-ca.until": base64.b64encode(b"2000-01-01T00:00:00+00:00").decode()
                    }
                },
            )
            wait_until(
                lambda: None if _ca_bundles(api, a.name) == [new] * replicas else "old CA kept",
                timeout=15,
                what="the old CA dropped from caBundle",
            )
            # The ConfigMap follows caBundle in the same check, a moment later.
            wait_until(
                lambda: (
                    None
                    if _published(api, a.ca) == {"ca.crt": new.decode()}
                    else "old CA still published"
                ),
                timeout=15,
                what="the old CA dropped from the ConfigMap",
            )
            assert set(_secret(api, a.ca) or {}) == {"ca.crt", "ca.key"}
            key_line = rotated["ca.key"].splitlines()[1].decode()
            for server in (a.server, b.server, *others):
                assert key_line not in server.logs()
        finally:
            mg.unregister(api, a.name)
            for server in (a.server, b.server, *others):
                server.stop()


def test_a_replaced_configuration_gets_its_ca_bundle_back_within_10_s(
    installed: Installed, make_namespace: MakeNamespace, tmp_path: Path, e2e_figures: dict[str, str]
) -> None:
    """`kubectl replace` or `helm upgrade --force` stores the configuration as the
    manifests write it, without caBundle: the API server then cannot verify
    mirrorgate. The server checks its certificates every 300 s (the default
    here) but watches its configuration, so caBundle is back within 10 s; the
    Pods created meanwhile (failurePolicy Fail, so that the gap shows) are counted."""
    plane = installed.control_plane
    server, secret, _, name, label, configuration, _ = _own_server(installed, tmp_path)
    try:
        with plane.api_client() as api:
            admission = k8s.AdmissionregistrationV1Api(api)
            mg.register(api, configuration, server, name=name, failure_policy="Fail")
            mg.register(api, _own_validators(installed, label), server, name=name)
            stored = _secret(api, secret)
            assert stored is not None
            ca = stored["ca.crt"]
            wait_until(
                lambda: None if _ca_bundles(api, name) == [ca] * WEBHOOKS else "not injected",
                timeout=15,
                what="caBundle injected",
            )
            namespace = make_namespace({label[0]: label[1], **ENFORCE_LABELS})
            with _Admissions(installed, api, namespace) as admissions:
                admissions.wait_for(3, "admissions before the replace")
                assert admissions.failures == []
                # The second time, the watch is an old one; the third, the policy's
                # validators are replaced (their own watch).
                for round_, kind in enumerate(["mutating", "mutating", "validating"]):
                    # The manifest as written (no caBundle), with the live
                    # resourceVersion, as `kubectl replace` sends it.
                    manifest = api.sanitize_for_serialization(
                        getattr(admission, f"read_{kind}_webhook_configuration")(name)
                    )
                    manifest["metadata"] = {
                        "name": name,
                        "resourceVersion": manifest["metadata"]["resourceVersion"],
                    }
                    for webhook in manifest["webhooks"]:
                        del webhook["clientConfig"]["caBundle"]
                    before = admissions.created
                    started = time.monotonic()
                    stored_now = getattr(admission, f"replace_{kind}_webhook_configuration")(
                        name, manifest
                    )
                    emptied = [w.client_config.ca_bundle for w in stored_now.webhooks or ()]
                    assert emptied == [None] * 2
                    wait_until(
                        lambda: (
                            None
                            if _ca_bundles(api, name) == [ca] * WEBHOOKS
                            else "caBundle still empty"
                        ),
                        timeout=10,
                        what="caBundle restored after a replace",
                    )
                    gap = time.monotonic() - started
                    # The Pod being created now was sent in the gap (its answer may come
                    # after this): it counts with the gap's, and only later ones must pass.
                    in_gap = admissions.created
                    admissions.wait_for(3, "admissions after the restore")
                    late = [failure for n, failure in admissions.failures if n > in_gap]
                    during = in_gap + 1 - before
                    refused = len(admissions.failures) - len(late)
                    admissions.failures.clear()
                    assert late == [], late
                    e2e_figures[f"caBundle restored after a replace (round {round_ + 1})"] = (
                        f"{gap:.2f} s, {during} Pods created meanwhile, {refused} refused"
                    )
    finally:
        with plane.api_client() as api:
            mg.unregister(api, name)
        server.stop()


def test_certs_inject_sets_every_ca_bundle(installed: Installed, tmp_path: Path) -> None:
    """`mirrorgate certs inject` puts the CA, base64-encoded once, on every webhook."""
    plane = installed.control_plane
    name = f"e2e-inject-{secrets.token_hex(3)}"
    configuration = copy.deepcopy(installed.configuration)
    for webhook in configuration["webhooks"]:
        webhook["namespaceSelector"] = {"matchLabels": {"e2e.mirrorgate.io/inject": name}}
    authority = certs.CertificateAuthority.generate(common_name="inject-ca")
    (tmp_path / "ca.crt").write_bytes(authority.cert_pem)

    def inject(ca: Path) -> subprocess.CompletedProcess[str]:
        command = ["certs", "inject", "--webhook-config", name, "--ca", str(ca)]
        return subprocess.run(
            [*MIRRORGATE, *command, "--kubeconfig", str(plane.kubeconfig)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
            check=False,
        )

    with plane.api_client() as api:
        mg.register(api, configuration, installed.server, name=name)
        mg.register(
            api,
            _own_validators(installed, ("e2e.mirrorgate.io/inject", name)),
            installed.server,
            name=name,
        )
        try:
            result = inject(tmp_path / "ca.crt")
            assert result.returncode == 0, result.stderr
            assert f"set caBundle on 2 webhooks of MutatingWebhookConfiguration {name}" in (
                result.stderr
            )
            assert f"set caBundle on 2 webhooks of ValidatingWebhookConfiguration {name}" in (
                result.stderr
            )
            assert _ca_bundles(api, name) == [authority.cert_pem] * WEBHOOKS
            # A file that is not a PEM certificate is refused, naming it, and changes nothing.
            (tmp_path / "bad.crt").write_text("not a certificate")
            refused = inject(tmp_path / "bad.crt")
            assert refused.returncode == 2
            assert str(tmp_path / "bad.crt") in refused.stderr
            assert "Traceback" not in refused.stderr
            assert _ca_bundles(api, name) == [authority.cert_pem] * WEBHOOKS
        finally:
            mg.unregister(api, name)


def _legacy_tls_secret(api: k8s.ApiClient) -> dict[str, bytes]:
    """Secret mirrorgate-tls as an earlier version left it: its CA's key beside the pair
    (made before the reserved prefix was in force). Its data."""
    dns = certs.service_dns_names(service="mirrorgate", namespace=mg.NAMESPACE)
    authority = certs.CertificateAuthority.generate(common_name="mirrorgate.mirrorgate CA")
    leaf = authority.issue_serving(dns_names=dns)
    legacy = {
        "ca.crt": authority.cert_pem,
        "ca.key": authority.key_pem,
        "tls.crt": leaf.cert_pem,
        "tls.key": leaf.key_pem,
    }
    mg.made_before_install(
        api,
        mg.NAMESPACE,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(
                name="mirrorgate-tls", labels={"app.kubernetes.io/name": "mirrorgate"}
            ),
            type="kubernetes.io/tls",
            data={k: base64.b64encode(v).decode() for k, v in legacy.items()},
        ),
    )
    return legacy


def _upkeep(
    installed: Installed, directory: Path, grace: datetime.timedelta = selfcerts.LEGACY_KEY_GRACE
) -> selfcerts.SelfManagedCertificates:
    """The default install's certificate upkeep, as mirrorgate's ServiceAccount, confined."""
    client = cluster_kube.Kube.connect(
        kubeconfig=str(
            installed.control_plane.kubeconfig_for(
                mg.SERVICE_ACCOUNT_USER, mg.SERVICE_ACCOUNT_GROUPS
            )
        )
    )
    return selfcerts.SelfManagedCertificates(
        client,
        namespace=mg.NAMESPACE,
        secret="mirrorgate-tls",
        service="mirrorgate",
        webhook_configuration=None,
        directory=directory,
        ca_secret="mirrorgate-ca",
        ca_configmap="mirrorgate-ca",
        legacy_key_grace=grace,
    )


def _remove_default_certificates(api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    for name in ("mirrorgate-tls", "mirrorgate-ca"):
        core.delete_namespaced_secret(name, mg.NAMESPACE)
    core.delete_namespaced_config_map("mirrorgate-ca", mg.NAMESPACE)


def test_an_earlier_versions_ca_key_moves_to_a_secret_of_its_own(
    installed: Installed, tmp_path: Path
) -> None:
    """A TLS Secret holding ca.key beside the serving pair (before the CA had a Secret of
    its own): the same CA is moved, so the leaf and caBundle stay; its certificate is
    published; the key leaves the TLS Secret only once the CA Secret is old enough that
    the earlier version's replicas are gone. As mirrorgate's ServiceAccount, confined."""
    with installed.control_plane.api_client() as api:
        legacy = _legacy_tls_secret(api)
        try:
            _upkeep(installed, tmp_path).reconcile()
            moved = _secret(api, "mirrorgate-ca")
            kept = _secret(api, "mirrorgate-tls")
            published = _published(api, "mirrorgate-ca")
            # Again, within the grace: nothing changes.
            _upkeep(installed, tmp_path).reconcile()
            still = _secret(api, "mirrorgate-tls")
            # Past it (no grace): the key leaves the TLS Secret; the pair stays.
            _upkeep(installed, tmp_path, datetime.timedelta(0)).reconcile()
            stripped = _secret(api, "mirrorgate-tls")
        finally:
            _remove_default_certificates(api)
    assert moved == {"ca.crt": legacy["ca.crt"], "ca.key": legacy["ca.key"]}
    assert kept == legacy
    assert still == legacy
    assert published == {"ca.crt": legacy["ca.crt"].decode()}
    assert stripped == {k: v for k, v in legacy.items() if k != "ca.key"}


def test_a_new_ca_leaves_no_earlier_key_in_the_tls_secret(
    installed: Installed, tmp_path: Path
) -> None:
    """Within the grace an earlier version's ca.key stays in the TLS Secret, for that
    version's replicas; when the CA is replaced meanwhile (its Secret damaged), the new
    ca.crt goes there without the old CA's key beside it, never a pair that does not
    match. The old CA stays trusted, by its certificate alone."""
    with installed.control_plane.api_client() as api:
        legacy = _legacy_tls_secret(api)
        try:
            _upkeep(installed, tmp_path).reconcile()
            k8s.CoreV1Api(api).patch_namespaced_secret(
                "mirrorgate-ca",
                mg.NAMESPACE,
                {"data": {"ca.key": base64.b64encode(b"not a key").decode()}},
            )
            _upkeep(installed, tmp_path).reconcile()
            renewed = _secret(api, "mirrorgate-tls")
            authority = _secret(api, "mirrorgate-ca")
            published = _published(api, "mirrorgate-ca")
        finally:
            _remove_default_certificates(api)
    assert renewed is not None
    assert authority is not None
    assert set(renewed) == {"ca.crt", "tls.crt", "tls.key"}
    assert renewed["ca.crt"] == authority["ca.crt"] != legacy["ca.crt"]
    assert authority["previous-ca.crt"] == legacy["ca.crt"]
    assert published == {"ca.crt": (authority["ca.crt"] + legacy["ca.crt"]).decode()}
