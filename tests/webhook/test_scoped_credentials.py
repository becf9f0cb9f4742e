"""Path-scoped credentials at the edge: the pull secret's key, explain and audit."""

from __future__ import annotations

import json

import orjson

from mirrorgate import policy
from mirrorgate.webhook.commands import audit_report, audit_table, explain
from mirrorgate.webhook.credentials.scoped import ScopedStore
from mirrorgate.webhook.credentials.store import Credential
from tests.webhook.test_pullsecrets import StaticStore

HOST = "harbor.corp.example"
POLICY = policy.load(
    {
        "mirrors": [
            {"source": "quay.io/a", "mirror": f"{HOST}/team-a", "credential": "team-a"},
            {"source": "quay.io/b", "mirror": f"{HOST}/team-b", "credential": "team-b"},
        ],
        "credentials": {
            "team-a": {"namespaces": ["*"], "registry": f"{HOST}/team-a"},
            "team-b": {"namespaces": ["*"]},
        },
    }
)


def _login(name: str, registry: str) -> Credential:
    return Credential(name=name, registry=registry, username=f"robot${name}", password="s3cr3t")


def test_a_scoped_credential_is_keyed_by_its_scope_and_others_keep_the_store_key() -> None:
    store = StaticStore({"team-a": _login("team-a", HOST), "team-b": _login("team-b", HOST)})
    scoped = ScopedStore(store, lambda: POLICY.grants)
    snapshot = scoped.snapshot()
    auths_a = orjson.loads(snapshot["team-a"].dockerconfigjson())["auths"]
    auths_b = orjson.loads(snapshot["team-b"].dockerconfigjson())["auths"]
    assert list(auths_a) == [f"{HOST}/team-a"]
    assert list(auths_b) == [HOST]
    assert scoped.snapshot() is snapshot  # memory only, and the same object until a change
    store.credentials = {"team-a": _login("team-a", "other.example")}
    changed = scoped.snapshot()
    assert changed is not snapshot
    assert changed["team-a"].registry == f"{HOST}/team-a"
    assert "team-b" not in changed


def test_explain_names_the_credential_and_its_scope() -> None:
    a = explain.explain_image("quay.io/a/app:1", mirror_policy=POLICY, namespace="shop")
    b = explain.explain_image("quay.io/b/app:1", mirror_policy=POLICY, namespace="shop")
    assert (a["result"], a["credential"], a["credentialRegistry"]) == (
        f"{HOST}/team-a/app:1",
        "team-a",
        f"{HOST}/team-a",
    )
    assert (b["result"], b["credential"], b["credentialRegistry"]) == (
        f"{HOST}/team-b/app:1",
        "team-b",
        None,
    )
    json.dumps(a)  # JSON-ready


def test_audit_table_shows_which_credential_each_rewrite_gets() -> None:
    report = audit_report.Report(policy_path="p.yaml", scope=None, namespaces={}, fail_on=None)
    ns = report.namespaces["shop"] = audit_report.NamespaceReport(
        name="shop", mode="audit", mode_label="audit", excluded=False
    )
    ns.add_pod(
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "image": "quay.io/a/app:1"},
                    {"name": "b", "image": "quay.io/b/app:1"},
                    {"name": "c", "image": "nginx:1"},
                ]
            },
        },
        POLICY,
    )
    table = audit_table.render_table(report)
    assert f"→ {HOST}/team-a/app:1\n{' ' * 26}with credential team-a\n" in table
    assert f"→ {HOST}/team-b/app:1\n{' ' * 26}with credential team-b\n" in table
    assert "nginx:1" in table
