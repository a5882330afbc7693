"""The bounds every JSON value entering toolrelay is held to (registry/validation.py): its
depth, walked without recursion, and the characters PostgreSQL cannot store."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolrelay.errors import InvalidInput
from toolrelay.registry.validation import MAX_JSON_DEPTH, check_input, nested_too_deep, validator

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


def depth(value: Any) -> int:
    """Levels of arrays and objects, counted the plain (recursive) way."""
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


@given(value=JSON, limit=st.integers(min_value=1, max_value=6))
def test_the_walk_counts_levels_as_recursion_would(value: Any, limit: int) -> None:
    assert nested_too_deep(value, limit) == (depth(value) > limit)


def test_a_value_far_past_the_recursion_limit_is_walked() -> None:
    value: Any = []
    for _ in range(100_000):
        value = [value]
    assert nested_too_deep(value)
    with pytest.raises(InvalidInput, match=f"more than {MAX_JSON_DEPTH} levels deep"):
        check_input(validator({}), {"x": value})


@pytest.mark.parametrize(
    "value", [{"x": "a\x00"}, {"a\x00": 1}, ["\ud800"], {"x": [{"y": "\udfff"}]}, "\x00"]
)
def test_what_postgresql_cannot_store_is_refused_wherever_it_is(value: Any) -> None:
    with pytest.raises(InvalidInput, match="NUL"):
        check_input(validator({}), value)


def test_paired_surrogates_and_other_controls_are_fine() -> None:
    check_input(validator({}), {"emoji": "\U0001f600", "tab": "a\tb", "bell": "\x07"})
