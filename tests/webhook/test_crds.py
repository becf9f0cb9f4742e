"""The CRDs and the reference's field table are what policy/fields.py makes, and that
table is the loader's grammar."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mirrorgate.policy import crdschema, fields, loader, mirrorlists
from mirrorgate.webhook.policyfile import crds

REPOSITORY = Path(__file__).resolve().parents[2]


def test_the_field_table_is_the_loaders_grammar() -> None:
    """One grammar: every field the loader reads has a row (and a schema), and no more."""
    expected = [
        *loader._TOP_LEVEL_KEYS,
        *(f"mirrors[].{key}" for key in loader._RULE_KEYS),
        *(f"mirrors[].mirror[].{key}" for key in mirrorlists.ENTRY_KEYS),
        *(f"exclude.{key}" for key in loader._EXCLUDE_KEYS),
        *(f"health.{key}" for key in loader._HEALTH_KEYS),
        *(f"credentials.<name>.{key}" for key in loader._GRANT_KEYS),
    ]
    assert sorted(f.path for f in fields.FIELDS) == sorted(expected)


def test_the_checked_in_crds_and_field_table_are_generated() -> None:
    """`make docs` writes them; this fails when policy/fields.py changed without it."""
    for path, text in crds.rendered(REPOSITORY).items():
        assert (REPOSITORY / path).read_text() == text, f"{path} is stale: run make docs"
    assert crds.main([]) == 0


def test_a_team_spec_has_only_rules_and_cannot_fix_them() -> None:
    team = crdschema.spec_schema("MirrorPolicy")
    assert list(team["properties"]) == ["mirrors"]
    rule = team["properties"]["mirrors"]["items"]
    cluster_rule = crdschema.spec_schema("ClusterMirrorPolicy")["properties"]["mirrors"]["items"]
    assert rule["properties"] == cluster_rule["properties"]  # one rule grammar
    assert rule["required"] == ["source", "mirror"]
    checks = team["properties"]["mirrors"]["items"]["x-kubernetes-validations"]
    assert {"rule": "!has(self.fixed)"}.items() <= checks[-1].items()
    cluster = crdschema.spec_schema("ClusterMirrorPolicy")
    assert all(
        c["rule"] != "!has(self.fixed)"
        for c in cluster["properties"]["mirrors"]["items"]["x-kubernetes-validations"]
    )


def test_every_pattern_admits_what_the_examples_write() -> None:
    """The schema's patterns are no stricter than the loader for the examples' values
    (the e2e test applies them to a real API server too)."""
    import yaml

    from tests.webhook.test_migrate import every_example

    schema = crdschema.spec_schema("ClusterMirrorPolicy")

    def walk(value: object, node: dict[str, Any]) -> int:
        if isinstance(value, str) and "pattern" in node:
            assert re.fullmatch(node["pattern"].strip("^$"), value), (value, node["pattern"])
            return 1
        if isinstance(value, list):
            return sum(walk(v, node.get("items", {})) for v in value)
        if isinstance(value, dict):
            extra = node.get("additionalProperties")
            return sum(
                walk(v, node.get("properties", {}).get(k) or extra or {}) for k, v in value.items()
            )
        return 0

    checked = sum(walk(yaml.safe_load(data) or {}, schema) for _, data in every_example())
    assert checked > 20


def test_a_string_mirrors_pattern_is_the_old_scheme_rule() -> None:
    """No "://" but an http:// or https:// at the start, no white space or upper case: the
    CEL rule a string-only mirror had, on every short string of a telling alphabet."""
    import itertools

    rule = crdschema.spec_schema("ClusterMirrorPolicy")["properties"]["mirrors"]["items"]
    pattern = re.compile(rule["properties"]["mirror"]["pattern"])
    for prefix in ("", "http://", "https://", "ftp://", "http:/"):
        for letters in itertools.product("a:/A ", repeat=5):
            value = prefix + "".join(letters)
            schemed = "://" not in value or any(
                value.startswith(s) and "://" not in value.removeprefix(s)
                for s in ("http://", "https://")
            )
            plain = not re.search(r"[\sA-Z]", value)
            assert bool(pattern.search(value)) == (schemed and plain), value
