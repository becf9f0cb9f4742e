"""`mirrorgate policy migrate FILE`: the ClusterMirrorPolicy for a policy file.

The file's text becomes the object's ``spec`` as written, comments kept: it
is indented under ``spec:``, and the result is read back and compared with
the file. Where indenting cannot keep the document as it was (a document
that the YAML grammar reads differently once indented), the spec is written
out again from its values instead, without the comments, and stderr says so.
FILE may also be the ``mirrorgate-policy`` ConfigMap (``kubectl get configmap
-o yaml``), whose ``policy.yaml`` is migrated, or ``-`` for standard input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import yaml

from mirrorgate import policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import EXIT_OK
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.policyfile import boundedyaml

__all__ = ["CONFIGMAP_KEY", "DEFAULT_NAME", "migrated", "run"]

DEFAULT_NAME = "default"
CONFIGMAP_KEY = "policy.yaml"
"""The key of the policy in the ``mirrorgate-policy`` ConfigMap."""


def _read(path: str, stdin: TextIO) -> tuple[bytes, str]:
    if path == "-":
        data = stdin.buffer.read(policyfile.MAX_POLICY_BYTES + 1)
        return data, "<stdin>"
    return policyfile.read_policy_bytes(path), path


def _unwrapped(data: bytes, source: str) -> tuple[bytes, str]:
    """A ConfigMap's policy, or ``data`` itself when it is not a ConfigMap."""
    try:
        documents = boundedyaml.load_all(data, source=source)
    except boundedyaml.YAMLError as error:
        raise ConfigError(str(error)) from None
    if len(documents) == 1 and isinstance(documents[0], dict):
        document = documents[0]
        if document.get("kind") == "ConfigMap":
            text = (document.get("data") or {}).get(CONFIGMAP_KEY)
            if not isinstance(text, str):
                raise ConfigError(f"{source}: a ConfigMap without data.{CONFIGMAP_KEY}")
            return text.encode(), f"{source} (data.{CONFIGMAP_KEY})"
    return data, source


def _body(text: str) -> str:
    """The document's lines, without its ``---`` and ``...`` markers and directives."""
    lines = text.lstrip("\ufeff").splitlines()
    while lines and (lines[0].startswith("%") or lines[0].strip() in ("", "---")):
        lines.pop(0)
    while lines and lines[-1].strip() in ("", "..."):
        lines.pop()
    return "\n".join(f"  {line}" if line.strip() else "" for line in lines)


def migrated(data: bytes, *, source: str, name: str = DEFAULT_NAME) -> tuple[str, bool]:
    """The ClusterMirrorPolicy named ``name`` for the policy ``data``, as YAML, and whether
    the file's text (its comments) could be kept. Raises :class:`ConfigError` for a
    policy that is not valid, or that already is objects."""
    data, source = _unwrapped(data, source)
    policyfile.parse_policy(data, source=source)  # valid, and a policy document
    documents = [d for d in boundedyaml.load_all(data, source=source) if d is not None]
    spec: Any = documents[0] if documents else {}
    head = (
        f"# mirrorgate policy migrate: the ClusterMirrorPolicy for {source}\n"
        f"apiVersion: {policy.API_VERSION}\n"
        f"kind: {policy.CLUSTER_KIND}\n"
        f"metadata:\n  name: {name}\n"
    )
    try:
        policy.parse_object(
            {
                "apiVersion": policy.API_VERSION,
                "kind": policy.CLUSTER_KIND,
                "metadata": {"name": name},
                "spec": {},
            }
        )
    except policy.PolicyError as error:
        raise ConfigError(f"--name: {error.errors[0].message}") from None
    if not spec:
        return f"{head}spec: {{}}\n", True
    body = _body(data.decode("utf-8", errors="replace"))
    if body:
        text = f"{head}spec:\n{body}\n"
        try:
            again = boundedyaml.load_all(text.encode(), source=source)
        except boundedyaml.YAMLError:
            again = []
        if len(again) == 1 and isinstance(again[0], dict) and again[0].get("spec") == spec:
            return text, True
    values = yaml.safe_dump({"spec": spec or {}}, sort_keys=False, allow_unicode=True)
    return head + values, False


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    data, source = _read(args.file, sys.stdin)
    text, kept = migrated(data, source=source, name=args.name)
    if not kept:
        print(f"note: {source}: written from its values; its comments are not kept", file=err)
    out.write(text)
    return EXIT_OK
