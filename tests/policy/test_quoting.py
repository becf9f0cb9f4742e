"""quote(): a bounded prefix of any value, rendered no further than it shows (issue 19)."""

from __future__ import annotations

import pytest

from mirrorgate.policy import quote


def shared(levels: int) -> list[object]:
    """What a YAML alias bomb decodes to: 9**levels strings through shared lists."""
    value: list[object] = ["lol"] * 9
    for _ in range(levels - 1):
        value = [value] * 9
    return value


@pytest.mark.parametrize("json_style", [False, True])
def test_a_shared_structure_is_cut_without_rendering_it_whole(json_style: bool) -> None:
    """4.8 million strings: before, rendered whole (33 MB) and then cut, stating its length."""
    shown = quote(shared(7), limit=64, json_style=json_style)
    opener = '[[[[[[["lol", "lol"' if json_style else "[[[[[[['lol', 'lol'"
    assert shown.startswith(opener)
    assert shown.endswith("… (more than 64 characters)")
    assert len(shown) == 64 + len("… (more than 64 characters)")


@pytest.mark.parametrize("json_style", [False, True])
def test_a_structure_nested_a_hundred_thousand_deep_is_cut_not_refused(json_style: bool) -> None:
    value: list[object] = []
    for _ in range(100_000):
        value = [value]
    assert quote(value, limit=10, json_style=json_style) == "[" * 10 + "… (more than 10 characters)"


@pytest.mark.parametrize(
    ("value", "plain", "as_json"),
    [
        (
            {"a": [1, True, None, "x"], "b": (1, 2.5)},
            "{'a': [1, True, None, 'x'], 'b': (1, 2.5)}",
            '{"a": [1, true, null, "x"], "b": [1, 2.5]}',
        ),
        ({1: "one"}, "{1: 'one'}", '{"1": "one"}'),
        ([], "[]", "[]"),
        (None, "None", "null"),
    ],
)
def test_small_values_read_as_repr_or_json(value: object, plain: str, as_json: str) -> None:
    assert quote(value) == plain
    assert quote(value, json_style=True) == as_json
