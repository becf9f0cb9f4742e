"""`mirrorgate policy migrate`: the ClusterMirrorPolicy for a policy file plans as the file does."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirrorgate import policy
from mirrorgate.webhook import cli, policyfile
from mirrorgate.webhook.commands import migrate
from mirrorgate.webhook.errors import ConfigError

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLE_POLICIES = [
    Path("examples/policy.yaml"),
    Path("examples/kind/policy.yaml"),
    Path("examples/custom-policy/policy.yaml"),
    Path("manifests/base/policy.yaml"),
]


def chart_policy() -> bytes:
    values = yaml.safe_load((REPOSITORY / "manifests/helm/mirrorgate/values.yaml").read_text())
    return yaml.safe_dump(values["policy"]).encode()


def reference_policies() -> list[bytes]:
    text = (REPOSITORY / "docs/policy-reference.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return [b.encode() for b in blocks if "kind:" not in b]


def every_example() -> list[tuple[str, bytes]]:
    found = [(str(p), (REPOSITORY / p).read_bytes()) for p in EXAMPLE_POLICIES]
    found.append(("chart values", chart_policy()))
    found += [(f"reference block {i}", b) for i, b in enumerate(reference_policies())]
    return found


def _images(mirror_policy: policy.Policy) -> list[str]:
    """An image under each rule's source and mirror, and a few of no rule's."""
    images = [
        "nginx:1",
        "docker.io/bitnami/redis:7",
        "registry.k8s.io/pause:3.9",
        "example.org/x:1",
    ]
    for rule in mirror_policy.rules:
        host = f"eu.{rule.source.host}" if rule.source.wildcard else rule.source.host
        path = f"{rule.source.path}/app" if rule.source.path else "team/app"
        images += [f"{host}/{path}:1", f"{rule.mirror}/team/app:1"]
    return images


def _namespaces(mirror_policy: policy.Policy) -> list[str]:
    named = [n for g in mirror_policy.grants.values() for n in g.namespaces if n.isalnum()]
    return ["default", "kube-system", "shop", "team-a", *named, *mirror_policy.exclude_namespaces]


def plans(mirror_policy: policy.Policy, composition: policy.Composition) -> list[Any]:
    """What the file and the composition plan for each image in each namespace, the rule
    labels aside (a composed rule names its object)."""
    found = []
    labels = {"grants.mirrorgate.io/harbor-robot": "true"}
    for namespace in _namespaces(mirror_policy):
        for image in _images(mirror_policy):
            pod = {"metadata": {}, "spec": {"containers": [{"name": "c", "image": image}]}}
            pair = []
            for used in (mirror_policy, composition.policy_for(namespace)):
                plan = policy.plan(
                    pod, namespace=namespace, mirror_policy=used, namespace_labels=labels
                )
                pair.append(
                    (
                        [r.new_image for r in plan.rewrites],
                        plan.pull_secrets,
                        plan.outcomes,
                        len(plan.warnings),
                    )
                )
            found.append((namespace, image, *pair))
    return found


@pytest.mark.parametrize(("source", "data"), every_example(), ids=[s for s, _ in every_example()])
def test_migrate_then_compose_plans_as_the_file_does(source: str, data: bytes) -> None:
    mirror_policy = policyfile.parse_policy(data, source=source)
    text, kept = migrate.migrated(data, source=source)
    assert kept  # comments and all
    composition = policyfile.parse_composition(text.encode(), source="migrated")
    assert list(composition.verdicts) == [policy.ObjectKey("ClusterMirrorPolicy", "default")]
    compared = plans(mirror_policy, composition)
    assert any(plan[2][0] for plan in compared) or not mirror_policy.rules  # something rewrites
    for namespace, image, from_file, composed in compared:
        assert composed == from_file, (namespace, image)
    assert len(composition.cluster.warnings) == len(mirror_policy.warnings)


def test_the_comments_are_kept_and_the_spec_is_the_file() -> None:
    data = (REPOSITORY / "examples/policy.yaml").read_bytes()
    text, _ = migrate.migrated(data, source="examples/policy.yaml", name="platform")
    document = yaml.safe_load(text)
    assert document["metadata"] == {"name": "platform"}
    assert document["spec"] == yaml.safe_load(data)
    comments = [line.strip() for line in data.decode().splitlines() if line.strip().startswith("#")]
    assert comments
    assert all(c in text for c in comments)


def test_a_configmap_is_migrated_from_its_policy_key() -> None:
    data = (REPOSITORY / "examples/policy.yaml").read_text()
    config_map = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "mirrorgate-policy"},
            "data": {"policy.yaml": data},
        }
    )
    text, kept = migrate.migrated(config_map.encode(), source="cm.yaml")
    assert kept
    assert yaml.safe_load(text)["spec"] == yaml.safe_load(data)


def test_a_document_indenting_would_change_is_written_from_its_values() -> None:
    """A document on the `---` line cannot be indented under spec: its values are written."""
    data = b"--- {mirrors: [{source: docker.io, mirror: m.example/hub}]}\n"
    text, kept = migrate.migrated(data, source="flow.yaml")
    assert not kept
    assert yaml.safe_load(text)["spec"] == yaml.safe_load(data)
    assert migrate.migrated(b"{}\n", source="empty.yaml") == (
        "# mirrorgate policy migrate: the ClusterMirrorPolicy for empty.yaml\n"
        "apiVersion: mirrorgate.io/v1alpha1\nkind: ClusterMirrorPolicy\n"
        "metadata:\n  name: default\nspec: {}\n",
        True,
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b"mirrors: [{source: Docker.io, mirror: m.example/x}]",
            "bad.yaml: invalid policy (1 error):",
        ),
        (
            b"apiVersion: mirrorgate.io/v1alpha1\nkind: ClusterMirrorPolicy\n"
            b"metadata: {name: a}\nspec: {}\n",
            "bad.yaml: holds ClusterMirrorPolicy or MirrorPolicy objects, not a policy document",
        ),
    ],
)
def test_an_invalid_policy_or_objects_are_not_migrated(data: bytes, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        migrate.migrated(data, source="bad.yaml")
    assert str(caught.value).startswith(message)


def test_the_command_prints_it_and_a_bad_name_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes((REPOSITORY / "examples/policy.yaml").read_bytes())
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["policy", "migrate", str(path), "--name", "base"], out=out, err=err) == 0
    assert yaml.safe_load(out.getvalue())["metadata"]["name"] == "base"
    assert err.getvalue() == ""
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["policy", "migrate", str(path), "--name", "Base_1"], out=out, err=err) == 2
    assert 'error: --name: "Base_1" is not an object name (a DNS subdomain)' in err.getvalue()
    assert out.getvalue() == ""
