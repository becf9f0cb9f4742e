"""The bounded loader reads what PyYAML's safe loader reads, and refuses what it cannot bound."""

from __future__ import annotations

import pytest
import yaml

from mirrorgate.webhook.policyfile import boundedyaml

SAME_AS_SAFE_LOAD = [
    pytest.param(
        "a: 1\nb: yes\nc: '1'\nd: !!str 2\ne: 0x1F\nf: 1.5\ng: ~\nh: 2001-12-14\n"
        "i: [1, {x: y}]\nj: !!float 1\nk: !!binary aGVsbG8=\n",
        id="scalar-rules",
    ),
    pytest.param("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n", id="merge-key"),
    pytest.param(
        "a: &a {p: 1}\nb: &b {p: 2, q: 2}\nc: {<<: [*a, *b], r: 3}\n", id="merge-list-first-wins"
    ),
    pytest.param("a: 1\n---\nb: 2\n", id="two-documents"),
    pytest.param("", id="empty"),
    pytest.param("---\n", id="empty-document"),
    pytest.param("a: 1\na: 2\n", id="repeated-key-last-wins"),
    pytest.param("a: &x [1]\nb: *x\n", id="alias"),
    pytest.param("1: 2\n", id="number-key"),
    pytest.param("'<<': 1\n", id="quoted-merge-key-is-a-string"),
]


@pytest.mark.parametrize("text", SAME_AS_SAFE_LOAD)
def test_reads_what_the_safe_loader_reads(text: str) -> None:
    assert boundedyaml.load_all(text, source="s") == list(yaml.safe_load_all(text))


def test_an_alias_is_the_same_object_as_its_anchor() -> None:
    """As in PyYAML: aliases share, which is why their expansion is what gets counted."""
    (document,) = boundedyaml.load_all("a: &x [1]\nb: *x\n", source="s")
    assert document["a"] is document["b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("a: !!set {x}\n", "s:1:4: the tag !!set is not supported", id="set"),
        pytest.param("a: !foo 1\n", "s:1:4: the tag !foo is not supported", id="custom-tag"),
        pytest.param(
            "? [a]\n: 1\n", "s:1:3: a mapping key that is a list or mapping", id="list-key"
        ),
        pytest.param(
            "a:\n  <<: 1\n",
            "s:2:7: a merge key (<<) takes a mapping or a list of mappings",
            id="merge-of-a-number",
        ),
        pytest.param(
            "a: [\n", "s:2:1: not valid YAML: did not find expected node content", id="syntax"
        ),
    ],
)
def test_refusals_say_where_and_why(text: str, message: str) -> None:
    with pytest.raises(boundedyaml.YAMLError) as caught:
        boundedyaml.load_all(text, source="s")
    assert str(caught.value) == message
