"""The CRDs of manifests/base/crds/ on a real kube-apiserver: accepted as written, every
policy the loader accepts accepted by their schema, what the schema can refuse refused
with the message it gives, the fields published in OpenAPI v3 (what `kubectl explain`
reads), and the status subresource and printer columns in place.

On a control plane of this module's own: the CRDs are cluster-scoped, and the
session's installations own theirs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
import yaml
from kubernetes import dynamic

from mirrorgate import policy
from mirrorgate.webhook.commands import migrate
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kube import apply, create_namespace, install_policy_crds, run_kubectl
from tests.webhook.test_migrate import EXAMPLE_POLICIES

pytestmark = pytest.mark.e2e
REPOSITORY = Path(__file__).resolve().parents[3]
GROUP_VERSION = policy.API_VERSION
SPEC_FIELDS = {
    "onCredentialError",
    "skipPullPolicyNever",
    "mirrors",
    "health",
    "exclude",
    "credentials",
}
"""A ClusterMirrorPolicy's spec: the policy file's fields."""


@pytest.fixture(scope="module")
def api(own_control_plane: ControlPlane) -> Iterator[k8s.ApiClient]:
    with own_control_plane.api_client() as client:
        install_policy_crds(client)
        create_namespace(client, "team-a")
        yield client


def cluster_object(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ClusterMirrorPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def team_object(name: str, mirrors: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "MirrorPolicy",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"mirrors": mirrors},
    }


def get_json(api: k8s.ApiClient, path: str, accept: str = "application/json") -> Any:
    """GET ``path`` of the API server as the client's user (an admin), decoded."""
    response = api.rest_client.pool_manager.request(
        "GET", f"{api.configuration.host}{path}", headers={"Accept": accept}, timeout=30
    )
    assert response.status == 200, response.data
    return json.loads(response.data)


def refused(api: k8s.ApiClient, obj: dict[str, Any]) -> str:
    """The API server's refusal of creating ``obj`` (fails the test if it is created)."""
    client = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    with pytest.raises(k8s.ApiException) as caught:
        resource.create(body=obj, namespace=obj["metadata"].get("namespace"), dry_run="All")
    assert caught.value.status == 422, caught.value.body
    return str(json.loads(caught.value.body or "{}")["message"])


@pytest.mark.parametrize("path", EXAMPLE_POLICIES, ids=str)
def test_every_example_policy_migrated_is_accepted(api: k8s.ApiClient, path: Path) -> None:
    """The schema is no stricter than the loader: each example, through `policy migrate`."""
    text, _ = migrate.migrated((REPOSITORY / path).read_bytes(), source=str(path))
    apply(api, [yaml.safe_load(text)], dry_run=True)


def test_a_team_object_is_accepted(api: k8s.ApiClient) -> None:
    apply(
        api,
        [
            team_object(
                "ghcr",
                [
                    {"source": "ghcr.io", "mirror": "harbor.example/ghcr", "credential": "robot-a"},
                    {"source": "*.gcr.io", "mirror": "http://cache.local:5000/gcr"},
                ],
            )
        ],
        dry_run=True,
    )


RULE = {"source": "docker.io", "mirror": "harbor.example/hub"}


def test_the_merged_grammar_is_accepted(api: k8s.ApiClient) -> None:
    """A credential list, onNotGranted, a mirror list, delivery, the catch-all and
    skipPullPolicyNever: each accepted as the loader accepts them."""
    spec = {
        "skipPullPolicyNever": False,
        "credentials": {
            "robot-a": {"namespaces": ["team-a"], "delivery": "kubelet"},
            "robot-b": {"namespaces": ["team-b"], "delivery": "pullSecret"},
        },
        "mirrors": [
            {**RULE, "credential": ["robot-a", "robot-b"], "onNotGranted": "next"},
            {
                "source": "ghcr.io",
                "mirror": [
                    {
                        "url": "harbor-a.example/ghcr",
                        "credential": ["robot-a"],
                        "caFile": "/etc/ca.pem",
                    },
                    {"url": "harbor-b.example/ghcr", "credential": "robot-b"},
                    "http://cache.local:5000/ghcr",
                ],
                "onNotGranted": "deny",
            },
            {"source": "*", "mirror": "harbor.example/all", "credential": "robot-a"},
        ],
    }
    assert policy.load(spec)  # the loader's grammar too
    apply(
        api,
        [
            cluster_object("merged", spec),
            team_object(
                "merged",
                [{**RULE, "mirror": ["harbor.example/hub", "harbor.example/hub2"]}],
            ),
        ],
        dry_run=True,
    )


REFUSED = [
    pytest.param(
        team_object("fixed", [{**RULE, "fixed": True}]),
        "only a ClusterMirrorPolicy's rule can be fixed",
        id="fixed-in-a-team-rule",
    ),
    pytest.param(
        cluster_object(
            "both", {"mirrors": [{**RULE, "caFile": "/ca.pem", "insecureSkipVerify": True}]}
        ),
        "insecureSkipVerify and caFile contradict each other",
        id="ca-and-skip-verify",
    ),
    pytest.param(
        cluster_object(
            "scheme", {"mirrors": [{"source": "https://docker.io", "mirror": "m.example/x"}]}
        ),
        "write the source without a scheme",
        id="source-scheme",
    ),
    pytest.param(
        cluster_object("ftp", {"mirrors": [{**RULE, "mirror": "ftp://m.example/x"}]}),
        "spec.mirrors[0].mirror",
        id="mirror-scheme",
    ),
    pytest.param(
        cluster_object("twice", {"mirrors": [RULE, {**RULE, "mirror": "harbor.example/hub2"}]}),
        "Duplicate value",
        id="one-rule-per-source",
    ),
    pytest.param(
        cluster_object("down", {"mirrors": [{**RULE, "onMirrorDown": "retry"}]}),
        'Unsupported value: "retry"',
        id="enum",
    ),
    pytest.param(
        cluster_object("upper", {"mirrors": [{**RULE, "source": "Docker.io"}]}),
        "spec.mirrors[0].source",
        id="upper-case-source",
    ),
    pytest.param(
        cluster_object("nogrant", {"credentials": {"c": {"registry": "harbor.example"}}}),
        "namespaces is required (or namespaceSelector)",
        id="grant-without-namespaces",
    ),
    pytest.param(
        cluster_object("name", {"mirrors": [{**RULE, "credential": "Robot_A"}]}),
        "spec.mirrors[0].credential",
        id="credential-name",
    ),
    pytest.param(
        cluster_object(
            "many",
            {
                "mirrors": [
                    {"source": f"s{i}.example", "mirror": f"m.example/{i}"} for i in range(1001)
                ]
            },
        ),
        "must have at most 1000 items",
        id="too-many-rules",
    ),
    pytest.param(
        cluster_object("credint", {"mirrors": [{**RULE, "credential": 5}]}),
        "spec.mirrors[0].credential",
        id="credential-type",
    ),
    pytest.param(
        cluster_object("credlistname", {"mirrors": [{**RULE, "credential": []}]}),
        "spec.mirrors[0].credential",
        id="credential-empty-list",
    ),
    pytest.param(
        cluster_object("notgranted", {"mirrors": [{**RULE, "onNotGranted": "fallback"}]}),
        'Unsupported value: "fallback"',
        id="on-not-granted-enum",
    ),
    pytest.param(
        cluster_object("notgrantedtype", {"mirrors": [{**RULE, "onNotGranted": True}]}),
        "spec.mirrors[0].onNotGranted",
        id="on-not-granted-type",
    ),
    pytest.param(
        cluster_object("mirrormap", {"mirrors": [{**RULE, "mirror": {"url": "m.example"}}]}),
        "spec.mirrors[0].mirror",
        id="mirror-type",
    ),
    pytest.param(
        cluster_object(
            "mirrormany",
            {"mirrors": [{**RULE, "mirror": [f"m.example/{i}" for i in range(9)]}]},
        ),
        "must have at most 8 items",
        id="mirror-list-too-long",
    ),
    pytest.param(
        cluster_object("mirrorupper", {"mirrors": [{**RULE, "mirror": "Harbor.example/x"}]}),
        "spec.mirrors[0].mirror",
        id="mirror-upper-case",
    ),
    pytest.param(
        cluster_object(
            "delivery", {"credentials": {"c": {"namespaces": ["a"], "delivery": "node"}}}
        ),
        'Unsupported value: "node"',
        id="delivery-enum",
    ),
    pytest.param(
        cluster_object("skipnever", {"skipPullPolicyNever": "yes"}),
        "spec.skipPullPolicyNever",
        id="skip-pull-policy-never-type",
    ),
    pytest.param(
        cluster_object("interval", {"health": {"interval": "ten seconds"}}),
        "spec.health.interval",
        id="duration",
    ),
]


@pytest.mark.parametrize(("obj", "message"), REFUSED)
def test_what_the_schema_can_say_is_refused_with_its_message(
    api: k8s.ApiClient, obj: dict[str, Any], message: str
) -> None:
    assert message in refused(api, obj)


def test_the_published_openapi_has_every_field_with_its_description(
    api: k8s.ApiClient,
) -> None:
    """What `kubectl explain clustermirrorpolicy.spec` reads: the OpenAPI v3 document."""
    document = get_json(api, "/openapi/v3/apis/mirrorgate.io/v1alpha1")
    schemas = document["components"]["schemas"]
    spec = schemas["io.mirrorgate.v1alpha1.ClusterMirrorPolicy"]["properties"]["spec"]
    assert set(spec["properties"]) == SPEC_FIELDS
    rule = spec["properties"]["mirrors"]["items"]["properties"]
    assert rule["fixed"]["description"].startswith("in a ClusterMirrorPolicy: no MirrorPolicy")
    assert rule["source"]["description"] == (
        "host, host/repository-prefix, *.domain, or * (every registry no other rule covers)"
    )
    assert rule["mirror"]["x-kubernetes-preserve-unknown-fields"] is True
    assert rule["credential"]["description"].startswith("a credential name, or one per team")
    team = schemas["io.mirrorgate.v1alpha1.MirrorPolicy"]["properties"]["spec"]
    assert set(team["properties"]) == {"mirrors"}


def test_kubectl_explain_shows_each_field_with_its_description(
    api: k8s.ApiClient, kubectl: Path, own_control_plane: ControlPlane
) -> None:
    """`kubectl explain clustermirrorpolicy.spec` (the real client, reading OpenAPI v3)
    lists the policy file's fields with this repository's descriptions, and goes down to
    a rule's fields; `mirrorpolicy.spec` has only rules."""
    config = own_control_plane.kubeconfig
    spec = run_kubectl(kubectl, config, "explain", "clustermirrorpolicy.spec")
    assert re.search(r"^KIND:\s+ClusterMirrorPolicy$", spec, re.MULTILINE), spec
    assert re.search(r"^GROUP:\s+mirrorgate\.io$", spec, re.MULTILINE), spec
    assert set(re.findall(r"^  (\w+)\s+<", spec, re.MULTILINE)) == SPEC_FIELDS, spec
    fixed = run_kubectl(kubectl, config, "explain", "clustermirrorpolicy.spec.mirrors.fixed")
    assert re.search(r"^FIELD:\s+fixed <boolean>$", fixed, re.MULTILINE), fixed
    assert "in a ClusterMirrorPolicy: no MirrorPolicy" in " ".join(fixed.split()), fixed
    team = run_kubectl(kubectl, config, "explain", "mirrorpolicy.spec")
    assert set(re.findall(r"^  (\w+)\s+<", team, re.MULTILINE)) == {"mirrors"}, team


@pytest.mark.parametrize("plural", ["clustermirrorpolicies", "mirrorpolicies"])
def test_status_is_a_subresource_and_the_printer_columns_show_it(
    api: k8s.ApiClient, kubectl: Path, own_control_plane: ControlPlane, plural: str
) -> None:
    """Of either kind: a spec write cannot set status; the status subresource can; the
    Table `kubectl get` reads has the columns Accepted, Reason and Age, and `kubectl get
    clustermirrorpolicies` / `kubectl get mirrorpolicies -A` print them (the namespace
    first for the namespaced kind)."""
    objects = k8s.CustomObjectsApi(api)
    name = f"status-{plural}"
    namespaced = plural == "mirrorpolicies"
    status = {"status": {"observedGeneration": 9}}
    if namespaced:
        created = objects.create_namespaced_custom_object(
            "mirrorgate.io",
            "v1alpha1",
            "team-a",
            plural,
            {**team_object(name, [RULE]), **status},
        )
    else:
        created = objects.create_cluster_custom_object(
            "mirrorgate.io",
            "v1alpha1",
            plural,
            {**cluster_object(name, {"mirrors": [RULE]}), **status},
        )
    assert isinstance(created, dict)
    assert "status" not in created
    condition = {
        "type": "Accepted",
        "status": "False",
        "reason": "Conflict",
        "message": 'spec.mirrors[0].source: "docker.io" is already the source of ...',
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 1,
    }
    written = {"status": {"observedGeneration": 1, "conditions": [condition]}}
    if namespaced:
        objects.patch_namespaced_custom_object_status(
            "mirrorgate.io", "v1alpha1", "team-a", plural, name, written
        )
    else:
        objects.patch_cluster_custom_object_status(
            "mirrorgate.io", "v1alpha1", plural, name, written
        )
    # Listed across namespaces, as `kubectl get ... -A` asks.
    table = get_json(
        api,
        f"/apis/mirrorgate.io/v1alpha1/{plural}",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns == ["Name", "Accepted", "Reason", "Age"]
    (row,) = [r for r in table["rows"] if r["object"]["metadata"]["name"] == name]
    assert row["cells"][:3] == [name, "False", "Conflict"]
    if namespaced:
        assert row["object"]["metadata"]["namespace"] == "team-a"
    # The real client's rendering of that Table.
    args = ["get", plural, *(["-A"] if namespaced else [])]
    printed = run_kubectl(kubectl, own_control_plane.kubeconfig, *args).splitlines()
    header = ["NAME", "ACCEPTED", "REASON", "AGE"]
    assert printed[0].split() == (["NAMESPACE", *header] if namespaced else header), printed
    key = ["team-a", name] if namespaced else [name]
    (line,) = [line.split() for line in printed[1:] if line.split()[: len(key)] == key]
    assert line[len(key) : len(key) + 2] == ["False", "Conflict"], printed
    assert re.fullmatch(r"\d+[smhdy]\w*", line[-1]), printed
