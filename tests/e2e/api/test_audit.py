"""`mirrorgate audit` against the real API server: report, JSON, exit codes, RBAC, scale.

The Pods are created in namespaces labelled `mirrorgate.io/mode=audit`, unlabelled,
or `enforce` with only images the session webhook (if another test installed it)
leaves alone, so the assertions hold whether or not that webhook is registered.
"""

from __future__ import annotations

import dataclasses
import io
import json
import secrets
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from mirrorgate.webhook import cli
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.fixtures_secrets import AUDIT_LABELS, ENFORCE_LABELS
from tests.e2e.harness.kube import apply, create_namespace, install_policy_crds

pytestmark = pytest.mark.e2e

HUB = "mirror.audit.example/hub"
NGINX, NGINX_MIRRORED = "nginx:1.27", f"{HUB}/library/nginx:1.27"
REDIS_ON_MIRROR = f"{HUB}/library/redis:7"
TOOL, TOOL_MIRRORED = "ghcr.io/org/tool:v1", "mirror.audit.example/ghcr/org/tool:v1"
EXPORTER = "quay.io/prometheus/node-exporter:v1.8.0"
EXPORTER_MIRRORED = "mirror.audit.example/prometheus/node-exporter:v1.8.0"
UNMATCHED = "registry.example.org/app:1"
TEAM_APP = "registry.gitlab.com/team/app:2"
TEAM_APP_MIRRORED = "mirror.audit.example/gitlab/team/app:2"
TEAM_LABEL = "audit.mirrorgate.example/team"
PAUSE = "registry.k8s.io/pause:3.9"
INVALID = "Example/App:1"  # stored by the API server; no runtime accepts it

POLICY = f"""\
mirrors:
  - source: docker.io
    mirror: {HUB}
  - source: ghcr.io
    mirror: mirror.audit.example/ghcr
    credential: ghcr-pull
  - source: quay.io/prometheus
    mirror: mirror.audit.example/prometheus
  - source: registry.gitlab.com
    mirror: mirror.audit.example/gitlab
    credential: team-pull
exclude:
  images: ["registry.k8s.io/pause:*"]
  namespaces: ["audit-*-d"]
credentials:
  ghcr-pull: {{namespaces: ["audit-*-a", "audit-*-c"]}}
  team-pull: {{namespaceSelector: {{matchLabels: {{{TEAM_LABEL}: blue}}}}}}
"""

SCALE_PODS = 2_000
SCALE_TARGET = 10_000


@dataclasses.dataclass
class Result:
    code: int | str | None
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.out)
        return value


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, to see the progress indicator."""

    def isatty(self) -> bool:
        return True


def mirrorgate(*argv: str | Path, err: io.StringIO | None = None) -> Result:
    out, err = io.StringIO(), err if err is not None else io.StringIO()
    if argv[:1] == ("audit",):
        # These policies name mirrors that do not exist, and tests reach nothing
        # beyond loopback: no health probes (tests/e2e/api/test_health.py has them).
        argv = (*argv, "--no-health")
    try:
        code: int | str | None = cli.main([str(a) for a in argv], out=out, err=err)
    except SystemExit as exit_:
        code = exit_.code
    return Result(code=code, out=out.getvalue(), err=err.getvalue())


def audit(
    scenario: Scenario, kubeconfig: str | Path, *argv: str, err: io.StringIO | None = None
) -> Result:
    """`mirrorgate audit` of the scenario's policy against the cluster of ``kubeconfig``."""
    return mirrorgate(
        "audit", "--policy", scenario.policy, "--kubeconfig", kubeconfig, *argv, err=err
    )


def pod_body(
    name: str,
    images: Sequence[str],
    *,
    init: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=dict(labels or {})),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(name=f"c{i}", image=image) for i, image in enumerate(images)
            ],
            init_containers=[
                k8s.V1Container(name=f"i{i}", image=image) for i, image in enumerate(init)
            ]
            or None,
        ),
    )


@dataclasses.dataclass
class Scenario:
    policy: Path
    a: str  # mode=audit: rewrites, on-mirror, excluded image, unmatched, invalid, skipped
    b: str  # unlabelled: not-granted and unmatched only (no rewrite)
    c: str  # mode=enforce: one rewrite by a path rule
    d: str  # excluded by the policy
    e: str  # on a mirror already, and a skipped Pod
    # Labelled for credentials.team-pull.namespaceSelector, and labelled otherwise
    # (not in `names`: the report of those five stays as it was).
    selected: str
    unselected: str

    @property
    def names(self) -> list[str]:
        return [self.a, self.b, self.c, self.d, self.e]


@pytest.fixture(scope="module")
def scenario(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    tag = secrets.token_hex(3)
    policy = tmp_path_factory.mktemp("audit") / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    made = Scenario(
        policy=policy,
        a=f"audit-{tag}-a",
        b=f"audit-{tag}-b",
        c=f"audit-{tag}-c",
        d=f"audit-{tag}-d",
        e=f"audit-{tag}-e",
        selected=f"audit-{tag}-blue",
        unselected=f"audit-{tag}-red",
    )
    pods = {
        made.a: [pod_body(f"web-{i}", [NGINX, REDIS_ON_MIRROR]) for i in range(3)]
        + [
            pod_body("tool", [TOOL], init=[PAUSE]),
            pod_body("other", [UNMATCHED]),
            pod_body("bad", [INVALID]),
            pod_body("opted-out", [NGINX], labels={"mirrorgate.io/skip": "true"}),
        ],
        made.b: [pod_body("tool", [TOOL, UNMATCHED])],
        made.c: [pod_body("exporter", [EXPORTER])],
        made.d: [pod_body("web", [NGINX])],
        made.e: [
            pod_body("cache", [REDIS_ON_MIRROR]),
            pod_body("opted-out", [UNMATCHED], labels={"mirrorgate.io/skip": "true"}),
        ],
        made.selected: [pod_body("team", [TEAM_APP])],
        made.unselected: [pod_body("team", [TEAM_APP])],
    }
    labels = {
        made.a: AUDIT_LABELS,
        made.c: ENFORCE_LABELS,
        made.d: AUDIT_LABELS,
        # No mode label: a session webhook, if registered, leaves their Pods alone.
        made.selected: {TEAM_LABEL: "blue"},
        made.unselected: {TEAM_LABEL: "red"},
    }
    with control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        for namespace, bodies in pods.items():
            create_namespace(api, namespace, labels.get(namespace))
            for body in bodies:
                core.create_namespaced_pod(namespace, body)
    return made


def by_name(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {ns["name"]: ns for ns in report["namespaces"]}


def image_rows(namespace: Mapping[str, Any]) -> list[tuple[str, str, int, int, str | None]]:
    return [
        (i["image"], i["outcome"], i["pods"], i["containers"], i["new_image"])
        for i in namespace["images"]
    ]


def no_outcomes(**counts: int) -> dict[str, int]:
    zero = dict.fromkeys(
        ("rewrite", "not-granted", "unmatched", "invalid", "on-mirror", "pull-never", "excluded"),
        0,
    )
    return {**zero, **{k.replace("_", "-"): v for k, v in counts.items()}}


# --- what the report says ----------------------------------------------------


def test_json_report_per_namespace(control_plane: ControlPlane, scenario: Scenario) -> None:
    result = audit(
        scenario,
        control_plane.kubeconfig,
        "-n",
        *scenario.names,
        "-o",
        "json",
    )
    assert result.code == 0, result.err
    assert result.err == ""
    report = result.json()
    assert report["version"] == 1
    assert report["scope"] == {"all_namespaces": False, "namespaces": sorted(scenario.names)}
    assert (report["fail_on"], report["failed"]) == (None, False)
    spaces = by_name(report)
    assert list(spaces) == sorted(scenario.names)

    a = spaces[scenario.a]
    assert (a["mode"], a["mode_label"], a["excluded"]) == ("audit", "audit", False)
    assert (a["pods"], a["skipped_pods"]) == (7, 1)
    assert image_rows(a) == [
        (NGINX, "rewrite", 3, 3, NGINX_MIRRORED),  # 3 Pods, one row
        (TOOL, "rewrite", 1, 1, TOOL_MIRRORED),  # granted here
        (UNMATCHED, "unmatched", 1, 1, None),
        (INVALID, "invalid", 1, 1, None),
        (REDIS_ON_MIRROR, "on-mirror", 3, 3, None),
        (PAUSE, "excluded", 1, 1, None),
    ]
    tool = a["images"][1]
    assert (tool["rule"], tool["credential"], tool["reason"]) == ("mirrors[1]", "ghcr-pull", None)
    assert a["images"][3]["reason"] == "repository name must be lowercase"
    assert a["containers"] == no_outcomes(
        rewrite=4, unmatched=1, invalid=1, on_mirror=3, excluded=1
    )

    b = spaces[scenario.b]
    assert (b["mode"], b["mode_label"]) == ("none", None)
    assert image_rows(b) == [
        (TOOL, "not-granted", 1, 1, None),
        (UNMATCHED, "unmatched", 1, 1, None),
    ]
    assert b["images"][0]["reason"] == (
        f"credential 'ghcr-pull' of mirrors[1] is not granted "
        f"to namespace {scenario.b!r}; left as written"
    )

    c = spaces[scenario.c]
    assert c["mode"] == "enforce"
    assert image_rows(c) == [(EXPORTER, "rewrite", 1, 1, EXPORTER_MIRRORED)]
    assert c["images"][0]["rule"] == "mirrors[2]"

    d = spaces[scenario.d]
    assert (d["excluded"], d["pods"], d["images"]) == (True, 1, [])

    e = spaces[scenario.e]
    assert (e["pods"], e["skipped_pods"]) == (2, 1)
    assert image_rows(e) == [(REDIS_ON_MIRROR, "on-mirror", 1, 1, None)]

    assert report["summary"] == {
        "namespaces": 5,
        "excluded_namespaces": 1,
        "pods": 12,
        "skipped_pods": 2,
        "unmirrored": 9,
        "containers": no_outcomes(
            rewrite=5, not_granted=1, unmatched=2, invalid=1, on_mirror=4, excluded=1
        ),
        "images": no_outcomes(
            rewrite=3, not_granted=1, unmatched=1, invalid=1, on_mirror=1, excluded=1
        ),
    }


def test_table_groups_images_and_fits_80_columns(
    control_plane: ControlPlane, scenario: Scenario
) -> None:
    result = audit(
        scenario,
        control_plane.kubeconfig,
        "-n",
        scenario.a,
        scenario.b,
        "-n",
        scenario.d,
    )
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == "mirrorgate audit: 3 namespaces, 9 pods"
    assert lines[1] == f"policy: {scenario.policy}"
    # The policy path is the user's; everything the report lays out fits 80 columns.
    assert all(len(line) <= 80 for line in lines[2:]), result.out
    text = result.out
    assert f"NAMESPACE {scenario.a}  mode: audit  pods: 7 (1 skipped)\n" in text
    detail = " " * 24  # under the IMAGE column
    assert f"        3  rewrite      {NGINX}\n{detail}→ {NGINX_MIRRORED}\n" in text
    assert (
        f"        1  invalid      {INVALID}\n{detail}(repository name must be lowercase)\n" in text
    )
    assert f"        3  on-mirror    {REDIS_ON_MIRROR}\n" in text
    assert f"        1  excluded     {PAUSE}\n" in text
    assert text.count(f"  {NGINX}\n") == 1  # one row for the image of three Pods
    assert f"NAMESPACE {scenario.d}  mode: audit  pods: 1  excluded by the policy\n" in text
    # A long reason wraps under the IMAGE column.
    row = text.index(f"        1  not-granted  {TOOL}\n")
    reason = text[row:].splitlines()[1:3]
    assert all(line.startswith(detail) for line in reason), reason
    reason = text[row:].splitlines()[1:4]
    assert " ".join(line.strip() for line in reason if line.startswith(detail)) == (
        f"(credential 'ghcr-pull' of mirrors[1] is not granted to namespace {scenario.b!r}; "
        "left as written)"
    )
    assert "  rewrite                      4         2\n" in text
    assert "  skipped pods: 1   excluded namespaces: 1 (1 pod)\n" in text
    assert "  unmirrored: 8 containers" in text


def test_all_namespaces_reports_the_same_and_excludes_kube_system(
    control_plane: ControlPlane, scenario: Scenario
) -> None:
    named = audit(
        scenario,
        control_plane.kubeconfig,
        "-n",
        *scenario.names,
        "-o",
        "json",
    )
    every = audit(
        scenario,
        control_plane.kubeconfig,
        "-A",
        "-o",
        "json",
    )
    assert every.code == 0, every.err
    report = every.json()
    assert report["scope"] == {"all_namespaces": True, "namespaces": []}
    spaces = by_name(report)
    for name, namespace in by_name(named.json()).items():
        assert spaces[name] == namespace
    if "kube-system" in spaces:  # only when another test made a Pod there
        assert spaces["kube-system"]["excluded"] is True
    # -A shows only namespaces that have Pods.
    assert all(ns["pods"] > 0 for ns in report["namespaces"])


@pytest.mark.parametrize("scope", [pytest.param("named", id="-n"), pytest.param("all", id="-A")])
def test_a_namespace_granted_by_its_labels_is_reported_granted(
    control_plane: ControlPlane, scenario: Scenario, scope: str
) -> None:
    """credentials.team-pull.namespaceSelector grants by the Namespace's labels, which audit
    reads from the API as the server's Namespace cache holds them."""
    argv = ("-n", scenario.selected, scenario.unselected) if scope == "named" else ("-A",)
    result = audit(scenario, control_plane.kubeconfig, *argv, "-o", "json")
    assert result.code == 0, result.err
    spaces = by_name(result.json())
    selected = spaces[scenario.selected]
    assert (selected["mode"], image_rows(selected)) == (
        "none",
        [(TEAM_APP, "rewrite", 1, 1, TEAM_APP_MIRRORED)],
    )
    assert selected["images"][0]["credential"] == "team-pull"
    unselected = spaces[scenario.unselected]
    assert image_rows(unselected) == [(TEAM_APP, "not-granted", 1, 1, None)]
    assert unselected["images"][0]["reason"] == (
        f"credential 'team-pull' of mirrors[3] is not granted "
        f"to namespace {scenario.unselected!r}; left as written"
    )


# --- exit codes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "fail_on", "code"),
    [
        pytest.param("b", "unmirrored", 1, id="not-granted-and-unmatched-are-unmirrored"),
        pytest.param("b", "rewrites", 0, id="no-rewrite-no-failure"),
        pytest.param("c", "rewrites", 1, id="a-rewrite-fails-rewrites"),
        pytest.param("c", "unmirrored", 1, id="a-rewrite-is-unmirrored"),
        pytest.param("e", "unmirrored", 0, id="on-mirror-and-skipped-pass"),
        pytest.param("d", "unmirrored", 0, id="excluded-namespace-passes"),
        pytest.param("b", None, 0, id="no-fail-on-always-0"),
    ],
)
def test_fail_on_exit_codes(
    control_plane: ControlPlane, scenario: Scenario, which: str, fail_on: str | None, code: int
) -> None:
    namespace = getattr(scenario, which)
    extra = ["--fail-on", fail_on] if fail_on else []
    table = audit(
        scenario,
        control_plane.kubeconfig,
        "-n",
        namespace,
        *extra,
    )
    assert table.code == code, table.out + table.err
    if fail_on:
        assert table.out.rstrip().endswith(f"--fail-on {fail_on}: {'FAILED' if code else 'passed'}")
    as_json = audit(
        scenario,
        control_plane.kubeconfig,
        "-n",
        namespace,
        *extra,
        "-o",
        "json",
    )
    assert as_json.code == code
    assert as_json.json()["failed"] is bool(code)


def test_usage_and_config_errors_exit_2(
    control_plane: ControlPlane,
    scenario: Scenario,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconfig = control_plane.kubeconfig
    missing = audit(
        scenario,
        kubeconfig,
        "-n",
        "no-such-namespace-x",
    )
    assert (missing.code, missing.err) == (
        2,
        "mirrorgate: error: namespace 'no-such-namespace-x' not found\n",
    )
    bad_policy = mirrorgate("audit", "--policy", tmp_path / "nope.yaml", "--kubeconfig", kubeconfig)
    assert bad_policy.code == 2
    assert bad_policy.err.startswith("mirrorgate: error: ")
    both = mirrorgate("audit", "--policy", scenario.policy, "-A", "-n", "x")
    assert both.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    unreachable = audit(
        scenario,
        control_plane.kubeconfig_for(
            "e2e-admin-elsewhere", ("system:masters",), url="https://127.0.0.1:1"
        ),
    )
    assert unreachable.code == 2
    assert unreachable.err.startswith("mirrorgate: error: cannot reach the API server: ")
    assert len(unreachable.err.splitlines()) == 1


# --- permissions -----------------------------------------------------------------


def test_no_permission_names_the_verb_and_resource(
    control_plane: ControlPlane, scenario: Scenario
) -> None:
    nobody = control_plane.kubeconfig_for("e2e-nobody")
    result = audit(scenario, nobody)
    assert result.code == 2
    assert result.out == ""
    # The Namespaces are read first (their labels judge the Pods), so theirs is the error.
    assert result.err.startswith(
        "mirrorgate: error: not allowed to list namespaces at the cluster scope: "
        'namespaces is forbidden: User "e2e-nobody" cannot list resource "namespaces"'
    ), result.err
    assert len(result.err.splitlines()) == 1

    named = audit(scenario, nobody, "-n", scenario.a)
    assert named.code == 2
    warning, error = named.err.splitlines()
    assert warning.startswith(
        f"warning: not allowed to get namespace {scenario.a!r}; its mode is reported as unknown: "
    )
    assert error.startswith(
        f"mirrorgate: error: not allowed to list pods in namespace {scenario.a!r}: "
    )


@pytest.fixture
def pod_reader(control_plane: ControlPlane, scenario: Scenario) -> Path:
    """A user who may list Pods in namespace `a` only: what a team's Role usually grants."""
    user = f"e2e-audit-reader-{secrets.token_hex(2)}"
    with control_plane.api_client() as api:
        rbac = k8s.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(
            scenario.a,
            k8s.V1Role(
                metadata=k8s.V1ObjectMeta(name=user),
                rules=[k8s.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            scenario.a,
            k8s.V1RoleBinding(
                metadata=k8s.V1ObjectMeta(name=user),
                role_ref=k8s.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name=user
                ),
                subjects=[
                    k8s.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="User", name=user)
                ],
            ),
        )
    return control_plane.kubeconfig_for(user)


def test_list_pods_alone_is_enough_for_one_namespace(scenario: Scenario, pod_reader: Path) -> None:
    result = audit(
        scenario,
        pod_reader,
        "-n",
        scenario.a,
        "-o",
        "json",
    )
    assert result.code == 0, result.err
    assert result.err.startswith(f"warning: not allowed to get namespace {scenario.a!r}")
    (namespace,) = result.json()["namespaces"]
    assert (namespace["mode"], namespace["mode_label"], namespace["pods"]) == ("unknown", None, 7)


# --- scale -------------------------------------------------------------------------


def create_pods(control_plane: ControlPlane, namespace: str, count: int) -> None:
    """`count` Pods in parallel; without a scheduler they stay Pending, which is all we need."""
    threads = 16
    with control_plane.api_client() as admin:
        configuration = admin.configuration
        configuration.connection_pool_maxsize = threads  # one connection per thread
        with k8s.ApiClient(configuration) as api:
            core = k8s.CoreV1Api(api)

            def create(i: int) -> None:
                image = NGINX if i % 10 else UNMATCHED  # two groups of very different size
                core.create_namespaced_pod(
                    namespace, pod_body(f"p-{i:05d}", [image]), _preload_content=False
                )

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(create, range(count)))


def test_audit_of_many_pods_takes_seconds(
    control_plane: ControlPlane, scenario: Scenario, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = f"audit-{secrets.token_hex(3)}-big"
    with control_plane.api_client() as api:
        create_namespace(api, namespace)
    started = time.perf_counter()
    create_pods(control_plane, namespace, SCALE_PODS)
    created = time.perf_counter() - started

    terminal = Terminal()
    started = time.perf_counter()
    result = audit(
        scenario,
        control_plane.kubeconfig,
        "-n",
        namespace,
        "-o",
        "json",
        err=terminal,
    )
    elapsed = time.perf_counter() - started
    assert result.code == 0, result.err
    (report,) = result.json()["namespaces"]
    assert report["pods"] == SCALE_PODS
    assert image_rows(report) == [
        (NGINX, "rewrite", 1800, 1800, NGINX_MIRRORED),
        (UNMATCHED, "unmatched", 200, 200, None),
    ]
    # One progress tick per page of 500, then the line is erased for the report.
    assert "\rmirrorgate audit: listed 500 pods…" in result.err
    assert f"\rmirrorgate audit: listed {SCALE_PODS:,} pods…\r\x1b[K" in result.err
    # Not a terminal: no progress at all (scripts get clean stderr).
    quiet = audit(
        scenario,
        control_plane.kubeconfig,
        "-n",
        namespace,
    )
    assert (quiet.code, quiet.err) == (0, "")

    scaled = elapsed * SCALE_TARGET / SCALE_PODS
    with capsys.disabled():
        print(
            f"\naudit of {SCALE_PODS:,} Pods: {elapsed:.2f} s (creating them took "
            f"{created:.1f} s); scaled to {SCALE_TARGET:,} Pods: {scaled:.1f} s"
        )
    assert scaled < 30, f"{SCALE_TARGET:,} Pods would take {scaled:.1f} s"


# --- the policy objects ------------------------------------------------------------


def test_without_a_policy_file_each_namespace_gets_its_composed_policy(
    own_control_plane: ControlPlane,
) -> None:
    """Without --policy, audit reads the ClusterMirrorPolicy and MirrorPolicy objects from
    the API and judges each namespace as the server composes it: a granted MirrorPolicy's
    rule applies in its namespace, one naming a credential not granted there applies
    nowhere, and the cluster's rule applies elsewhere. (Its own control plane: objects in
    the shared one would change what the session webhook serves.)"""
    cluster = {
        "apiVersion": "mirrorgate.io/v1alpha1",
        "kind": "ClusterMirrorPolicy",
        "metadata": {"name": "base"},
        "spec": {
            "credentials": {
                "shared": {"namespaces": ["team-a", "team-b", "other"]},
                "robot-a": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: "a"}}},
            },
            "mirrors": [{"source": "quay.io", "mirror": f"{HUB}/quay", "credential": "shared"}],
        },
    }

    def team(namespace: str) -> dict[str, Any]:
        mirror = {
            "source": "quay.io",
            "mirror": f"team.example/{namespace}",
            "credential": "robot-a",
        }
        return {
            "apiVersion": "mirrorgate.io/v1alpha1",
            "kind": "MirrorPolicy",
            "metadata": {"name": "quay", "namespace": namespace},
            "spec": {"mirrors": [mirror]},
        }

    with own_control_plane.api_client() as api:
        install_policy_crds(api)
        core = k8s.CoreV1Api(api)
        labels = {"team-a": {TEAM_LABEL: "a"}, "team-b": {TEAM_LABEL: "b"}, "other": {}}
        for namespace, found in labels.items():
            create_namespace(api, namespace, found)
            core.create_namespaced_pod(namespace, pod_body("app", [EXPORTER]))
        apply(api, [cluster, team("team-a"), team("team-b")])
    expected = {
        "team-a": "team.example/team-a/prometheus/node-exporter:v1.8.0",
        "team-b": f"{HUB}/quay/prometheus/node-exporter:v1.8.0",
        "other": f"{HUB}/quay/prometheus/node-exporter:v1.8.0",
    }
    for argv in (("-A",), ("-n", *labels)):
        result = mirrorgate(
            "audit", "--kubeconfig", own_control_plane.kubeconfig, *argv, "-o", "json"
        )
        assert result.code == 0, result.err
        report = result.json()
        assert report["policy"] == "cluster objects"
        spaces = by_name(report)
        got = {ns: [i["new_image"] for i in spaces[ns]["images"]] for ns in labels}
        assert got == {ns: [image] for ns, image in expected.items()}, argv
        assert spaces["team-a"]["images"][0]["rule"] == "MirrorPolicy team-a/quay spec.mirrors[0]"
        assert spaces["team-a"]["images"][0]["credential"] == "robot-a"
