"""One tenant's schema cannot hold the event loop every tenant shares.

An audit registered a few-kB input schema, ``$defs`` d0…d18 each an ``anyOf`` of two
references to the next, and sent ``{"x": 1}`` once: serve validated it for 48 s in its event
loop (every tenant's calls and /healthz frozen, 1.6 GiB held after), and at 19 levels it ran
out of memory. The same schema as a tool's ``schema_output`` froze the worker. A 3,000-item
array under ``uniqueItems`` took 13 s (jsonschema compares every pair), ``enum`` likewise.
Now a value may take a number of steps proportional to its size, and ``uniqueItems`` and
``enum`` compare by hashing (registry/schemas.py).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from jsonschema import Draft202012Validator

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.worker import Worker
from toolrelay.errors import InvalidInput
from toolrelay.registry import Registry
from toolrelay.registry.validation import validate_input, validator

Drain = Callable[..., Awaitable[Worker]]
LEVELS = 16  # 65,536 evaluations of one value before the bound (about 12 s)


def branching(levels: int = LEVELS) -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def test_an_input_schema_that_branches_without_end_is_refused_for_the_value(
    registry: Registry,
) -> None:
    agent, tool = agent_with_tool(registry, key="branchy.get", schema_input=branching())
    with pytest.raises(InvalidInput, match="branches too much") as refused:
        registry.invoke(agent, tool["key"], {"x": 1})
    assert "simplified" in refused.value.message
    # The same schema with a value it accepts at once (the first branch of each level).
    registry.invoke(agent, tool["key"], {"x": "fine"})


def test_a_deep_but_honest_schema_still_validates_a_large_value() -> None:
    """A recursive tree schema over a value of 20,000 parts: an ordinary schema's handful of
    steps a part is far inside the bound."""
    tree = {
        "$defs": {"node": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "minLength": 1},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "additionalProperties": False}},
        "$ref": "#/$defs/node",
    }  # fmt: skip
    leaves = [{"name": f"n{i}", "tags": ["a", "b"]} for i in range(4000)]
    value = {"name": "root", "children": [{"name": "mid", "children": leaves}]}
    validate_input(tree, value)
    leaves[-1]["tags"] = ["a", "a"]
    with pytest.raises(InvalidInput, match="non-unique"):
        validate_input(tree, value)


async def test_an_output_schema_that_branches_without_end_is_refused_for_the_answer(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def answer(_: web.Request, _hit: int) -> web.Response:
        return web.json_response({"x": 1})

    upstream.routes["/branchy"] = answer
    agent, tool = agent_with_tool(
        registry, key="branchy.out", endpoint_url=f"{upstream.base_url}/branchy",
        schema_output=branching(),
    )  # fmt: skip
    made = registry.invoke(agent, tool["key"], {})
    await drain()
    row = registry.get_invocation(made)
    assert row["status"] == "completed", row["error"]  # the call was made: its answer kept
    assert "branches too much" in row["output_mismatch"]


EQUALITY = [  # (items, unique by JSON Schema's equality)
    ([1, 1.0], False), ([1, True], True), ([0, False], True), ([None, False], True),
    ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], False), ([{"a": 1}, {"a": 1.0}], False),
    ([[1, 2], [2, 1]], True), ([[1], [1.0]], False), (["1", 1], True),
    ([{"a": [True]}, {"a": [1]}], True), ([2**53 + 1, float(2**53)], True), ([], True),
]  # fmt: skip


@pytest.mark.parametrize(("items", "unique"), EQUALITY)
def test_unique_items_and_enum_mean_what_jsonschema_means(items: list[Any], unique: bool) -> None:
    ours, stock = validator({"uniqueItems": True}), Draft202012Validator({"uniqueItems": True})
    assert ours.is_valid(items) is stock.is_valid(items) is unique
    for candidate in [*items, 1, True, {"a": 1.0}, [1.0, 2]]:
        schema = {"enum": items[:1] or [None]}
        assert validator(schema).is_valid(candidate) is Draft202012Validator(schema).is_valid(
            candidate
        ), (schema, candidate)


def test_unique_items_and_enum_on_large_values_finish() -> None:
    """20,000 distinct objects under ``uniqueItems``, and 20,000 strings against a 5,000-value
    ``enum``: jsonschema's pairwise comparisons take minutes (13 s at 3,000); run in a
    process of its own, stopped after 120 s, so a regression fails instead of hanging."""
    script = textwrap.dedent("""
        from toolrelay.registry.validation import validator
        items = [{"id": i, "name": f"n{i}"} for i in range(20_000)]
        assert validator({"type": "array", "uniqueItems": True}).is_valid(items)
        names = [f"v{i}" for i in range(5_000)]
        schema = {"type": "array", "items": {"enum": names}}
        assert validator(schema).is_valid([f"v{i % 5_000}" for i in range(20_000)])
        print("done")
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
