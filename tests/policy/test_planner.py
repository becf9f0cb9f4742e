"""Planning the rewrites of one Pod: images, pull secrets, annotation, warnings."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirrorgate import policy
from mirrorgate.webhook import patch

SHA256 = "sha256:" + "0123456789abcdef" * 4
HUB = "harbor.corp.example/dockerhub-proxy"
HARBOR_SECRET = "mirrorgate-harbor-pull"
TEAM_SECRET = "mirrorgate-team-only"
ANNOTATION = policy.ORIGINAL_IMAGES_ANNOTATION

POLICY = policy.load(
    {
        "mirrors": [
            {"source": "docker.io", "mirror": HUB, "credential": "harbor-pull"},
            {"source": "quay.io/prometheus", "mirror": "mirror.corp.example/prometheus"},
            {"source": "*.gcr.io", "mirror": "mirror.corp.example/gcr"},
            {"source": "ghcr.io", "mirror": "mirror.corp.example/ghcr", "credential": "team-only"},
        ],
        "exclude": {
            "images": ["registry.k8s.io/pause:*", "docker.io/library/busybox"],
            "namespaces": ["team-excluded", "batch-*"],
        },
        "credentials": {
            "harbor-pull": {"namespaces": ["*"]},
            "team-only": {"namespaces": ["team-a"]},
        },
    }
)


def _pod(*images: str, field: str = "containers", **extra: Any) -> dict[str, Any]:
    """A Pod whose ``field`` holds containers c0, c1, ... with ``images``."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {field: [{"name": f"c{i}", "image": image} for i, image in enumerate(images)]},
    }
    for key, value in extra.items():
        if key in ("metadata", "labels", "annotations"):
            target = pod["metadata"] if key != "metadata" else pod
            target[key] = value
        else:
            pod["spec"][key] = value
    return pod


def _rewrites(result: policy.RewritePlan) -> dict[str, str]:
    return {r.site.key: r.new_image for r in result.rewrites}


def _apply(pod: dict[str, Any], result: policy.RewritePlan) -> dict[str, Any]:
    applied: dict[str, Any] = jsonpatch.apply_patch(pod, patch.build_patch(pod, result))
    return applied


# images, namespace, rewrites by site key, pull secrets
REWRITES = [
    pytest.param(
        ["nginx:1.25"],
        "default",
        {"containers/c0": f"{HUB}/library/nginx:1.25"},
        (HARBOR_SECRET,),
        id="familiar",
    ),
    pytest.param(
        ["quay.io/prometheus/node-exporter:v1.8"],
        "default",
        {"containers/c0": "mirror.corp.example/prometheus/node-exporter:v1.8"},
        (),
        id="path-prefix-no-credential",
    ),
    pytest.param(
        ["eu.gcr.io/p/app"],
        "default",
        {"containers/c0": "mirror.corp.example/gcr/eu.gcr.io/p/app"},
        (),
        id="wildcard",
    ),
    pytest.param(
        [f"nginx:1.25@{SHA256}"],
        "default",
        {"containers/c0": f"{HUB}/library/nginx:1.25@{SHA256}"},
        (HARBOR_SECRET,),
        id="tag-and-digest",
    ),
    pytest.param(
        [f"redis@{SHA256}"],
        "default",
        {"containers/c0": f"{HUB}/library/redis@{SHA256}"},
        (HARBOR_SECRET,),
        id="digest-only",
    ),
    pytest.param(
        ["nginx", "redis:7", "bitnami/kafka"],
        "default",
        {
            "containers/c0": f"{HUB}/library/nginx",
            "containers/c1": f"{HUB}/library/redis:7",
            "containers/c2": f"{HUB}/bitnami/kafka",
        },
        (HARBOR_SECRET,),
        id="one-secret-for-many-images",
    ),
    pytest.param(
        ["ghcr.io/org/app:1", "nginx"],
        "team-a",
        {
            "containers/c0": "mirror.corp.example/ghcr/org/app:1",
            "containers/c1": f"{HUB}/library/nginx",
        },
        (HARBOR_SECRET, TEAM_SECRET),
        id="two-credentials-sorted",
    ),
    pytest.param(
        ["registry.k8s.io/pause:3.9", "busybox:1", "gcr.io/p/a", "quay.io/x/y"],
        "default",
        {},
        (),
        id="excluded-and-unmatched",
    ),
    pytest.param(
        [f"{HUB}/library/nginx:1"], "default", {}, (HARBOR_SECRET,), id="on-mirror-gets-credential"
    ),
    pytest.param(
        ["mirror.corp.example/gcr/eu.gcr.io/p/app"],
        "default",
        {},
        (),
        id="on-mirror-without-credential",
    ),
    pytest.param(
        ["nginx"],
        "kube-public",
        {"containers/c0": f"{HUB}/library/nginx"},
        (HARBOR_SECRET,),
        id="kube-public-not-excluded",
    ),
]


@pytest.mark.parametrize(("images", "namespace", "rewrites", "secrets"), REWRITES)
def test_plan(
    images: list[str], namespace: str, rewrites: dict[str, str], secrets: tuple[str, ...]
) -> None:
    """Images under a rule are rewritten and their granted credentials attached."""
    result = policy.plan(_pod(*images), namespace=namespace, mirror_policy=POLICY)
    assert _rewrites(result) == rewrites
    assert result.pull_secrets == secrets
    assert result.credentials == tuple(s.removeprefix("mirrorgate-") for s in secrets)
    assert result.warnings == ()
    assert result.skipped is None
    originals = {k: images[int(k[-1])] for k in rewrites}
    assert result.original_images == (originals or None)


@pytest.mark.parametrize("field", policy.CONTAINER_FIELDS)
def test_every_container_kind(field: str) -> None:
    """containers, initContainers and ephemeralContainers are all rewritten."""
    result = policy.plan(_pod("nginx", field=field), namespace="default", mirror_policy=POLICY)
    assert _rewrites(result) == {f"{field}/c0": f"{HUB}/library/nginx"}
    assert [r.site.pointer for r in result.rewrites] == [f"/spec/{field}/0/image"]


def test_issue_pod_end_to_end() -> None:
    """A mixed Pod gets its images, annotation and pull secret, leaving the rest alone."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-",
            "labels": {"app": "web"},
            "annotations": {"team": "a"},
        },
        "spec": {
            "initContainers": [{"name": "init", "image": "busybox:1.36"}],
            "containers": [
                {"name": "web", "image": "nginx:1.25", "ports": [{"containerPort": 80}]},
                {"name": "exporter", "image": "quay.io/prometheus/node-exporter:v1.8"},
                {"name": "pause", "image": "registry.k8s.io/pause:3.9"},
            ],
            "ephemeralContainers": [{"name": "debug", "image": "eu.gcr.io/p/app"}],
            "imagePullSecrets": [{"name": "regcred"}],
            "nodeSelector": {"disk": "ssd"},
        },
    }
    original = copy.deepcopy(pod)
    result = policy.plan(pod, namespace="team-b", mirror_policy=POLICY)
    assert pod == original  # planning touches nothing
    after = _apply(pod, result)
    assert [c["image"] for c in after["spec"]["containers"]] == [
        f"{HUB}/library/nginx:1.25",
        "mirror.corp.example/prometheus/node-exporter:v1.8",
        "registry.k8s.io/pause:3.9",
    ]
    assert after["spec"]["initContainers"] == original["spec"]["initContainers"]
    assert after["spec"]["ephemeralContainers"][0]["image"] == (
        "mirror.corp.example/gcr/eu.gcr.io/p/app"
    )
    assert after["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": HARBOR_SECRET}]
    assert after["metadata"]["annotations"]["team"] == "a"
    assert json.loads(after["metadata"]["annotations"][ANNOTATION]) == {
        "containers/web": "nginx:1.25",
        "containers/exporter": "quay.io/prometheus/node-exporter:v1.8",
        "ephemeralContainers/debug": "eu.gcr.io/p/app",
    }
    assert after["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert after["spec"]["containers"][0]["ports"] == [{"containerPort": 80}]
    assert "name" not in after["metadata"]


# pod, namespace, skipped reason
SKIPPED = [
    pytest.param(
        _pod("nginx"),
        "kube-system",
        "namespace 'kube-system' is excluded by the policy",
        id="kube-system-always",
    ),
    pytest.param(
        _pod("nginx", labels={"mirrorgate.io/skip": "false"}),
        "kube-system",
        "namespace 'kube-system' is excluded by the policy",
        id="kube-system-even-when-labelled",
    ),
    pytest.param(
        _pod("nginx"),
        "team-excluded",
        "namespace 'team-excluded' is excluded by the policy",
        id="excluded-namespace",
    ),
    pytest.param(
        _pod("nginx"),
        "batch-nightly",
        "namespace 'batch-nightly' is excluded by the policy",
        id="namespace-glob",
    ),
    pytest.param(
        _pod("nginx", labels={"mirrorgate.io/skip": "true"}),
        "default",
        "the Pod is labelled mirrorgate.io/skip=true",
        id="skip-label",
    ),
    pytest.param(
        _pod("nginx", annotations={"kubernetes.io/config.mirror": "abc"}),
        "default",
        "static-pod mirror, owned by the kubelet",
        id="static-pod-mirror",
    ),
    pytest.param(
        _pod("nginx", annotations={"kubernetes.io/config.mirror": ""}),
        "default",
        "static-pod mirror, owned by the kubelet",
        id="static-pod-mirror-empty-value",
    ),
]


@pytest.mark.parametrize(("pod", "namespace", "reason"), SKIPPED)
def test_skipped(pod: dict[str, Any], namespace: str, reason: str) -> None:
    """Excluded namespaces, the skip label and static-pod mirrors are never mutated."""
    result = policy.plan(pod, namespace=namespace, mirror_policy=POLICY)
    assert dataclasses.replace(result, outcomes={}) == policy.RewritePlan(skipped=reason)
    outcome = "excluded" if reason.startswith("namespace") else "skipped"
    assert list(result.outcomes.values()) == [outcome]
    assert patch.build_patch(pod, result) == []


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("false", id="false"),
        pytest.param("True", id="capitalised"),
        pytest.param(True, id="boolean"),
    ],
)
def test_skip_label_needs_the_string_true(value: object) -> None:
    """Only the label value "true" skips a Pod."""
    result = policy.plan(
        _pod("nginx", labels={"mirrorgate.io/skip": value}),
        namespace="default",
        mirror_policy=POLICY,
    )
    assert result.skipped is None
    assert len(result.rewrites) == 1


# images, namespace, keyword arguments, rewrites, pull secrets, warnings
CREDENTIALS = [
    pytest.param(
        ["ghcr.io/org/app:1"],
        "team-b",
        {},
        {},
        (),
        [
            "containers/c0: image 'ghcr.io/org/app:1' left as written: credential "
            "'team-only' of mirrors[3] is not granted to namespace 'team-b'"
        ],
        id="not-granted",
    ),
    pytest.param(
        ["mirror.corp.example/ghcr/org/app:1"],
        "team-b",
        {},
        {},
        (),
        [
            "containers/c0: image 'mirror.corp.example/ghcr/org/app:1' is on a mirror "
            "but credential 'team-only' of mirrors[3] is not granted to namespace 'team-b'"
        ],
        id="on-mirror-not-granted",
    ),
    pytest.param(
        ["nginx", "quay.io/prometheus/x"],
        "default",
        {"unavailable": {"harbor-pull": "forbidden"}},
        {"containers/c1": "mirror.corp.example/prometheus/x"},
        (),
        [
            "containers/c0: image 'nginx' left as written: pull secret "
            "'mirrorgate-harbor-pull' is unavailable: forbidden"
        ],
        id="unavailable",
    ),
    pytest.param(
        [f"{HUB}/library/nginx"],
        "default",
        {"unavailable": {"harbor-pull": "store down"}},
        {},
        (),
        [
            f"containers/c0: image '{HUB}/library/nginx' is on a mirror but pull secret "
            "'mirrorgate-harbor-pull' is unavailable: store down"
        ],
        id="on-mirror-unavailable",
    ),
    pytest.param(
        ["nginx"],
        "default",
        {"unavailable": {"team-only": "x"}},
        {"containers/c0": f"{HUB}/library/nginx"},
        (HARBOR_SECRET,),
        [],
        id="other-credential-unavailable",
    ),
    pytest.param(
        ["nginx", "eu.gcr.io/p/a"],
        "default",
        {"can_add_pull_secrets": False},
        {"containers/c1": "mirror.corp.example/gcr/eu.gcr.io/p/a"},
        (),
        [
            "containers/c0: image 'nginx' left as written: the Pod's imagePullSecrets "
            "cannot gain 'mirrorgate-harbor-pull' in this operation"
        ],
        id="cannot-add-pull-secrets",
    ),
    pytest.param(
        ["nginx"], "default", {"previous": {"containers/c0": "nginx"}}, {}, (), [], id="unchanged"
    ),
    pytest.param(
        ["nginx"],
        "default",
        {"previous": {"containers/c0": "nginx:1.25"}},
        {"containers/c0": f"{HUB}/library/nginx"},
        (HARBOR_SECRET,),
        [],
        id="changed",
    ),
    pytest.param(
        ["nginx", "redis"],
        "default",
        {"previous": {"containers/c0": "nginx"}},
        {"containers/c1": f"{HUB}/library/redis"},
        (HARBOR_SECRET,),
        [],
        id="unchanged-one",
    ),
    pytest.param(
        ["nginx"],
        "default",
        {"previous": {"initContainers/c0": "nginx"}},
        {"containers/c0": f"{HUB}/library/nginx"},
        (HARBOR_SECRET,),
        [],
        id="unchanged-key-includes-field",
    ),
    pytest.param(
        ["nginx"],
        "default",
        {"fields": ("ephemeralContainers",)},
        {},
        (),
        [],
        id="fields-excludes-containers",
    ),
    pytest.param(
        ["Nginx", "nginx:", "ubuntu\n"],
        "default",
        {},
        {},
        (),
        [
            "containers/c0: image 'Nginx' left as written: repository name must be lowercase",
            "containers/c1: image 'nginx:' left as written: invalid reference format",
            "containers/c2: image 'ubuntu\\n' left as written: invalid reference format",
        ],
        id="invalid-images",
    ),
]


@pytest.mark.parametrize(
    ("images", "namespace", "kwargs", "rewrites", "secrets", "warnings"), CREDENTIALS
)
def test_credentials_and_parameters(
    images: list[str],
    namespace: str,
    kwargs: dict[str, Any],
    rewrites: dict[str, str],
    secrets: tuple[str, ...],
    warnings: list[str],
) -> None:
    """A credential that cannot be attached leaves its image as written, with a warning.

    ``unavailable``: pull secrets the cluster could not make, applied to the plan
    afterwards as admission does (:meth:`RewritePlan.without`).
    """
    kwargs = dict(kwargs)
    unavailable = kwargs.pop("unavailable", {})
    result = policy.plan(_pod(*images), namespace=namespace, mirror_policy=POLICY, **kwargs)
    result = result.without(unavailable)
    assert _rewrites(result) == rewrites
    assert result.pull_secrets == secrets
    assert list(result.warnings) == warnings


def test_can_add_pull_secrets_false_with_secret_present() -> None:
    """When the pull secret is already on the Pod, no new secret is needed to rewrite."""
    pod = _pod("nginx", imagePullSecrets=[{"name": HARBOR_SECRET}])
    result = policy.plan(pod, namespace="default", mirror_policy=POLICY, can_add_pull_secrets=False)
    assert _rewrites(result) == {"containers/c0": f"{HUB}/library/nginx"}
    assert (result.pull_secrets, result.credentials, result.warnings) == ((), ("harbor-pull",), ())


KUBELET_POLICY = policy.load(
    {
        "mirrors": [
            {"source": "docker.io", "mirror": HUB, "credential": "harbor-pull"},
            {"source": "ghcr.io", "mirror": "mirror.corp.example/ghcr", "credential": "team-only"},
        ],
        "credentials": {
            "harbor-pull": {"namespaces": ["*"], "delivery": "kubelet"},
            "team-only": {"namespaces": ["*"]},
        },
    }
)


def test_kubelet_delivery_rewrites_and_records_but_attaches_nothing() -> None:
    """``delivery: kubelet``: rewritten and recorded, no pull secret asked for or attached;
    a ``pullSecret`` credential in the same Pod still gets its own."""
    pod = _pod("nginx", "ghcr.io/team/app:1")
    result = policy.plan(pod, namespace="shop", mirror_policy=KUBELET_POLICY)
    assert _rewrites(result) == {
        "containers/c0": f"{HUB}/library/nginx",
        "containers/c1": "mirror.corp.example/ghcr/team/app:1",
    }
    assert (result.pull_secrets, result.credentials) == ((TEAM_SECRET,), ("team-only",))
    assert result.original_images == {
        "containers/c0": "nginx",
        "containers/c1": "ghcr.io/team/app:1",
    }
    assert [c for _, c in result.credential_sites] == ["team-only"]
    applied = _apply(pod, result)
    assert applied["spec"]["imagePullSecrets"] == [{"name": TEAM_SECRET}]


def test_kubelet_delivery_rewrites_where_no_pull_secret_can_be_added() -> None:
    """An update (or ephemeral container) cannot add imagePullSecrets; a kubelet-delivered
    credential needs none, so its image is rewritten there, not left unattachable."""
    pod = _pod("nginx")
    result = policy.plan(
        pod, namespace="shop", mirror_policy=KUBELET_POLICY, can_add_pull_secrets=False
    )
    assert _rewrites(result) == {"containers/c0": f"{HUB}/library/nginx"}
    assert (result.unattachable, result.pull_secrets, result.warnings) == ((), (), ())
    assert policy.plan(
        pod, namespace="shop", mirror_policy=POLICY, can_add_pull_secrets=False
    ).unattachable, "the pullSecret delivery of the same image must still need its Secret"


def test_kubelet_delivery_keeps_the_grant() -> None:
    """No copy does not mean every namespace: an ungranted one is still left as written."""
    result = policy.plan(
        _pod("nginx"),
        namespace="shop",
        mirror_policy=policy.load(
            {
                "mirrors": [{"source": "docker.io", "mirror": HUB, "credential": "harbor-pull"}],
                "credentials": {"harbor-pull": {"namespaces": ["team-a"], "delivery": "kubelet"}},
            }
        ),
    )
    assert (_rewrites(result), result.outcomes) == ({}, {"containers/c0": "not-granted"})


def test_can_annotate_false_rewrites_without_recording() -> None:
    """Where metadata cannot change, images are still rewritten but no annotation is planned."""
    pod = _pod("nginx", "quay.io/x/y", imagePullSecrets=[{"name": HARBOR_SECRET}])
    result = policy.plan(pod, namespace="default", mirror_policy=POLICY, can_annotate=False)
    assert _rewrites(result) == {"containers/c0": f"{HUB}/library/nginx"}
    assert result.original_images is None
    assert patch.build_patch(pod, result) == [
        {"op": "replace", "path": "/spec/containers/0/image", "value": f"{HUB}/library/nginx"}
    ]


@pytest.mark.parametrize(
    ("existing", "secrets"),
    [
        pytest.param(None, (HARBOR_SECRET,), id="absent"),
        pytest.param([], (HARBOR_SECRET,), id="empty"),
        pytest.param([{"name": "regcred"}], (HARBOR_SECRET,), id="other-kept"),
        pytest.param([{"name": HARBOR_SECRET}], (), id="already-attached"),
        pytest.param([{"name": "regcred"}, {"name": HARBOR_SECRET}], (), id="already-among-others"),
        pytest.param(["regcred", {"name": HARBOR_SECRET}], (), id="malformed-entry-ignored"),
    ],
)
def test_pull_secrets_deduplicated(existing: list[Any] | None, secrets: tuple[str, ...]) -> None:
    """Existing imagePullSecrets are kept, and a secret already there is not added again."""
    pod = _pod("nginx") if existing is None else _pod("nginx", imagePullSecrets=existing)
    result = policy.plan(pod, namespace="default", mirror_policy=POLICY)
    assert result.pull_secrets == secrets
    after = _apply(pod, result)
    names = [s.get("name") for s in after["spec"]["imagePullSecrets"] if isinstance(s, dict)]
    assert names.count(HARBOR_SECRET) == 1
    assert after["spec"]["imagePullSecrets"][: len(existing or [])] == (existing or [])


# existing annotation value (None: absent), images, expected annotation (None: unchanged)
# Behaviour change (issue 28): an entry is kept only where the container's image is
# the mirror of that original; a fake or stray entry is dropped and the record rebuilt.
ANNOTATIONS = [
    pytest.param(None, ["nginx"], {"containers/c0": "nginx"}, id="created"),
    pytest.param("{}", ["nginx"], {"containers/c0": "nginx"}, id="empty-object"),
    pytest.param(
        '{"containers/c0":"nginx:0.9"}',
        ["nginx:1"],
        {"containers/c0": "nginx:1"},
        id="fake-original-replaced",
    ),
    pytest.param(
        '{"containers/c0":"nginx:1"}', [f"{HUB}/library/nginx:1"], None, id="reinvocation-kept"
    ),
    pytest.param(
        '{"initContainers/i":"alpine"}',
        ["nginx"],
        {"containers/c0": "nginx"},
        id="stray-entry-dropped",
    ),
    pytest.param(
        '{"containers/c0":"nginx:1"}',
        [f"{HUB}/library/nginx:1", "redis"],
        {"containers/c0": "nginx:1", "containers/c1": "redis"},
        id="merged-with-own-record",
    ),
    pytest.param(
        '{"containers/c0":"nginx:0.9"}',
        ["nginx:1", "redis"],
        {"containers/c0": "nginx:1", "containers/c1": "redis"},
        id="fake-dropped-beside-new",
    ),
    pytest.param(
        '{"containers/c0":"busybox"}',
        [f"{HUB}/library/nginx:1"],
        {},
        id="fake-on-mirrored-image-removed",
    ),
    pytest.param(None, ["quay.io/x/y"], None, id="no-rewrite-no-annotation"),
    pytest.param(None, [f"{HUB}/library/nginx"], None, id="on-mirror-no-annotation"),
]


@pytest.mark.parametrize(("existing", "images", "expected"), ANNOTATIONS)
def test_original_images_annotation(
    existing: str | None, images: list[str], expected: dict[str, str] | None
) -> None:
    """The annotation records originals of rewritten containers, and keeps of what was
    there only mirrorgate's own record of the images it rewrote; empty, it is removed."""
    annotations = {"other": "kept"}
    if existing is not None:
        annotations[ANNOTATION] = existing
    pod = _pod(*images, annotations=annotations)
    result = policy.plan(pod, namespace="default", mirror_policy=POLICY)
    if expected is None:
        assert result.original_images is None
    else:
        assert result.original_images is not None
        assert result.original_images == expected
    after = _apply(pod, result)
    assert after["metadata"]["annotations"]["other"] == "kept"
    if expected == {}:
        assert ANNOTATION not in after["metadata"]["annotations"]
    elif expected is not None:
        assert json.loads(after["metadata"]["annotations"][ANNOTATION]) == expected


# pod, warnings
MALFORMED = [
    pytest.param({}, [], id="empty-pod"),
    pytest.param({"spec": None, "metadata": None}, [], id="null-spec-and-metadata"),
    pytest.param({"spec": ["x"], "metadata": "x"}, [], id="spec-and-metadata-not-mappings"),
    pytest.param(
        {"spec": {"containers": {"name": "a", "image": "nginx"}}},
        ["spec.containers is not a list; left as written"],
        id="containers-not-list",
    ),
    pytest.param(
        {"spec": {"containers": "nginx"}},
        ["spec.containers is not a list; left as written"],
        id="containers-string",
    ),
    pytest.param(
        {"spec": {"initContainers": ["nginx", None]}},
        [
            "spec.initContainers[0] is not a mapping; left as written",
            "spec.initContainers[1] is not a mapping; left as written",
        ],
        id="container-not-dict",
    ),
    pytest.param(
        {"spec": {"containers": [{"name": "a", "image": 5}]}},
        ["containers/a: image is not a string; left as written"],
        id="image-not-string",
    ),
    pytest.param(
        {
            "spec": {
                "containers": [
                    {"image": "nginx"},
                    {"name": "", "image": "nginx"},
                    {"name": 3, "image": "nginx"},
                ]
            }
        },
        [
            "spec.containers[0] has no name; left as written",
            "spec.containers[1] has no name; left as written",
            "spec.containers[2] has no name; left as written",
        ],
        id="missing-name",
    ),
    pytest.param({"spec": {"containers": [{"name": "a"}]}}, [], id="missing-image"),
    pytest.param(
        {
            "spec": {
                "containers": [{"name": "a", "image": "nginx"}],
                "imagePullSecrets": {"name": "x"},
            }
        },
        [
            "spec.imagePullSecrets is not a list; pull secrets cannot be attached",
            "containers/a: image 'nginx' left as written: the Pod's imagePullSecrets "
            "cannot gain 'mirrorgate-harbor-pull' in this operation",
        ],
        id="pull-secrets-not-list",
    ),
]


@pytest.mark.parametrize(("pod", "warnings"), MALFORMED)
def test_malformed_pods_warn(pod: dict[str, Any], warnings: list[str]) -> None:
    """A malformed Pod never raises: broken parts are left as written, with warnings."""
    result = policy.plan(pod, namespace="default", mirror_policy=POLICY)
    assert list(result.warnings) == warnings
    assert result.rewrites == ()
    assert patch.build_patch(pod, result) == []


DEEP = 2000


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("not json", id="not-json"),
        pytest.param('["containers/a"]', id="json-list"),
        pytest.param('{"containers/a": 1}', id="non-string-values"),
        pytest.param("", id="empty-string"),
        pytest.param(7, id="not-a-string"),
        pytest.param("[" * DEEP + "]" * DEEP, id="lists-2000-deep"),
        pytest.param('{"a":' * DEEP + '"x"' + "}" * DEEP, id="objects-2000-deep"),
        pytest.param('{"containers/c0": "[{"}' + "[" * DEEP, id="deep-after-a-string"),
        pytest.param(
            json.dumps({"containers/c0": "nginx", "x": "y" * 262_144}), id="longer-than-any-pod"
        ),
        pytest.param('{"containers/c0": "\\ud800"}', id="lone-surrogate-value"),
        pytest.param('{"\\udfff": "nginx"}', id="lone-surrogate-key"),
    ],
)
def test_unreadable_annotation_is_treated_as_absent(value: object) -> None:
    """An original-images annotation that is not a JSON object of strings (however deep) is
    treated as absent, with a warning: the record is rebuilt from the images rewritten now."""
    pod = _pod("nginx", "Nginx", annotations={ANNOTATION: value})
    result = policy.plan(pod, namespace="default", mirror_policy=POLICY)
    assert _rewrites(result) == {"containers/c0": f"{HUB}/library/nginx"}
    assert result.skipped is None
    assert result.original_images == {"containers/c0": "nginx"}
    assert (
        f"annotation {ANNOTATION} is not a JSON object of strings; "
        "treated as absent and rebuilt from the images rewritten now"
    ) in result.warnings or (
        f"annotation {ANNOTATION} is {len(str(value)):,} characters, longer than the API server "
        "allows all of a Pod's annotations (262,144); treated as absent and rebuilt from "
        "the images rewritten now"
    ) in result.warnings
    patched = jsonpatch.apply_patch(pod, patch.build_patch(pod, result))
    assert json.loads(patched["metadata"]["annotations"][ANNOTATION]) == {"containers/c0": "nginx"}


def test_valid_containers_rewritten_beside_malformed_ones() -> None:
    """A malformed container does not stop the valid ones beside it."""
    pod = {
        "spec": {
            "containers": [{"name": "a", "image": None}, "junk", {"name": "b", "image": "nginx"}]
        }
    }
    result = policy.plan(pod, namespace="default", mirror_policy=POLICY)
    assert _rewrites(result) == {"containers/b": f"{HUB}/library/nginx"}
    assert result.warnings == ("spec.containers[1] is not a mapping; left as written",)
    after = _apply(pod, result)
    assert after["spec"]["containers"][2]["image"] == f"{HUB}/library/nginx"
    assert after["metadata"]["annotations"][ANNOTATION] == '{"containers/b":"nginx"}'


def test_plan_is_idempotent_on_issue_example() -> None:
    """Planning the admitted Pod again gives nothing to change and an empty patch."""
    pod = _pod(
        "nginx:1.25",
        "quay.io/prometheus/node-exporter:v1.8",
        "eu.gcr.io/p/app",
        f"ghcr.io/o/a@{SHA256}",
    )
    first = policy.plan(pod, namespace="team-a", mirror_policy=POLICY)
    after = _apply(pod, first)
    second = policy.plan(after, namespace="team-a", mirror_policy=POLICY)
    assert (second.rewrites, second.pull_secrets, second.original_images) == ((), (), None)
    assert second.credentials == first.credentials
    assert patch.build_patch(after, second) == []


def test_pathless_mirror_rewrite_converges() -> None:
    """A source-prefix image with a path-less mirror is not rewritten twice."""
    mirror_policy = policy.load(
        {
            "mirrors": [
                {"source": "quay.io/prometheus", "mirror": "mirror.corp.example"},
                {"source": "docker.io", "mirror": HUB},
            ]
        }
    )
    pod = _pod("quay.io/prometheus:v1")
    after = _apply(pod, policy.plan(pod, namespace="default", mirror_policy=mirror_policy))
    second = policy.plan(after, namespace="default", mirror_policy=mirror_policy)
    assert second.rewrites == ()


def test_audit_mode_line() -> None:
    """audit_mode_line reports the site, the new image and the original."""
    result = policy.plan(_pod("nginx"), namespace="default", mirror_policy=POLICY)
    assert policy.audit_mode_line(result.rewrites[0]) == (
        f"mirrorgate audit: containers/c0 would use {HUB}/library/nginx (was nginx)"
    )
    assert result.rewrites[0].rule_label == "mirrors[0]"


def test_find_image_sites() -> None:
    """find_image_sites lists every container image with its field, index and key."""
    pod = {
        "spec": {
            "containers": [{"name": "a", "image": "x"}],
            "ephemeralContainers": [{"name": "d", "image": "y"}],
            "initContainers": [{"name": "i", "image": "z"}],
            "volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "image": {"reference": "v"}}],
        }
    }
    sites, warnings = policy.find_image_sites(pod)
    assert [(s.key, s.pointer, s.image) for s in sites] == [
        ("containers/a", "/spec/containers/0/image", "x"),
        ("initContainers/i", "/spec/initContainers/0/image", "z"),
        ("ephemeralContainers/d", "/spec/ephemeralContainers/0/image", "y"),
        ("volumes/a", "/spec/volumes/1/image/reference", "v"),
    ]
    assert warnings == []


def test_the_shape_key_holds_each_image_volume_where_it_is() -> None:
    """An image volume's index is its patch's pointer: Pods that differ in it differ in shape."""
    image = {"name": "tools", "image": {"reference": "nginx"}}
    first = _pod("redis", volumes=[image])
    second = _pod("redis", volumes=[{"name": "scratch", "emptyDir": {}}, image])
    keys = [policy.shape_key(p, "default", policy.HEALTHY) for p in (first, second)]
    assert None not in keys
    assert keys[0] != keys[1]
    plans = [policy.plan(p, namespace="default", mirror_policy=POLICY) for p in (first, second)]
    assert [[r.site.pointer for r in p.rewrites if r.site.field == "volumes"] for p in plans] == [
        ["/spec/volumes/0/image/reference"],
        ["/spec/volumes/1/image/reference"],
    ]


def test_without_leaves_only_the_failed_credentials_images_as_written() -> None:
    """Planning is final: a pull secret that could not be made is applied to the plan."""
    pod = _pod("nginx", "ghcr.io/team/app:1", f"{HUB}/library/redis:7")
    planned = policy.plan(pod, namespace="team-a", mirror_policy=POLICY)
    assert planned.credentials == ("harbor-pull", "team-only")
    result = planned.without({"harbor-pull": "forbidden"})
    assert _rewrites(result) == {"containers/c1": "mirror.corp.example/ghcr/team/app:1"}
    assert (result.pull_secrets, result.credentials) == ((TEAM_SECRET,), ("team-only",))
    assert result.original_images == {"containers/c1": "ghcr.io/team/app:1"}
    assert result.recorded == {"containers/c1"}
    assert dict(result.outcomes) == {
        "containers/c0": "credential-unavailable",
        "containers/c1": "rewrite",
        "containers/c2": "credential-unavailable",
    }
    unavailable = "pull secret 'mirrorgate-harbor-pull' is unavailable: forbidden"
    assert result.warnings[-2:] == (
        f"containers/c0: image 'nginx' left as written: {unavailable}",
        f"containers/c2: image '{HUB}/library/redis:7' is on a mirror but {unavailable}",
    )
    # The plan is a value: the one that callers share is unchanged.
    assert planned == policy.plan(pod, namespace="team-a", mirror_policy=POLICY)
    assert planned.without({}) is planned
    assert planned.without({"other": "x"}) is planned


def test_without_keeps_the_originals_already_recorded() -> None:
    """Dropping every new record leaves the annotation as it is (None), not emptied."""
    recorded = json.dumps({"containers/c1": "nginx:1"})
    pod = _pod("nginx", f"{HUB}/library/nginx:1", annotations={ANNOTATION: recorded})
    planned = policy.plan(pod, namespace="default", mirror_policy=POLICY)
    assert planned.original_images == {"containers/c1": "nginx:1", "containers/c0": "nginx"}
    result = planned.without({"harbor-pull": "down"})
    assert (result.rewrites, result.original_images, result.recorded) == ((), None, frozenset())
    assert patch.build_patch(pod, result) == []


def test_the_record_is_the_whole_pods() -> None:
    """Planning some container lists judges the record against all of them; where the
    metadata cannot change, the record is not judged (and nothing is said of it)."""
    record = json.dumps({"containers/c0": "nginx:1"})
    pod = _pod(f"{HUB}/library/nginx:1", annotations={ANNOTATION: record})
    pod["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "redis:7"}]
    ephemeral: tuple[policy.ContainerField, ...] = ("ephemeralContainers",)
    frozen = policy.plan(
        pod, namespace="default", mirror_policy=POLICY, fields=ephemeral, can_annotate=False
    )
    assert (frozen.original_images, frozen.warnings) == (None, ())
    assert [r.site.key for r in frozen.rewrites] == ["ephemeralContainers/debug"]
    annotated = policy.plan(pod, namespace="default", mirror_policy=POLICY, fields=ephemeral)
    assert annotated.original_images == {
        "containers/c0": "nginx:1",
        "ephemeralContainers/debug": "redis:7",
    }
    assert annotated.warnings == ()


def test_without_still_drops_a_fake_record() -> None:
    """A record that was not mirrorgate's stays dropped when the new entries go too."""
    pod = _pod("nginx", annotations={ANNOTATION: json.dumps({"containers/c9": "old:1"})})
    planned = policy.plan(pod, namespace="default", mirror_policy=POLICY)
    assert planned.original_images == {"containers/c0": "nginx"}
    result = planned.without({"harbor-pull": "down"})
    assert (result.rewrites, result.original_images, result.recorded) == ((), {}, frozenset())
    assert patch.build_patch(pod, result) == [
        {"op": "remove", "path": "/metadata/annotations/mirrorgate.io~1original-images"}
    ]


@given(
    record=st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=4),
    ascii_only=st.booleans(),
)
def test_a_flat_record_of_strings_is_always_read_back(
    record: dict[str, str], ascii_only: bool
) -> None:
    """The screen before decoding refuses nesting, never a record (brackets in its strings too).

    Read, its entries are judged: those of no container of the Pod are dropped, saying so.
    """
    record.pop("containers/c0", None)
    value = json.dumps(record, ensure_ascii=ascii_only)
    result = policy.plan(
        _pod("nginx", annotations={ANNOTATION: value}), namespace="default", mirror_policy=POLICY
    )
    assert result.original_images == {"containers/c0": "nginx"}
    assert not any("not a JSON object" in warning for warning in result.warnings)
    assert any("dropped" in warning for warning in result.warnings) == bool(record)


@given(st.text(alphabet='[]{}":,\\ ax1', max_size=60))
def test_any_annotation_text_is_planned_without_an_error(value: str) -> None:
    """Whatever the client wrote there, the Pod is planned: the record or a warning."""
    result = policy.plan(
        _pod("nginx", annotations={ANNOTATION: value}), namespace="default", mirror_policy=POLICY
    )
    assert result.original_images is not None
    assert result.original_images["containers/c0"] == "nginx"
