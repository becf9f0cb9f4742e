"""manifests/overlays/monitoring: the alerts and the dashboard against a real /metrics scrape.

The real server (uvicorn, TLS, the production wiring) answers a few
admissions and is scraped, and so is a `mirrorgate serve` process with its
health probes on against a real loopback mirror (the health gauges exist only
once a probe has run); every series the alerts are fed is one those scrapes
really hold, with the target labels the ServiceMonitor's scrape adds
(``honorLabels: true``: mirrorgate's own ``endpoint`` label wins). promtool
is built from its Go module by tests/controlplane/build.sh.

``promtool check rules`` checks the PrometheusRule as written, annotation
templates included; ``promtool test rules`` checks when each alert fires and
with which labels, on a copy without annotations (their wording is not logic,
and promtool compares them verbatim).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from mirrorgate.certs import CertificateAuthority
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.health import LOGIN, PATIENCE, credential, health_policy
from tests.e2e.harness.procs import wait_until
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.standalone import start_standalone, write_store
from tests.webhook import policies
from tests.webhook.reviews import PROM_IMAGE, pod, review
from tests.webhook.serving import client_context, serve

pytestmark = pytest.mark.e2e

OVERLAY = REPO_ROOT / "manifests" / "overlays" / "monitoring"
# What a Prometheus Operator scrape of a mirrorgate Pod adds to every series.
TARGET = {
    "job": "mirrorgate",
    "namespace": "mirrorgate",
    "service": "mirrorgate",
    "endpoint": "metrics",
    "pod": "mirrorgate-6d9c7b5f4-x2x7q",
    "container": "mirrorgate",
    "instance": "10.244.1.7:9443",
}
METRIC_NAME = re.compile(r"\b(?:mirrorgate_[a-z_]+|up)\b")


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]


@pytest.fixture(scope="module")
def health_scrape(
    own_registry: RegistryStack, tmp_path_factory: pytest.TempPathFactory
) -> list[Sample]:
    """/metrics of `mirrorgate serve` once its probes found the mirror up and the login valid."""
    workdir = tmp_path_factory.mktemp("health-scrape")
    with start_standalone(
        workdir,
        policy=health_policy(own_registry),
        args=write_store(workdir, [credential(own_registry)]),
        env={"SSL_CERT_FILE": str(own_registry.ca_path)},
        redact=[own_registry.password],
    ) as running:
        wait_until(
            lambda: (
                None
                if running.gauge("mirrorgate_credential_valid", credential=LOGIN) == 1.0
                else "not yet"
            ),
            timeout=PATIENCE,
            what="the first probes",
            interval=0.1,
        )
        page = running.metrics()
    return [Sample(name, dict(labels)) for name, labels in page]


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory, health_scrape: list[Sample]) -> list[Sample]:
    """Every sample of the real server's /metrics after a few admissions, and the health ones."""
    ca = CertificateAuthority.generate()
    pair = ca.issue_serving(dns_names=["localhost"], ips=["127.0.0.1"])
    directory = tmp_path_factory.mktemp("scrape")
    with (
        serve(directory, pair=pair, policy=policies.POLICY) as running,
        httpx.Client(base_url=running.url, verify=client_context(ca.cert_pem)) as client,
    ):
        for path in ("/mutate", "/audit"):
            assert client.post(path, json=review(pod(PROM_IMAGE))).status_code == 200
        assert client.post("/mutate", content=b"{").status_code == 400
        page = client.get("/metrics")
    assert page.status_code == 200
    return [
        Sample(s.name, dict(s.labels))
        for family in text_string_to_metric_families(page.text)
        for s in family.samples
    ] + health_scrape


def exported(scrape: list[Sample], name: str, **labels: str) -> dict[str, str]:
    """The labels of the scraped sample ``name`` with ``labels``, as Prometheus stores them."""
    found = [s.labels for s in scrape if s.name == name and labels.items() <= s.labels.items()]
    assert found, f"/metrics exports no {name} with {labels}"
    return {**TARGET, **found[0]}


def series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


@pytest.fixture(scope="module")
def rule_groups() -> list[dict[str, Any]]:
    document = yaml.safe_load((OVERLAY / "prometheusrule.yaml").read_text())
    assert document["kind"] == "PrometheusRule"
    groups = document["spec"]["groups"]
    assert isinstance(groups, list)
    return groups


def alerts(groups: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for group in groups:
        yield from (rule for rule in group["rules"] if "alert" in rule)


def test_the_overlay_builds(kustomize: Path) -> None:
    """kustomize builds the overlay: a ServiceMonitor, a PrometheusRule, the dashboard."""
    built = subprocess.run(
        [kustomize, "build", OVERLAY], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    objects = {
        (o["kind"], o["metadata"]["name"], o["metadata"]["namespace"])
        for o in yaml.safe_load_all(built)
    }
    assert objects == {
        ("ServiceMonitor", "mirrorgate", "mirrorgate"),
        ("PrometheusRule", "mirrorgate", "mirrorgate"),
        ("ConfigMap", "mirrorgate-dashboard", "mirrorgate"),
    }


def test_promtool_checks_the_rules(
    promtool: Path, rule_groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The rules as written (expressions and annotation templates) pass `promtool check rules`."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups}))
    done = subprocess.run(
        [promtool, "check", "rules", rules], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for rule in alerts(rule_groups):
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_rules_name_only_exported_metrics(
    rule_groups: list[dict[str, Any]], scrape: list[Sample]
) -> None:
    """Every metric an alert reads is one /metrics exports (or Prometheus's own `up`)."""
    names = {s.name for s in scrape} | {"up"}
    for rule in alerts(rule_groups):
        used = set(METRIC_NAME.findall(rule["expr"]))
        assert used, f"{rule['alert']} reads no metric"
        assert used <= names, f"{rule['alert']} reads {used - names}, not exported"


class Case(NamedTuple):
    alert: str
    name: str
    labels: dict[str, str]
    """Labels picking the scraped series to feed."""
    by: tuple[str, ...]
    """The labels the alert keeps (besides alertname and severity)."""
    values: str = "0x10 1x40"
    """promtool's series: by default nothing for 10 minutes, then one event (0 to 1)."""


DOWN = "1x10 0x20 1x20"  # a gauge: 1, then 0 from minute 11 to 30, then 1 again
CASES = [
    Case(
        "MirrorgateWebhookErrors",
        "mirrorgate_errors_total",
        {"endpoint": "mutate", "reason": "internal"},
        ("namespace", "job", "endpoint", "reason"),
    ),
    Case(
        "MirrorgateDenials",
        "mirrorgate_admissions_total",
        {"endpoint": "mutate", "mode": "enforce", "outcome": "denied"},
        ("namespace", "job"),
    ),
    Case(
        "MirrorgateImagesLeftUnmirrored",
        "mirrorgate_images_left_unmirrored_total",
        {"reason": "credential-unavailable"},
        ("namespace", "job", "reason"),
    ),
    Case(
        "MirrorgateCredentialErrors",
        "mirrorgate_pull_secret_writes_total",
        {"action": "failed"},
        ("namespace", "job"),
    ),
    Case(
        "MirrorgatePolicyRejected",
        "mirrorgate_policy_reload_failures_total",
        {},
        ("namespace", "job"),
    ),
    Case(
        "MirrorgateImagesLeftForHealth",
        "mirrorgate_images_left_for_health_total",
        {},
        ("namespace", "job"),
    ),
    Case("MirrorgateMirrorDown", "mirrorgate_mirror_up", {}, ("namespace", "job", "mirror"), DOWN),
    Case(
        "MirrorgateCredentialInvalid",
        "mirrorgate_credential_valid",
        {"credential": LOGIN},
        ("namespace", "job", "credential"),
        DOWN,
    ),
]


def test_promtool_fires_each_alert_on_real_series(
    promtool: Path, rule_groups: list[dict[str, Any]], scrape: list[Sample], tmp_path: Path
) -> None:
    """Each alert is quiet before its event, fires after it (and its `for`), and clears."""
    severity = {rule["alert"]: rule["labels"]["severity"] for rule in alerts(rule_groups)}
    stripped = [
        {
            **group,
            "rules": [
                {k: v for k, v in rule.items() if k != "annotations"} for rule in group["rules"]
            ],
        }
        for group in rule_groups
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": stripped}))

    inputs: list[dict[str, str]] = []
    checks: list[dict[str, Any]] = []
    for case in CASES:
        labels = exported(scrape, case.name, **case.labels)
        inputs.append({"series": series(case.name, labels), "values": case.values})
        firing = {
            "alertname": case.alert,
            "severity": severity[case.alert],
            **{key: labels[key] for key in case.by},
        }
        checks += [
            {"eval_time": "5m", "alertname": case.alert, "exp_alerts": []},
            {"eval_time": "17m", "alertname": case.alert, "exp_alerts": [{"exp_labels": firing}]},
            {"eval_time": "45m", "alertname": case.alert, "exp_alerts": []},
        ]

    # Audit namespaces' covered images are counted as well, at the same time as the
    # case's event, and never alert: the check at 17m expects the case's alert alone.
    audit = exported(scrape, "mirrorgate_images_left_unmirrored_total", reason="audit")
    inputs.append(
        {"series": series("mirrorgate_images_left_unmirrored_total", audit), "values": "0x10 1x40"}
    )

    # Prometheus's own `up` for the target, down from minute 10.
    inputs.append({"series": series("up", TARGET), "values": "1x10 0x40"})
    checks += [
        {"eval_time": "12m", "alertname": "MirrorgateDown", "exp_alerts": []},
        {
            "eval_time": "17m",
            "alertname": "MirrorgateDown",
            "exp_alerts": [
                {"exp_labels": {**TARGET, "alertname": "MirrorgateDown", "severity": "critical"}}
            ],
        },
    ]

    # A serving certificate ten days from expiry: the warning, not yet the critical alert.
    expiry = exported(scrape, "mirrorgate_certificate_expiry_timestamp_seconds")
    inputs.append(
        {
            "series": series("mirrorgate_certificate_expiry_timestamp_seconds", expiry),
            "values": f"{10 * 86400}x50",
        }
    )
    checks.append(
        {
            "eval_time": "17m",
            "alertname": "MirrorgateCertificateExpiresSoon",
            "exp_alerts": [
                {
                    "exp_labels": {
                        "alertname": "MirrorgateCertificateExpiresSoon",
                        "severity": "warning",
                        "namespace": "mirrorgate",
                        "job": "mirrorgate",
                    }
                }
            ],
        }
    )

    tested = {check["alertname"] for check in checks}
    assert tested == set(severity), "every alert has a promtool test"
    test_file = tmp_path / "test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yaml"],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": checks}],
            }
        )
    )
    done = subprocess.run(
        [promtool, "test", "rules", test_file],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def dashboard_queries() -> list[str]:
    dashboard = json.loads((OVERLAY / "dashboard.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [
        v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"
    ]
    return queries


def test_every_dashboard_query_reads_an_exported_metric(scrape: list[Sample]) -> None:
    """Each query of the Grafana dashboard names metrics that /metrics exports, and only those."""
    names = {s.name for s in scrape}
    queries = dashboard_queries()
    assert len(queries) >= 10
    for query in queries:
        used = set(METRIC_NAME.findall(query))
        assert used, f"no mirrorgate metric in {query!r}"
        assert used <= names, f"{query!r} reads {used - names}, not exported"


def test_dashboard_queries_are_valid_promql(promtool: Path, tmp_path: Path) -> None:
    """promtool parses every dashboard query (as recording rules, its one PromQL check)."""
    # Grafana's variables are not PromQL: give them the value they take.
    recording = [
        {"record": f"mirrorgate:dashboard_{i}", "expr": query.replace("$namespace", "mirrorgate")}
        for i, query in enumerate(dashboard_queries())
        if not query.startswith("label_")
    ]
    rules = tmp_path / "dashboard-rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recording}]}))
    done = subprocess.run(
        [promtool, "check", "rules", rules], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
