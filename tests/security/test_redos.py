"""Finding 7 of issue 12: an owner's pattern cannot stall the worker (ReDoS).

Patterns run on RE2, in time linear in the text: ``^(a+)+$`` against 10 kB of upstream output
is recorded as a mismatch on a completed call, quickly. A pattern RE2 cannot run
(backreferences, lookaround) is refused at registration, naming its JSON Pointer.

Each timing case first runs on a 25-character string, which takes Python's ``re`` about 0.4
s here (and doubles with every character): a regression fails there, in about a second,
instead of hanging the suite on the 10 kB string.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from jsonschema import validators
from jsonschema.exceptions import best_match

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay.dispatch.executor import schema_mismatch
from toolrelay.dispatch.worker import Worker
from toolrelay.errors import InvalidArgument, InvalidInput
from toolrelay.registry import Registry
from toolrelay.registry.validation import check_json_schema, validate_input, validator

Drain = Callable[..., Awaitable[Worker]]
EVIL = "^(a+)+$"
LONG = "a" * 10_000 + "!"  # 10 kB that almost matches
CANARY = "a" * 24 + "!"  # ~0.4 s under Python's re, x4 per 2 more characters
CANARY_BOUND = 0.05  # seconds; RE2 takes microseconds
BOUND = 0.5  # seconds for 10 kB: a behaviour bound, not a benchmark (bench/redos.py is)
DRAFT_2019 = "https://json-schema.org/draft/2019-09/schema"


def as_value(kind: str, text: str) -> Any:
    return {"string": text, "object": {text: 1}, "member": {"s": text}}[kind]


# (name, schema, where the text goes: the value itself, an object's key, member s)
CASES = [
    ("pattern", {"type": "string", "pattern": EVIL}, "string"),
    ("draft-07 pattern", {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": EVIL},
     "string"),
    # the root, entered again through a reference, with its $schema
    ("pattern via a $ref to the root",
     {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": EVIL,
      "properties": {"s": {"$ref": "#"}}},
     "member"),
    ("pattern via $defs",
     {"$defs": {"s": {"pattern": EVIL}}, "properties": {"s": {"$ref": "#/$defs/s"}}}, "member"),
    # here a matching key is the invalid one: its value is not a string
    ("patternProperties", {"patternProperties": {EVIL: {"type": "string"}}}, "object"),
    ("additionalProperties", {"patternProperties": {EVIL: {}}, "additionalProperties": False},
     "object"),
    ("propertyNames", {"propertyNames": {"pattern": EVIL}}, "object"),
    ("unevaluatedProperties",
     {"allOf": [{"patternProperties": {EVIL: {}}}], "unevaluatedProperties": False}, "object"),
    ("unevaluatedProperties 2019-09",
     {"$schema": DRAFT_2019, "allOf": [{"patternProperties": {EVIL: {}}}],
      "unevaluatedProperties": False}, "object"),
]  # fmt: skip


def timed(schema: dict[str, Any], value: Any) -> tuple[float, list[str]]:
    started = time.perf_counter()
    errors = [e.message for e in validator(schema).iter_errors(value)]
    return time.perf_counter() - started, errors


@pytest.mark.parametrize(("name", "schema", "kind"), CASES, ids=[c[0] for c in CASES])
def test_catastrophic_pattern_is_linear(name: str, schema: dict[str, Any], kind: str) -> None:
    check_json_schema("schema_output", schema)  # RE2 runs it, so it is allowed
    validator(schema)  # compiled outside the timing
    canary, _ = timed(schema, as_value(kind, CANARY))
    assert canary < CANARY_BOUND, f"{name}: {canary:.3f} s on {len(CANARY)} characters: not linear"
    almost, almost_errors = timed(schema, as_value(kind, LONG))
    assert almost < BOUND, f"{name}: {almost:.3f} s on 10 kB"
    matching, matching_errors = timed(schema, as_value(kind, "a" * 10_000))
    assert matching < BOUND, f"{name}: {matching:.3f} s on 10 kB"
    # exactly one of the two is invalid: the pattern was applied, in both directions
    assert bool(almost_errors) != bool(matching_errors), (almost_errors, matching_errors)


async def test_worker_records_the_mismatch_on_10kb_output_quickly(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": EVIL}},
        "patternProperties": {EVIL: {"type": "integer"}},
    }
    output = {"s": LONG, LONG: 1}
    canary = {"s": CANARY, CANARY: 1}
    started = time.perf_counter()
    assert schema_mismatch(schema, canary)  # the worker's own output check
    assert time.perf_counter() - started < CANARY_BOUND
    started = time.perf_counter()
    mismatch = schema_mismatch(schema, output)
    assert time.perf_counter() - started < BOUND
    assert mismatch is not None and "does not match '^(a+)+$'" in mismatch

    async def big(_: web.Request, _hit: int) -> web.Response:
        return web.json_response(output)

    upstream.routes["/big"] = big
    agent, tool = agent_with_tool(
        registry, endpoint_url=f"{upstream.base_url}/big", schema_output=schema
    )
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert inv["status"] == "completed", inv["error"]
    assert inv["output"]["s"] == LONG
    assert "does not match '^(a+)+$'" in inv["output_mismatch"]


def test_input_validation_is_linear_too(registry: Registry) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string", "pattern": EVIL}}}
    agent, tool = agent_with_tool(registry, schema_input=schema)
    started = time.perf_counter()
    with pytest.raises(InvalidInput):
        validate_input(schema, {"q": CANARY})
    assert time.perf_counter() - started < CANARY_BOUND
    started = time.perf_counter()
    with pytest.raises(InvalidInput, match=r"input\.q: 'a"):
        registry.invoke(agent, tool["key"], {"q": LONG})
    assert time.perf_counter() - started < BOUND + 1.0  # the database round trips included


@pytest.mark.parametrize(
    ("schema", "pointer", "says"),
    [
        ({"pattern": r"^(a)\1$"}, "/pattern", "backreferences are not supported"),
        ({"properties": {"pw": {"pattern": r"^(?=.*\d).{8,}$"}}}, "/properties/pw/pattern",
         "lookahead and lookbehind are not supported"),
        ({"items": {"pattern": r"(?<!x)y"}}, "/items/pattern",
         "lookahead and lookbehind are not supported"),
        ({"patternProperties": {r"^(?!_)": {}}}, "/patternProperties/^(?!_)",
         "lookahead and lookbehind are not supported"),
        ({"$defs": {"a/b": {"pattern": "x{1001}"}}}, "/$defs/a~1b/pattern",
         "repetition counts above 1000 are not supported"),
    ],
)  # fmt: skip
def test_patterns_re2_cannot_run_are_refused_at_registration(
    registry: Registry, schema: dict[str, Any], pointer: str, says: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        add_tool(registry, schema_output=schema)
    message = info.value.message
    assert message.startswith(f"schema_output at {pointer}: pattern "), message
    assert says in message and "RE2" in message
    assert registry.list_tools() == []


def test_a_stored_pattern_re2_cannot_run_refuses_the_call(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry)
    with registry.db.as_owner(registry.owner) as conn:
        conn.execute(
            "UPDATE agents.tools_registry SET schema_input = %s::jsonb WHERE key = %s",
            ('{"properties": {"x": {"pattern": "(a)\\\\1"}}}', tool["key"]),
        )
    with pytest.raises(InvalidInput, match=r"schema_input at /properties/x/pattern: pattern"):
        registry.invoke(agent, tool["key"], {"x": "aa"})
    assert schema_mismatch({"properties": {"x": {"pattern": "(a)\\1"}}}, {"x": "aa"})


def test_ecma_and_python_spellings_still_work() -> None:
    schema = {"type": "string", "pattern": r"^\u0041+\d\Z"}
    validate_input(schema, "AA1")
    with pytest.raises(InvalidInput):
        validate_input(schema, "AA1\n")  # \Z is the end of the text, as in Python
    validate_input({"pattern": r"^\p{L}+$"}, "été")  # RE2 classes are available


BENIGN = [
    ({"type": "string", "pattern": "^[a-z]+[0-9]*$"}, ["abc12", "ABC", "", 5]),
    ({"patternProperties": {"^x-": {"type": "integer"}, "^y": {}}, "additionalProperties": False},
     [{"x-a": 1}, {"x-a": "s"}, {"z": 1, "q": 2}, {"y1": None}]),
    ({"additionalProperties": {"type": "string"}, "properties": {"a": {}},
      "patternProperties": {"^n": {"type": "number"}}}, [{"a": 1, "b": "s", "n1": 2}, {"b": 3}]),
    ({"properties": {"a": {}}, "allOf": [{"patternProperties": {"^p": {}}}],
      "if": {"required": ["i"]}, "then": {"properties": {"i": {}}},
      "dependentSchemas": {"d": {"properties": {"e": {}}}},
      "unevaluatedProperties": False},
     [{"a": 1, "p1": 2}, {"q": 1}, {"i": 1}, {"d": 1, "e": 2}, {"d": 1, "f": 2}]),
    ({"$defs": {"base": {"patternProperties": {"^b": {}}}}, "$ref": "#/$defs/base",
      "unevaluatedProperties": {"type": "integer"}}, [{"b1": "s", "c": 1}, {"c": "s"}]),
    ({"propertyNames": {"pattern": "^[a-z]+$"}}, [{"ab": 1}, {"aB": 1}]),
]  # fmt: skip


@pytest.mark.parametrize(
    "draft", [validators.Draft202012Validator, validators.Draft201909Validator]
)
@pytest.mark.parametrize(("schema", "values"), BENIGN)
def test_same_answers_as_stock_jsonschema_on_ordinary_patterns(
    draft: Any, schema: dict[str, Any], values: list[Any]
) -> None:
    """RE2 replaces the engine, not the rules: the keywords re-implemented for it agree with
    jsonschema's own on patterns both engines run alike."""
    full = {"$schema": draft.META_SCHEMA["$id"]} | schema
    check_json_schema("schema_output", full)
    stock = draft(full)
    for value in values:
        ours = validator(full)
        assert ours.is_valid(value) == stock.is_valid(value), value
        mine, theirs = best_match(ours.iter_errors(value)), best_match(stock.iter_errors(value))
        assert (mine and mine.message) == (theirs and theirs.message), value
