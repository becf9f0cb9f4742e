"""Secretless pulls in the chart (kubeletPlugin) and in the kustomize overlay kubelet-plugin.

Rendered with the pinned helm and kustomize; the RBAC is applied to a real API
server and asked, with SubjectAccessReviews, whether it grants what the API
server checks: a kubelet requesting a token of mirrorgate's audience, and
mirrorgate creating a TokenReview. The DaemonSet's Pods run on a node only in
tests/e2e/node (marker secretless).

The chart renders kubeletPlugin only for Kubernetes 1.34 or newer, and refuses it
before (docs/install.md, "Supported Kubernetes versions"): both sides are rendered
with `--kube-version`, and the API server the suite runs (v1.30.14, v1.34.4 or v1.37.2
under `make test-versions`) is asked which side it is on.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from mirrorgate import policy
from tests.e2e.api import test_helm as helm_tests
from tests.e2e.harness import helm as h
from tests.e2e.harness import kube
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT, kubernetes_minor
from tests.e2e.harness.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

ON = {"mode": "enforce", "kubeletPlugin.enabled": "true"}
KUBELET_DELIVERY = {**ON, "policy.credentials.harbor-pull.delivery": "kubelet"}
PLUGIN_KINDS = {
    ("DaemonSet", "mirrorgate-kubelet-plugin"),
    ("ClusterRole", "mirrorgate-kubelet-audience"),
    ("ClusterRoleBinding", "mirrorgate-kubelet-audience"),
    ("ClusterRole", "mirrorgate-tokenreview"),
    ("ClusterRoleBinding", "mirrorgate-tokenreview"),
    ("RoleBinding", "mirrorgate-kubelet-client-ca"),
}

KUBELET_PLUGIN_SINCE = 34
"""The minor from which the chart renders kubeletPlugin: service-account tokens for kubelet
credential providers (KEP-4412) are beta and on by default from 1.34."""


def _refusal(version: str) -> str:
    """The chart's one message for kubeletPlugin.enabled on a cluster of ``version`` (which
    helm reports with its "v")."""
    version = "v" + version.removeprefix("v")
    major, minor = version[1:].split(".")[:2]
    return (
        "kubeletPlugin.enabled: secretless pulls need Kubernetes 1.34 or newer "
        "(service-account tokens for kubelet credential providers, KEP-4412), and this "
        f"cluster is {major}.{minor} ({version}); keep delivery: pullSecret there and leave "
        "kubeletPlugin.enabled false"
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def _keys(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if (o["kind"], o["metadata"]["name"]) == (kind, name)]
    return found


def _notes(helm: Path, home: Path, values: dict[str, str]) -> str:
    # The chart ships no policy: the example's, whose credential the values switch.
    return h.notes(helm, home, values, files=[helm_tests.EXAMPLE_POLICY])


def test_off_by_default_and_lint_clean_when_on(helm: Path, home: Path) -> None:
    """The defaults render none of it; enabled, `helm lint --strict` is clean and the
    DaemonSet and the three pieces of RBAC render."""
    assert not _keys(h.template(helm, home)) & PLUGIN_KINDS
    for values in (ON, {**KUBELET_DELIVERY, "kubeletPlugin.clusterIP": "10.96.0.53"}):
        done = h.run(helm, "lint", "--strict", str(h.CHART), *h.set_args(values), home=home)
        assert "0 chart(s) failed" in done.stdout
        assert "[WARNING]" not in done.stdout
        assert "[ERROR]" not in done.stdout
    assert _keys(h.template(helm, home, ON)) >= PLUGIN_KINDS


@pytest.mark.parametrize("version", ["1.34.0", "v1.34.2-eks-5f1b2c3", "1.37.2"])
def test_from_1_34_it_renders(helm: Path, home: Path, version: str) -> None:
    """A cluster of 1.34 or newer (a provider's build of 1.34 too): the DaemonSet and the
    RBAC, and the endpoint's flags on the Deployment."""
    objects = h.template(helm, home, ON, kube_version=version)
    assert _keys(objects) >= PLUGIN_KINDS
    spec = _one(objects, "Deployment", "mirrorgate")["spec"]["template"]["spec"]
    assert "--kubelet-port=8444" in spec["containers"][0]["args"]


@pytest.mark.parametrize("version", ["1.30.0", "1.33.9", "v1.33.5-eks-5f1b2c3"])
def test_before_1_34_it_refuses_with_one_message(helm: Path, home: Path, version: str) -> None:
    """An older cluster: no rendering at all, and one message naming the value, the minor
    found, 1.34 and what to keep there; the same cluster renders the chart without it."""
    stderr = h.refused(helm, home, KUBELET_DELIVERY, kube_version=version)
    assert _refusal(version) in stderr
    assert stderr.count("kubeletPlugin.enabled:") == 1
    rendered = h.template(helm, home, {"mode": "enforce"}, kube_version=version)
    assert not _keys(rendered) & PLUGIN_KINDS
    assert ("Deployment", "mirrorgate") in _keys(rendered)


def test_the_docs_quote_the_message() -> None:
    """docs/install.md's secretless section quotes the refusal word for word."""
    install = (REPO_ROOT / "docs" / "install.md").read_text()
    assert _refusal("v1.33.5") in " ".join(install.split())


def test_the_api_servers_version_decides(
    helm: Path, home: Path, control_plane: ControlPlane
) -> None:
    """What `helm install` does against the API server the suite runs: from 1.34 (v1.34.4,
    v1.37.2) the server-side dry run renders the DaemonSet; on v1.30.14 it is refused with
    the message. `helm template --dry-run=server` given the other side's `--kube-version`
    does the same: the server's version decides, not helm's own or a flag."""
    minor = kubernetes_minor()
    with control_plane.api_client() as api:
        served = k8s.VersionApi(api).get_code()
        assert (served.major, served.minor.rstrip("+")) == ("1", str(minor)), served
        # The policy kinds of crds/ served, as `helm install` makes them first (a dry run
        # makes none); the session's mirrorgate has the same ones (manifests/base).
        helm_tests._policy_crds(api)
    name = f"kv-{secrets.token_hex(3)}"
    namespace = f"mg-{name}"
    chart = [name, str(h.CHART), "--namespace", namespace, "--dry-run=server"]
    values = h.set_args({**ON, "fullnameOverride": name})
    other = "1.33.0" if minor >= KUBELET_PLUGIN_SINCE else "1.37.0"
    install = h.run(
        helm,
        "install",
        *chart,
        *values,
        home=home,
        kubeconfig=control_plane.kubeconfig,
        check=False,
    )
    template = h.run(
        helm,
        "template",
        *chart,
        "--kube-version",
        other,
        *values,
        home=home,
        kubeconfig=control_plane.kubeconfig,
        check=False,
    )
    # install prints the release, then the objects between MANIFEST: and NOTES:.
    manifest = install.stdout.partition("MANIFEST:\n")[2].partition("\nNOTES:")[0]
    for what, done, text in (("install", install, manifest), ("template", template, None)):
        if minor >= KUBELET_PLUGIN_SINCE:
            assert done.returncode == 0, (what, done.stderr)
            objects = [o for o in yaml.safe_load_all(done.stdout if text is None else text) if o]
            assert ("DaemonSet", f"{name}-kubelet-plugin") in _keys(objects), what
        else:
            assert done.returncode != 0, (what, done.stdout)
            assert _refusal(served.git_version) in done.stderr, (what, done.stderr)


def test_the_daemonset_writes_only_the_plugin_directory(helm: Path, home: Path) -> None:
    """One hostPath, the configured directory, and it is the only writable mount; no
    ServiceAccount token, no privilege, a read-only root; not a Pod any Service selects."""
    values = {**ON, "kubeletPlugin.binDir": "/etc/eks/image-credential-provider"}
    objects = h.template(helm, home, values)
    daemonset = _one(objects, "DaemonSet", "mirrorgate-kubelet-plugin")
    spec = daemonset["spec"]["template"]["spec"]
    host_paths = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
    assert host_paths == ["/etc/eks/image-credential-provider"]
    (container,) = spec["containers"]
    writable = [m["name"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["plugins"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in context
    assert spec["automountServiceAccountToken"] is False
    assert spec["tolerations"] == [{"operator": "Exists"}]
    (ca,) = [v for v in spec["volumes"] if v["name"] == "ca"]
    assert ca["configMap"] == {
        "name": "mirrorgate-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        assert not selector.items() <= pod_labels.items(), service["metadata"]["name"]
    # Under cert-manager only the CA certificate of the serving Secret, never its key.
    certified = h.template(helm, home, {**ON, "certificates.mode": "cert-manager"})
    spec = _one(certified, "DaemonSet", "mirrorgate-kubelet-plugin")["spec"]["template"]["spec"]
    (ca,) = [v for v in spec["volumes"] if v["name"] == "ca"]
    assert ca["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]


def test_the_daemonset_takes_pull_secrets_as_the_deployment_does(helm: Path, home: Path) -> None:
    """`imagePullSecrets` takes plain names or {name: ...} objects: the DaemonSet, which
    pulls the same image, once rendered an object as `name: map[name:b]`."""
    values = {**ON, "imagePullSecrets[0]": "a", "imagePullSecrets[1].name": "b"}
    objects = h.template(helm, home, values)
    for kind, name in (("Deployment", "mirrorgate"), ("DaemonSet", "mirrorgate-kubelet-plugin")):
        spec = _one(objects, kind, name)["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}], kind


def test_the_cluster_ip_is_served_and_certified(helm: Path, home: Path) -> None:
    """kubeletPlugin.clusterIP: a Service at that address for mirrorgate's Pods, and the
    address in the serving certificate (serve --tls-name; cert-manager's ipAddresses)."""
    values = {**ON, "kubeletPlugin.clusterIP": "10.96.0.53"}
    objects = h.template(helm, home, values)
    service = _one(objects, "Service", "mirrorgate-kubelet-plugin")
    assert service["spec"]["clusterIP"] == "10.96.0.53"
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "mirrorgate"}
    args = _one(objects, "Deployment", "mirrorgate")["spec"]["template"]["spec"]["containers"][0]
    assert "--tls-name=10.96.0.53" in args["args"]
    assert {"name": "kubelet", "containerPort": 8444} in args["ports"]
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "kubelet"}]
    certified = h.template(helm, home, {**values, "certificates.mode": "cert-manager"})
    assert _one(certified, "Certificate", "mirrorgate-serving")["spec"]["ipAddresses"] == [
        "10.96.0.53"
    ]
    assert ("Service", "mirrorgate-kubelet-plugin") not in _keys(h.template(helm, home, ON))


def test_serve_gets_the_endpoint_flags_of_the_values(helm: Path, home: Path) -> None:
    """The endpoint on its own port, with the audience and the cache duration the kubelets'
    entry names; its port admitted by the NetworkPolicy beside the admission port."""
    values = {**ON, "kubeletPlugin.audience": "gate", "kubeletPlugin.cacheDuration": "60"}
    objects = h.template(helm, home, values)
    args = _one(objects, "Deployment", "mirrorgate")["spec"]["template"]["spec"]["containers"][0]
    assert args["args"][-3:] == [
        "--kubelet-port=8444",
        "--kubelet-audience=gate",
        "--kubelet-cache-duration=60",
    ]
    ingress = _one(objects, "NetworkPolicy", "mirrorgate")["spec"]["ingress"]
    assert {"ports": [{"port": "kubelet", "protocol": "TCP"}]} in ingress
    role = _one(objects, "ClusterRole", "mirrorgate-kubelet-audience")
    assert role["rules"][0]["resources"] == ["gate"]
    reader = _one(objects, "RoleBinding", "mirrorgate-kubelet-client-ca")
    assert (reader["metadata"]["namespace"], reader["roleRef"]["name"]) == (
        "kube-system",
        "extension-apiserver-authentication-reader",
    )
    default = _one(h.template(helm, home), "Deployment", "mirrorgate")
    assert not any(
        a.startswith("--kubelet")
        for a in default["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_notes_print_the_kubelets_credential_provider_entry(helm: Path, home: Path) -> None:
    """The entry the kubelet needs: the policy's kubelet-delivered mirrors as matchImages,
    the audience as a ServiceAccount-cached, required token, the fixed address and the CA
    the DaemonSet writes (the kubelet itself reads it in tests/e2e/node)."""
    values = {**KUBELET_DELIVERY, "kubeletPlugin.clusterIP": "10.96.0.53"}
    config = h.provider_config(_notes(helm, home, values))
    (provider,) = config["providers"]
    assert provider["name"] == "mirrorgate-credential-provider"
    assert provider["apiVersion"] == "credentialprovider.kubelet.k8s.io/v1"
    assert provider["matchImages"] == [
        "harbor.corp.example/dockerhub-proxy",
        "harbor.corp.example/ghcr-proxy",
    ]
    assert provider["tokenAttributes"] == {
        "serviceAccountTokenAudience": "mirrorgate",
        "cacheType": "ServiceAccount",
        "requireServiceAccount": True,
    }
    bin_dir = "/usr/libexec/kubernetes/kubelet-plugins/credential-provider/exec"
    assert provider["defaultCacheDuration"] == "5m"
    assert provider["args"] == [
        "--url=https://10.96.0.53/kubelet-credentials",
        f"--ca-file={bin_dir}/mirrorgate-ca.crt",
    ]
    assert config["kind"] == "CredentialProviderConfig"
    # pullSecret everywhere (the default): no mirror to match, and the NOTES say so.
    idle = _notes(helm, home, ON)
    assert h.provider_config(idle)["providers"][0]["matchImages"] == []
    assert "No credential of the policy has delivery: kubelet yet" in idle
    assert "Set kubeletPlugin.clusterIP" in idle
    assert "--url=https://[fd00::53]/kubelet-credentials" in _notes(
        helm, home, {**ON, "kubeletPlugin.clusterIP": "fd00::53"}
    )


# Policies that spell a rule's credential or mirror as a list (docs/policy-reference.md),
# each with the matchImages the kubelet's entry must have: the mirrors that a credential
# with delivery: kubelet applies to, without scheme, in the policy's order.
LIST_POLICIES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "credential-list": (
        {
            "mirrors": [
                # One robot per team: team-a's is kubelet-delivered, so the mirror is matched.
                {
                    "source": "docker.io",
                    "mirror": "harbor.corp.example/dockerhub-proxy",
                    "credential": ["robot-a", "robot-b"],
                },
                # Both teams' robots are pull secrets: not matched.
                {
                    "source": "ghcr.io",
                    "mirror": "harbor.corp.example/ghcr-proxy",
                    "credential": ["robot-b", "robot-c"],
                },
                {
                    "source": "quay.io",
                    "mirror": "https://harbor.corp.example/quay-proxy",
                    "credential": ["robot-c", "robot-d"],
                },
            ],
            "credentials": {
                "robot-a": {"namespaces": ["team-a"], "delivery": "kubelet"},
                "robot-b": {"namespaces": ["team-b"]},
                "robot-c": {"namespaces": ["team-c"], "delivery": "pullSecret"},
                "robot-d": {"namespaces": ["team-d"], "delivery": "kubelet"},
            },
        },
        ["harbor.corp.example/dockerhub-proxy", "harbor.corp.example/quay-proxy"],
    ),
    "mirror-strings": (
        {
            "mirrors": [
                # URLs only: no mirror of the list has a credential, so none is matched.
                {
                    "source": "docker.io",
                    "mirror": ["harbor-a.corp.example/hub", "http://cache.dev.example:5000/hub"],
                },
                # URLs beside a mapping: only the mapping's mirror has a (kubelet) credential.
                {
                    "source": "ghcr.io",
                    "mirror": [
                        "https://harbor-a.corp.example/ghcr",
                        {"url": "http://cache.dev.example:5000/ghcr", "credential": "cache-pull"},
                    ],
                },
            ],
            "credentials": {"cache-pull": {"namespaces": ["shop"], "delivery": "kubelet"}},
        },
        ["cache.dev.example:5000/ghcr"],
    ),
    "mirror-objects": (
        {
            "mirrors": [
                {
                    "source": "docker.io",
                    "mirror": [
                        {"url": "harbor-a.corp.example/hub", "credential": "harbor-a-pull"},
                        # One robot per team on this mirror, one of them kubelet-delivered.
                        {
                            "url": "https://harbor-b.corp.example/hub",
                            "credential": ["harbor-b-team-a", "harbor-b-team-b"],
                        },
                        # A pull-secret credential: the kubelet need not ask for this one.
                        {"url": "harbor-c.corp.example/hub", "credential": "harbor-c-pull"},
                        {"url": "harbor-d.corp.example/hub"},
                    ],
                },
            ],
            "credentials": {
                "harbor-a-pull": {"namespaces": ["team-a", "team-b"], "delivery": "kubelet"},
                "harbor-b-team-a": {"namespaces": ["team-a"]},
                "harbor-b-team-b": {"namespaces": ["team-b"], "delivery": "kubelet"},
                "harbor-c-pull": {"namespaces": ["team-a", "team-b"]},
            },
        },
        ["harbor-a.corp.example/hub", "harbor-b.corp.example/hub"],
    ),
}


def _policy_file(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "policy-values.yaml"
    path.write_text(yaml.safe_dump({"policy": spec}))
    return path


@pytest.mark.parametrize("case", sorted(LIST_POLICIES))
def test_list_credentials_and_mirror_lists_give_their_match_images(
    helm: Path, home: Path, tmp_path: Path, case: str
) -> None:
    """A rule's `credential` as a list (one per team) and `mirror` as a list of URLs or of
    {url, credential} mappings: the chart renders with kubeletPlugin on, `helm lint
    --strict` is clean, and matchImages holds each mirror any of whose own credentials
    has delivery: kubelet. Such a policy once failed the whole render with `wrong type for
    value; expected string; got []interface {}` (or, a mirror list, matched nothing)."""
    spec, expected = LIST_POLICIES[case]
    policy.load(spec)  # a policy mirrorgate itself accepts
    values = _policy_file(tmp_path, spec)
    objects = h.template(helm, home, ON, files=[values])
    assert ("DaemonSet", "mirrorgate-kubelet-plugin") in _keys(objects)
    rendered = _one(objects, "ClusterMirrorPolicy", "mirrorgate")["spec"]
    assert {key: rendered[key] for key in spec} == spec
    notes = h.notes(helm, home, ON, files=[values])
    assert h.provider_config(notes)["providers"][0]["matchImages"] == expected
    assert "No credential of the policy has delivery: kubelet yet" not in notes
    done = h.run(
        helm, "lint", "--strict", str(h.CHART), "-f", str(values), *h.set_args(ON), home=home
    )
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout
    assert "[ERROR]" not in done.stdout


def test_a_rule_credential_beside_a_mirror_list_is_left_to_mirrorgate(
    helm: Path, home: Path, tmp_path: Path
) -> None:
    """A rule's own `credential` next to a list of mirrors is refused by mirrorgate's
    check, which names the field: the chart renders it (the API server's policy webhook
    then says why), rather than failing on a Go type, and lends the rule's credential to
    no mirror of the list, as the loader never does."""
    spec = {
        "mirrors": [
            {
                "source": "docker.io",
                "mirror": ["harbor-a.corp.example/hub", "harbor-b.corp.example/hub"],
                "credential": "harbor-pull",
            }
        ],
        "credentials": {"harbor-pull": {"namespaces": ["shop"], "delivery": "kubelet"}},
    }
    with pytest.raises(policy.PolicyError, match="cannot stand next to a list of mirrors"):
        policy.load(spec)
    notes = h.notes(helm, home, ON, files=[_policy_file(tmp_path, spec)])
    assert h.provider_config(notes)["providers"][0]["matchImages"] == []


def test_the_overlay_renders_what_the_chart_renders(
    helm: Path, kustomize: Path, home: Path
) -> None:
    """overlays/kubelet-plugin: the enforce overlay plus the chart's kubeletPlugin objects,
    field by field (Helm's own labels and the Namespace apart)."""

    charted = helm_tests._keyed(h.without_helm_labels(h.template(helm, home, ON)))
    rendered = mg.render(kustomize, "overlays/kubelet-plugin")
    kustomized = helm_tests._keyed([o for o in rendered if o["kind"] != "Namespace"])
    # The chart's ClusterMirrorPolicy against the base's deprecated ConfigMap policy, as
    # for every overlay (test_helm).
    helm_tests._the_policy_apart(charted, kustomized)
    assert sorted(charted) == sorted(kustomized)
    for key, obj in kustomized.items():
        assert charted[key] == obj, key


def _allowed(api: k8s.ApiClient, who: dict[str, Any], **attributes: str) -> bool:
    """Whether the API server's authorizer lets ``who`` (user, groups) do ``attributes``."""
    asked = k8s.V1ResourceAttributes(
        verb=attributes["verb"],
        group=attributes["group"],
        resource=attributes["resource"],
        name=attributes.get("name"),
        namespace=attributes.get("namespace"),
    )
    spec = k8s.V1SubjectAccessReviewSpec(resource_attributes=asked, **who)
    review = k8s.V1SubjectAccessReview(spec=spec)
    status = k8s.AuthorizationV1Api(api).create_subject_access_review(review).status
    assert status is not None
    return bool(status.allowed)


def test_the_rbac_grants_what_the_api_server_checks(
    helm: Path, home: Path, control_plane: ControlPlane
) -> None:
    """Applied to a real API server: the nodes may request tokens of the audience (and of
    no other), mirrorgate's ServiceAccount may create TokenReviews and read the kubelets'
    client CA (that ConfigMap only), and a tenant may do none of it."""
    name = f"kp-{secrets.token_hex(3)}"
    namespace = f"mg-{name}"
    values = {**ON, "fullnameOverride": name, "kubeletPlugin.audience": f"{name}-audience"}
    objects = h.template(helm, home, values, namespace=namespace)
    wanted = [
        o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "RoleBinding")
    ]
    wanted = [
        o
        for o in wanted
        if o["metadata"]["name"].endswith(("-kubelet-audience", "-tokenreview", "-client-ca"))
    ]
    assert len(wanted) == 5
    node = {"user": "system:node:node-a", "groups": ["system:nodes", "system:authenticated"]}

    # What the API server asks its authorizer: a node's token request for a Pod's
    # ServiceAccount with this audience, mirrorgate's review, its read of the client CA.
    def token_audience(audience: str) -> dict[str, str]:
        return {
            "verb": "request-serviceaccounts-token-audience",
            "group": "",
            "resource": audience,
            "name": "default",
            "namespace": "shop",
        }

    review = {"verb": "create", "group": "authentication.k8s.io", "resource": "tokenreviews"}

    def client_ca(configmap: str) -> dict[str, str]:
        return {
            "verb": "get",
            "group": "",
            "resource": "configmaps",
            "name": configmap,
            "namespace": "kube-system",
        }

    server = {"user": f"system:serviceaccount:{namespace}:{name}"}
    tenant = {"user": "system:serviceaccount:shop:default", "groups": ["system:authenticated"]}
    with control_plane.api_client() as api:
        kube.create_namespace(api, namespace)
        try:
            audience = token_audience(f"{name}-audience")
            assert not _allowed(api, node, **audience)
            kube.apply(api, wanted)
            assert _allowed(api, node, **audience)
            assert not _allowed(api, node, **token_audience("another-audience"))
            assert not _allowed(api, tenant, **audience)
            assert _allowed(api, server, **review)
            assert not _allowed(api, tenant, **review)
            assert _allowed(api, server, **client_ca("extension-apiserver-authentication"))
            assert not _allowed(api, server, **client_ca("kubeadm-config"))
            assert not _allowed(api, tenant, **client_ca("extension-apiserver-authentication"))
            # The DaemonSet and the fixed-address Service are valid objects to the API server.
            placed = h.template(
                helm, home, {**values, "kubeletPlugin.clusterIP": "10.0.0.53"}, namespace=namespace
            )
            kube.apply(
                api,
                [o for o in placed if o["kind"] in ("DaemonSet", "Service")],
                dry_run=True,
            )
        finally:
            rbac = k8s.RbacAuthorizationV1Api(api)
            for obj in wanted:
                if obj["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(obj["metadata"]["name"])
                elif obj["kind"] == "RoleBinding":
                    rbac.delete_namespaced_role_binding(obj["metadata"]["name"], "kube-system")
                else:
                    rbac.delete_cluster_role_binding(obj["metadata"]["name"])
