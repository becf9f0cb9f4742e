"""docs/install.md's table of Helm values and the chart's values.yaml name the same values.

Every value a user can set has a row, and every row names a value that exists. A
value whose default is a mapping with keys is documented key by key, except the
few that take a whole document of their own (FREE_FORM).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPOSITORY = Path(__file__).resolve().parents[1]
INSTALL = (REPOSITORY / "docs" / "install.md").read_text()
VALUES = yaml.safe_load(
    (REPOSITORY / "manifests" / "helm" / "mirrorgate" / "values.yaml").read_text()
)
# Values that hold a document (a policy, a resources block, a node selector, a kubelet
# config), not settings.
FREE_FORM = frozenset(
    {
        "policy",
        "resources",
        "credentialProviders.config",
        "kubeletPlugin.nodeSelector",
        "kubeletPlugin.resources",
    }
)


def chart_values(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted name of every settable value: scalars, lists, empty and free-form maps."""
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and name not in FREE_FORM:
            yield from chart_values(value, f"{name}.")
        else:
            yield name


def expand(cell: str) -> list[str]:
    """A row's first cell as value names: `a.b` / `.c` is a.b and a.c, `x`, `y` is both.

    A `.suffix` continues from the last full name's parent (`image.repository` /
    `.tag` → image.tag); words outside backticks (or, and) only join names.
    """
    names: list[str] = []
    parent = ""
    for code in re.findall(r"`([^`]+)`", cell):
        if code.startswith("."):
            names.append(parent + code[1:])
        else:
            names.append(code)
            parent = code.rsplit(".", 1)[0] + "." if "." in code else ""
    return names


def documented() -> list[str]:
    section = INSTALL.split("## Helm values", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (`[^|]*) \|", section, re.M)
    return [name for row in rows for name in expand(row)]


def test_expand_reads_the_tables_shorthand() -> None:
    assert expand("`image.repository` / `.tag` / `.digest`") == [
        "image.repository",
        "image.tag",
        "image.digest",
    ]
    assert expand("`mirrorCA.configMap` or `.secret`, `.key`") == [
        "mirrorCA.configMap",
        "mirrorCA.secret",
        "mirrorCA.key",
    ]
    assert expand("`nodeSelector`, `tolerations`") == ["nodeSelector", "tolerations"]


def test_every_value_has_a_row() -> None:
    missing = sorted(set(chart_values(VALUES)) - set(documented()))
    assert not missing, f"values.yaml values without a row in docs/install.md: {missing}"


def test_every_row_names_a_value() -> None:
    values = set(chart_values(VALUES))
    unknown = sorted(set(documented()) - values)
    assert not unknown, f"docs/install.md rows naming no value of values.yaml: {unknown}"


def test_no_value_has_two_rows() -> None:
    names = documented()
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
