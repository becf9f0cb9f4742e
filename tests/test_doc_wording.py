"""Wording the docs once got wrong, each held by a test: what a reader copies or
believes from one page must not contradict another page or the code."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from mirrorgate.webhook.cluster import cabundle

REPOSITORY = Path(__file__).resolve().parents[1]
DOCS = REPOSITORY / "docs"


def _read(name: str) -> str:
    return (REPOSITORY / name).read_text()


def _shipped_yaml() -> Iterator[tuple[str, Any]]:
    """Every YAML document a user may copy: the fenced yaml blocks of README and docs/,
    and every YAML file under examples/ and manifests/ (the chart's templates aside)."""
    for page in [REPOSITORY / "README.md", *sorted(DOCS.glob("*.md"))]:
        for index, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", page.read_text(), re.S)):
            yield f"{page.name} block {index + 1}", block
    for root in ("examples", "manifests"):
        for path in sorted((REPOSITORY / root).rglob("*.yaml")):
            if "templates" not in path.parts:
                yield str(path.relative_to(REPOSITORY)), path.read_text()


def _grants(document: Any) -> Iterator[tuple[str, Any]]:
    """(credential name, namespaces) of every credentials map anywhere in a document."""
    if isinstance(document, dict):
        credentials = document.get("credentials")
        if isinstance(credentials, dict):
            for name, grant in credentials.items():
                if isinstance(grant, dict) and "namespaces" in grant:
                    yield str(name), grant["namespaces"]
        for value in document.values():
            yield from _grants(value)
    elif isinstance(document, list):
        for value in document:
            yield from _grants(value)


def _every_grant() -> list[tuple[str, str, Any]]:
    found = []
    for where, text in _shipped_yaml():
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError:
            # Not YAML as a whole (a fragment with placeholders): read the grants as text.
            found += [(where, "?", m) for m in re.findall(r"namespaces: (\[[^\]]*\])", text)]
            continue
        found += [(where, name, ns) for doc in documents for name, ns in _grants(doc)]
    return found


def test_the_scan_finds_the_grants() -> None:
    """The scan reads blocks and files alike (or the test below would prove nothing)."""
    places = {where.split(" ")[0] for where, _, _ in _every_grant()}
    assert {"README.md", "credentials.md", "examples/policy.yaml"} <= places


def test_no_shipped_example_grants_every_namespace() -> None:
    """security.md: never `namespaces: ["*"]` (nor a glob): no example may show it."""
    wide = [
        (where, name, namespaces)
        for where, name, namespaces in _every_grant()
        if "*" in str(namespaces)
    ]
    assert wide == []


def test_install_and_credential_providers_agree_on_the_plugin_binary() -> None:
    """install.md once said the plugin "is not shipped" while credential-providers.md
    wires it through the chart: both now say the user's image carries it."""
    install = _read("docs/install.md")
    for text in (install, _read("docs/credential-providers.md")):
        assert not re.search(r"none is shipped|not shipped", text)
    eks = install.split("### Amazon EKS", 1)[1].split("\n### ", 1)[0]
    assert "`credentialProviders.image`" in eks
    assert "credential-providers.md#amazon-ecr-with-iam-roles-for-service-accounts" in eks


def test_dev_clusters_gives_the_ca_through_the_chart() -> None:
    """dev-clusters.md once said the chart does not mount a CA; `mirrorCA` does, and the
    export takes the same bundle."""
    text = _read("docs/dev-clusters.md")
    assert "does not mount" not in text
    section = text.split("## An HTTPS cache with a login and a private CA", 1)[1]
    assert "`mirrorCA`" in section
    assert "--mirror-ca" in section
    assert "caFile:" not in section.split("```")[1]


def test_the_readme_explain_example_names_the_namespace() -> None:
    """`explain` without `-n` plans for namespace `default`, which the example grants
    nothing to: every console example names one (its output is checked by
    tests/test_docs.py)."""
    commands = re.findall(r"^\$ (mirrorgate explain .*)$", _read("README.md"), re.M)
    assert commands
    assert all(re.search(r" (-n|--namespace) \S+", c) for c in commands), commands


def _rendered_webhook_configurations() -> set[tuple[str, str]]:
    """(kind, name) of every webhook configuration the kustomize base and the chart make,
    the chart's names as its defaults render them (its name, no override)."""
    found = set()
    for path in (REPOSITORY / "manifests" / "base").glob("*.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            if document and str(document.get("kind", "")).endswith("WebhookConfiguration"):
                found.add((document["kind"], document["metadata"]["name"]))
    chart = REPOSITORY / "manifests" / "helm" / "mirrorgate"
    chart_name = yaml.safe_load((chart / "Chart.yaml").read_text())["name"]
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert not values["nameOverride"]
    assert not values["fullnameOverride"]
    for path in (chart / "templates").glob("*.yaml"):
        text = path.read_text()
        for kind in re.findall(r"^kind: (\w+WebhookConfiguration)$", text, re.M):
            assert '  name: {{ include "mirrorgate.fullname" . }}\n' in text, path.name
            found.add((kind, chart_name))
    return found


def test_argo_cd_ignores_the_cabundle_of_every_webhook_configuration() -> None:
    """operations.md's ignoreDifferences once named only the MutatingWebhookConfiguration,
    while mirrorgate writes the caBundle of its ValidatingWebhookConfiguration too: a
    self-healing sync would blank that one. Every configuration the manifests make, each
    kind mirrorgate keeps the caBundle of, is named, with the caBundle path."""
    section = _read("docs/operations.md").split("### GitOps: Argo CD and the caBundle", 1)[1]
    (block,) = re.findall(r"```yaml\n(.*?)```", section.split("\n### ", 1)[0], re.S)
    ignored = yaml.safe_load(block)["spec"]["ignoreDifferences"]
    named = {(entry["kind"], entry["name"]) for entry in ignored}
    rendered = _rendered_webhook_configurations()
    assert {kind for kind, _ in rendered} == set(cabundle.KINDS)
    assert named == rendered
    for entry in ignored:
        assert entry["group"] == "admissionregistration.k8s.io"
        assert entry["jqPathExpressions"] == [".webhooks[].clientConfig.caBundle"]


def test_examples_give_a_private_ca_once_as_mirror_ca() -> None:
    """README's policy once set `caFile: /etc/mirrorgate/harbor-ca.crt`, a path nothing
    mounts in the Pod or on the nodes. A private CA is given once, as the chart's
    `mirrorCA`; `caFile` is shown only where policy-reference.md documents the field
    (and the CRDs define it)."""
    documented = ("policy-reference.md", "manifests/base/crds/")
    with_ca_file = [
        where
        for where, text in _shipped_yaml()
        if re.search(r"^\s*(- )?caFile:", text, re.M) and not where.startswith(documented)
    ]
    assert with_ca_file == []
    readme = _read("README.md")
    (policy,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "mirrors:" in b]
    assert "mirrorCA" in policy
    assert "docs/install.md" in policy


def test_the_docker_path_builds_the_plugin_first() -> None:
    """The Containerfile copies the kubelet plugin from build/plugins/, which only `make
    plugin` (or `make image`) fills: install.md's Docker commands once began with `docker
    build`, which on a fresh checkout stops at that COPY."""
    containerfile = _read("Containerfile")
    assert re.search(r"^COPY build/plugins/", containerfile, re.M)
    section = _read("docs/install.md").split("### With Docker", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    plugin = commands.index("make plugin")
    build = next(i for i, line in enumerate(commands) if line.startswith("docker build"))
    assert plugin < build


def test_reuse_values_only_switches_the_mode_of_the_installed_chart() -> None:
    """operations.md's upgrade once said `helm upgrade <chart> --reuse-values --set
    image.tag=X.Y.Z`, the pitfall upgrading.md warns of: a newer chart's added values have
    no value at all and the chart refuses them. `--reuse-values` is shown only to switch
    `mode` within the chart already installed; an upgrade is `--reset-then-reuse-values`."""
    lines: list[tuple[str, str]] = []
    for page in [REPOSITORY / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        for block in re.findall(r"```(?:sh|console)\n(.*?)```", text, re.S):
            lines += [(page.name, line) for line in block.replace("\\\n", " ").splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        lines += [(page.name, span) for span in re.findall(r"`([^`]+)`", prose)]
    notes = REPOSITORY / "manifests" / "helm" / "mirrorgate" / "templates" / "NOTES.txt"
    lines += [(notes.name, line) for line in notes.read_text().splitlines()]
    commands = [
        (where, command)
        for where, line in lines
        if (command := " ".join(line.split())).startswith("helm upgrade")
        and "--reuse-values" in command
    ]
    assert commands
    for where, command in commands:
        assert re.search(r"--reuse-values --set mode=enforce\b", command), (where, command)
        assert "image." not in command, (where, command)
    upgrade = _read("docs/operations.md").split("## Upgrade", 1)[1].split("\n## ", 1)[0]
    assert "--reset-then-reuse-values" in " ".join(upgrade.split())
