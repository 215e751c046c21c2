"""The one nesting limit: measured on the text, exactly as a parser nests, without recursion."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawr1.core.json_depth import MAX_JSON_DEPTH, JsonTooDeep, check_depth, json_depth, too_deep

TRICKY_TEXT = st.text(alphabet='[]{}"\\ abn\u00e9\u2028', max_size=8)
VALUES = st.recursive(
    st.none() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=30)


def depth_of(value: Any) -> int:
    """The reference: levels of lists and objects in the parsed value."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, list | dict):
            deepest = max(deepest, level)
            stack += [(child, level + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


@given(VALUES, st.booleans(), st.sampled_from([None, 1]))
def test_the_depth_of_a_text_is_the_depth_of_its_value(value: Any, ascii_only: bool, indent: int | None
                                                       ) -> None:
    """Brackets inside strings, escaped quotes and backslashes, non-ASCII text: none fools it."""
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert json_depth(text) == json_depth(text.encode()) == depth_of(value)


@pytest.mark.parametrize("text", ["[" * 50_000 + "]" * 50_000, "[" * 100_000, '{"a":' * 60_000 + "1"])
def test_any_depth_is_measured_without_recursion(text: str) -> None:
    assert too_deep(text) and json_depth(text) > MAX_JSON_DEPTH
    with pytest.raises(JsonTooDeep, match="the tool input nests deeper than 200 levels"):
        check_depth(text, "the tool input")


def test_the_limit_itself_is_allowed() -> None:
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    check_depth(at_limit)
    assert too_deep("[" + at_limit + "]") and not too_deep('["' + "[" * 500 + '"]')
    assert issubclass(JsonTooDeep, ValueError)  # every parser's caller handles it already
