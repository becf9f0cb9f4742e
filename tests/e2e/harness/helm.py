"""The Helm chart in the end-to-end suite: the pinned helm binary, run for real."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT

CHART = REPO_ROOT / "manifests" / "helm" / "mirrorgate"
# The labels a chart adds for Helm's bookkeeping; everything else must match kustomize.
HELM_LABELS = frozenset(
    {
        "helm.sh/chart",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
    }
)


def run(
    helm: Path, *args: str, home: Path, kubeconfig: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """helm with its cache, config and data under ``home`` (never the user's own)."""
    env = {
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
    }
    argv = [str(helm), *args]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def set_args(values: Mapping[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def template(
    helm: Path,
    home: Path,
    values: Mapping[str, str] | None = None,
    namespace: str = mg.NAMESPACE,
    files: Sequence[Path] = (),
    kube_version: str | None = None,
) -> list[dict[str, Any]]:
    """`helm template mirrorgate CHART -n NAMESPACE -f FILE... --set ...` as a list of objects;
    with ``kube_version``, as for a cluster of that version (`--kube-version`; without it,
    helm's own client version)."""
    output = run(
        helm,
        "template",
        "mirrorgate",
        str(CHART),
        "--namespace",
        namespace,
        *[arg for file in files for arg in ("-f", str(file))],
        *set_args(values or {}),
        *_kube_version(kube_version),
        home=home,
    ).stdout
    return [doc for doc in yaml.safe_load_all(output) if doc]


def notes(helm: Path, home: Path, values: Mapping[str, str], files: Sequence[Path] = ()) -> str:
    """NOTES.txt as `helm install -f FILE... --set ...` prints it (a client-side dry run: no
    cluster)."""
    done = run(
        helm,
        "install",
        "mirrorgate",
        str(CHART),
        "--namespace",
        mg.NAMESPACE,
        "--dry-run=client",
        *[arg for path in files for arg in ("-f", str(path))],
        *set_args(values),
        home=home,
    )
    return done.stdout[done.stdout.index("NOTES:") :]


def provider_config(notes: str) -> dict[str, Any]:
    """The kubelet's CredentialProviderConfig the NOTES print (kubeletPlugin), as data."""
    text = notes[notes.index("apiVersion: kubelet.config.k8s.io/v1") :]
    text = text.split("\n\n", 1)[0]
    config: dict[str, Any] = yaml.safe_load(text)
    return config


def refused(
    helm: Path, home: Path, values: Mapping[str, str], kube_version: str | None = None
) -> str:
    """What `helm template mirrorgate CHART --set ...` says on stderr, asserting it fails
    (with ``kube_version``, for a cluster of that version)."""
    done = run(
        helm,
        "template",
        "mirrorgate",
        str(CHART),
        *set_args(values),
        *_kube_version(kube_version),
        home=home,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    return done.stderr


def _kube_version(version: str | None) -> list[str]:
    return [] if version is None else ["--kube-version", version]


def without_helm_labels(objects: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects with Helm's own labels removed (and empty label maps dropped)."""
    stripped = []
    for obj in objects:
        metadata = dict(obj["metadata"])
        labels = {k: v for k, v in metadata.get("labels", {}).items() if k not in HELM_LABELS}
        metadata.pop("labels", None)
        if labels:
            metadata["labels"] = labels
        stripped.append({**obj, "metadata": metadata})
    return stripped
