"""Several mirrors per source, through the server and the tools: the probes' health picks
the mirror, admission attaches only its secret, metrics and /readyz say which, and
``explain --probe`` shows the choice.

The mirrors are real loopback servers (one answering /v2/, one a closed port).
"""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirrorgate import policy
from mirrorgate.webhook import cli
from mirrorgate.webhook.commands import audit_report, credentials_check
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.mirrorhealth import monitor
from tests.webhook import reviews, scrape
from tests.webhook.harness import make_harness
from tests.webhook.test_probes import answer, https_server

POLICY = """\
mirrors:
  - source: docker.io
    mirror:
      - url: harbor-a.corp.example/hub
        credential: a-pull
      - url: harbor-b.corp.example/hub
        credential: b-pull
credentials:
  a-pull: {namespaces: [team-a]}
  b-pull: {namespaces: [team-a]}
"""
A_DOWN = policy.Health(down={"harbor-a.corp.example": "connection refused"})
HUB_ON_B = "harbor-b.corp.example/hub/library/nginx:1.27"


def _closed_port() -> int:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port: int = closed.getsockname()[1]
    return port


def _probed_policy(up: str, down: str) -> str:
    return f"""\
mirrors:
  - source: docker.io
    mirror: ["http://{down}/hub", "http://{up}/hub"]
"""


def test_admission_serves_from_the_second_with_its_secret_and_counts_it(tmp_path: Path) -> None:
    made = make_harness(tmp_path, POLICY)
    with made.client:
        made.runtime.health = A_DOWN
        down = made.mutate(reviews.review(reviews.pod(reviews.HUB_IMAGE), namespace="team-a"))
        made.runtime.health = policy.HEALTHY
        up = made.mutate(reviews.review(reviews.pod(reviews.HUB_IMAGE), namespace="team-a"))
        page = scrape.samples(made.client.get("/metrics").text)
    patched = reviews.apply(reviews.pod(reviews.HUB_IMAGE), reviews.patch_ops(down))
    assert patched["spec"]["containers"][0]["image"] == HUB_ON_B
    assert patched["spec"]["imagePullSecrets"] == [{"name": "mirrorgate-b-pull"}]
    assert down["warnings"] == [
        f"containers/c0: image {reviews.HUB_IMAGE!r} rewritten to mirrors[0].mirror[1]'s "
        "mirror harbor-b.corp.example/hub: mirror harbor-a.corp.example/hub of "
        "mirrors[0].mirror[0] is down: connection refused"
    ]
    patched = reviews.apply(reviews.pod(reviews.HUB_IMAGE), reviews.patch_ops(up))
    assert patched["spec"]["imagePullSecrets"] == [{"name": "mirrorgate-a-pull"}]
    assert made.secrets.ensure_calls == [("team-a", ("b-pull",)), ("team-a", ("a-pull",))]
    by_mirror = "mirrorgate_images_rewritten_by_mirror_total"
    assert scrape.value(page, by_mirror, mirror="harbor-b.corp.example/hub") == 1
    assert scrape.value(page, by_mirror, mirror="harbor-a.corp.example/hub") == 1
    assert scrape.value(page, "mirrorgate_images_rewritten_total") == 2
    assert scrape.value(page, "mirrorgate_images_left_for_health_total") == 0


def test_the_monitor_probes_every_mirror_of_a_list(tmp_path: Path) -> None:
    """Each mirror has its own gauge and /readyz line; the published health fails over."""
    with https_server(None, tmp_path, answer(200)) as up:
        down = f"127.0.0.1:{_closed_port()}"
        mirror_policy = policy.load(
            {
                "mirrors": [
                    {"source": "docker.io", "mirror": [f"http://{down}/hub", f"http://{up}/hub"]}
                ],
                # Patient: on a loaded machine the loopback server may answer late.
                "health": {"interval": "30s", "timeout": "20s"},
            }
        )
        published: list[policy.Health] = []
        metrics = Metrics()
        watcher = monitor.HealthMonitor(
            mirror_policy=lambda: mirror_policy,
            credentials=None,
            publish=published.append,
            metrics=metrics,
        )
        try:
            watcher.probe_round()
        finally:
            watcher.stop()
    assert published == [policy.Health(down={down: "connection refused"})]
    assert watcher.problems() == {f"mirror {down}": "down: connection refused"}
    page = scrape.samples(metrics.render()[0].decode())
    assert page[("mirrorgate_mirror_up", frozenset({("mirror", f"{down}/hub")}))] == 0.0
    assert page[("mirrorgate_mirror_up", frozenset({("mirror", f"{up}/hub")}))] == 1.0
    # Every probed mirror's rewrite series exists from then on, at 0.
    by_mirror = "mirrorgate_images_rewritten_by_mirror_total"
    assert page[(by_mirror, frozenset({("mirror", f"{down}/hub")}))] == 0.0
    assert page[(by_mirror, frozenset({("mirror", f"{up}/hub")}))] == 0.0
    result = policy.plan(
        reviews.pod("nginx:1.27"),
        namespace="shop",
        mirror_policy=mirror_policy,
        health=published[-1],
    )
    assert [r.new_image for r in result.rewrites] == [f"{up}/hub/library/nginx:1.27"]


def test_a_list_mirror_s_credential_for_another_host_fails_that_mirror_only() -> None:
    mirror_policy = policy.load(yaml.safe_load(POLICY))
    store = {
        "a-pull": Credential(
            name="a-pull", registry="elsewhere.example", username="u", password="p"
        ),
        "b-pull": Credential(
            name="b-pull", registry="harbor-b.corp.example", username="u", password="p"
        ),
    }
    problems = monitor.credential_problems(mirror_policy, store)
    assert problems == {
        "a-pull": "is for registry 'elsewhere.example', not 'harbor-a.corp.example', the mirror "
        "host of mirrors[0].mirror[0]"
    }
    result = policy.plan(
        reviews.pod("nginx:1.27"),
        namespace="team-a",
        mirror_policy=mirror_policy,
        health=policy.Health(failing=problems),
    )
    assert [r.new_image for r in result.rewrites] == [HUB_ON_B]
    assert result.pull_secrets == ("mirrorgate-b-pull",)


def _explain(*argv: str) -> tuple[int, list[dict[str, Any]], str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["explain", *argv], out=out, err=err)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def test_explain_probe_shows_the_mirror_chosen_and_why_the_first_was_passed_over(
    tmp_path: Path,
) -> None:
    with https_server(None, tmp_path, answer(401)) as up:
        down = f"127.0.0.1:{_closed_port()}"
        path = tmp_path / "policy.yaml"
        path.write_text(_probed_policy(up, down))
        code, [probed], _ = _explain("--policy", str(path), "--probe", "nginx:1.27")
        plain_code, [unprobed], _ = _explain("--policy", str(path), "nginx:1.27")
        out = io.StringIO()
        table_code = cli.main(
            ["explain", "--policy", str(path), "--probe", "-o", "table", "nginx:1.27"],
            out=out,
            err=io.StringIO(),
        )
    assert (code, probed["outcome"], probed["result"]) == (
        1,  # admission would warn
        "rewrite",
        f"{up}/hub/library/nginx:1.27",
    )
    assert probed["rule"] == {
        "index": 0,
        "source": "docker.io",
        "mirror": f"{up}/hub",
        "scheme": "http",
        "credentials": [],
    }
    assert probed["mirrors"] == [
        {
            "rule": "mirrors[0].mirror[0]",
            "mirror": f"{down}/hub",
            "credentials": [],
            "status": "passed-over",
            "reason": f"mirror {down}/hub of mirrors[0].mirror[0] is down: connection refused",
        },
        {
            "rule": "mirrors[0].mirror[1]",
            "mirror": f"{up}/hub",
            "credentials": [],
            "status": "chosen",
            "reason": None,
        },
    ]
    assert probed["warning"] == (
        f"image 'nginx:1.27' rewritten to mirrors[0].mirror[1]'s mirror {up}/hub: mirror "
        f"{down}/hub of mirrors[0].mirror[0] is down: connection refused"
    )
    # Without --probe every mirror counts as up: the first, the rest not tried.
    assert (plain_code, unprobed["result"]) == (0, f"{down}/hub/library/nginx:1.27")
    assert [m["status"] for m in unprobed["mirrors"]] == ["chosen", "not-tried"]
    assert table_code == 1
    assert f"→ {up}/hub/library/nginx:1.27; passed over {down}/hub: mirror" in out.getvalue()


def test_explain_probe_with_every_mirror_down_is_the_fallback(tmp_path: Path) -> None:
    first, second = (f"127.0.0.1:{_closed_port()}" for _ in range(2))
    path = tmp_path / "policy.yaml"
    path.write_text(_probed_policy(second, first))
    code, [entry], _ = _explain("--policy", str(path), "--probe", "nginx:1.27")
    assert (code, entry["outcome"], entry["result"]) == (1, "mirror-unhealthy", "nginx:1.27")
    assert [m["status"] for m in entry["mirrors"]] == ["passed-over", "passed-over"]
    assert str(entry["warning"]).endswith("(onMirrorDown: fallback)")
    assert f"mirror {second}/hub of mirrors[0].mirror[1] is down" in str(entry["reason"])


def test_audit_judges_by_the_probed_health_naming_the_mirror_that_would_serve() -> None:
    mirror_policy = policy.load(yaml.safe_load(POLICY))
    offline = audit_report.judge(mirror_policy, "nginx:1.27", "team-a")
    assert (offline.rule, offline.credential, offline.health) == (
        "mirrors[0].mirror[0]",
        "a-pull",
        None,
    )
    probed = audit_report.judge(mirror_policy, "nginx:1.27", "team-a", A_DOWN)
    assert (probed.new_image, probed.rule, probed.credential) == (
        HUB_ON_B,
        "mirrors[0].mirror[1]",
        "b-pull",
    )
    assert probed.health == (
        "up (failed over: mirror harbor-a.corp.example/hub of mirrors[0].mirror[0] is down: "
        "connection refused)"
    )
    both = policy.Health(
        down={"harbor-a.corp.example": "refused", "harbor-b.corp.example": "refused"}
    )
    down = audit_report.judge(mirror_policy, "nginx:1.27", "team-a", both)
    assert down.rule == "mirrors[0].mirror[0]"
    assert down.health == (
        "mirror harbor-a.corp.example/hub of mirrors[0].mirror[0] is down: refused; "
        "mirror harbor-b.corp.example/hub of mirrors[0].mirror[1] is down: refused"
    )


def test_credentials_check_takes_the_mirror_of_the_list_that_uses_the_credential() -> None:
    mirror_policy = policy.load(yaml.safe_load(POLICY))
    assert credentials_check.admitted_image("b-pull", "nginx:1.27", mirror_policy) == HUB_ON_B
    assert (
        credentials_check.admitted_image("a-pull", "nginx:1.27", mirror_policy)
        == "harbor-a.corp.example/hub/library/nginx:1.27"
    )
    with pytest.raises(credentials_check.CheckFailed, match="uses credential 'a-pull', not 'c'"):
        credentials_check.admitted_image("c", "nginx:1.27", mirror_policy)
