"""OpenAI's strict mode (Structured Outputs) over real tools, issue 15: the documented strict
rules as a checker (``strict_violations``), and the figures and checks of ``toolrelay export
openai --strict`` for the tools of one imported document (``strict_figures``).

For one document's tools, exported as ``export_tools(rows, "openai", strict=True)`` exports
them (rows as ``agent_tools`` rows reach it: key, name, description, schema_input):

- figures: the tools; how many break the strict rules as they are (``strict_violations`` of
  the parameters exported without ``--strict``: what strict mode would refuse); how many
  export ``strict: true``; how many fall back to ``strict: false``, by reason;
- problems: every exported tool validates with the ``openai`` SDK's types
  (ChatCompletionToolParam, FunctionDefinition, ChatCompletionFunctionTool) and declares no
  key they do not; every ``strict: true`` function's parameters break no strict rule; and
  for ``SAMPLED`` strict tools (fixed seed) the parameters are a valid JSON Schema (the
  metaschema check costs ~5 ms a tool: for all of them, 40 s of the corpus test) and the
  round trip is faithful: a sample input valid for the tool's own schema_input, sent as a
  model sends it under strict mode (every optional member it leaves out as ``null``, in
  nested objects too), is valid for the strict parameters, and ``from_strict_call`` gives
  the sample back, valid for the schema_input.

One thing strict mode cannot say: "left out" for an optional member whose own schema allows
``null``. The model sends ``null`` for it, and ``null`` is what the tool gets (a valid input
for its schema, but not the same call). Such round trips are counted (``round_trip_null``),
not refused; any other difference is a problem.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

from jsonschema import Draft202012Validator
from openai.types.chat import ChatCompletionFunctionTool, ChatCompletionToolParam
from openai.types.shared_params import FunctionDefinition
from pydantic import TypeAdapter, ValidationError

from tests.corpus.sample import sample_input
from toolrelay.errors import InvalidInput
from toolrelay.export.openapi_load import pointer_token
from toolrelay.export.strict import from_strict_call
from toolrelay.export.targets import export_tools, parameters
from toolrelay.registry import ToolSpec
from toolrelay.registry.validation import validate_input

__all__ = [
    "STRICT_FORMATS",
    "STRICT_KEYWORDS",
    "reason_category",
    "strict_call",
    "strict_figures",
    "strict_violations",
]

SAMPLED: Final = 20  # strict tools per document whose round trip is checked
SEED: Final = 15
FALLBACK: Final = re.compile(r"tool (?P<key>.+?): exported with strict false: (?P<reason>.*)")

STRICT_KEYWORDS = {
    "type", "description", "title", "properties", "required", "additionalProperties", "items",
    "anyOf", "$ref", "$defs", "enum", "const", "pattern", "format", "multipleOf", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems",
}  # fmt: skip
STRICT_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6",
                  "uuid"}  # fmt: skip


def strict_violations(root: Mapping[str, Any]) -> list[str]:
    """OpenAI's documented strict rules (Structured Outputs, "Supported schemas"): root an
    object and not anyOf; every object with additionalProperties false and every property
    required; only the supported keywords and formats; ≤ 10 levels, ≤ 5,000 properties,
    ≤ 1,000 enum values; every $ref to a definition."""
    found: list[str] = []
    counts = {"properties": 0, "enum": 0}
    if root.get("type") != "object" or "anyOf" in root:
        found.append("root: not an object")

    def walk(node: Any, path: str, depth: int) -> None:
        if not isinstance(node, Mapping):
            found.append(f"{path}: not a schema")
            return
        if depth > 10:
            found.append(f"{path}: deeper than 10 levels")
        for keyword in set(node) - STRICT_KEYWORDS:
            found.append(f"{path}: {keyword} is not supported")
        if "format" in node and node["format"] not in STRICT_FORMATS:
            found.append(f"{path}: format {node['format']} is not supported")
        if not {"type", "anyOf", "$ref", "enum", "const"} & set(node):
            found.append(f"{path}: no type")
        if "$ref" in node:
            if set(node) != {"$ref"}:
                found.append(f"{path}: $ref with siblings")
            name = pointer_token(node["$ref"].removeprefix("#/$defs/"))  # a JSON Pointer
            if name not in root.get("$defs", {}):
                found.append(f"{path}: $ref {node['$ref']} unresolved")
        kinds = node.get("type", [])
        if "object" in ([kinds] if isinstance(kinds, str) else kinds):
            if node.get("additionalProperties") is not False:
                found.append(f"{path}: additionalProperties is not false")
            if set(node.get("required", [])) != set(node.get("properties", {})):
                found.append(f"{path}: not every property is required")
        counts["enum"] += len(node.get("enum", []))
        for name, sub in node.get("properties", {}).items():
            counts["properties"] += 1
            walk(sub, f"{path}.{name}", depth + 1)
        if "items" in node:
            walk(node["items"], f"{path}[]", depth + 1)
        for i, sub in enumerate(node.get("anyOf", [])):
            walk(sub, f"{path}|{i}", depth + 1)

    walk({k: v for k, v in root.items() if k != "$defs"}, "$", 0)
    for name, sub in root.get("$defs", {}).items():
        walk(sub, f"$defs.{name}", 1)
    if counts["properties"] > 5000 or counts["enum"] > 1000:
        found.append(f"too large: {counts}")
    return found


def reason_category(reason: str) -> str:
    """A fallback's reason (NotStrict's message) without the names in it."""
    return re.sub(r"^\$ref \S+ ", "$ref … ", reason)


def strict_figures(specs: Sequence[ToolSpec]) -> tuple[dict[str, Any], list[str]]:
    """(figures, problems) of ``export openai --strict`` for one document's tools."""
    rows: list[dict[str, Any]] = [
        {"key": s.key, "name": s.name, "description": s.description,
         "schema_input": s.schema_input}
        for s in specs
    ]  # fmt: skip
    exported = export_tools(rows, "openai", strict=True)
    reasons: Counter[str] = Counter()
    for warning in exported.warnings:
        found = FALLBACK.fullmatch(warning)
        if found:
            reasons[reason_category(found["reason"])] += 1
    problems: list[str] = []
    strict: dict[str, dict[str, Any]] = {}  # key -> strict parameters
    for row, tool in zip(rows, exported.tools, strict=True):
        problems += [f"tool {row['key']}: {p}" for p in sdk_problems(tool)]
        function = tool["function"]
        if function.get("strict") is not True:
            continue
        strict[row["key"]] = function["parameters"]
        problems += [
            f"tool {row['key']}: strict true, yet {v}"
            for v in strict_violations(function["parameters"])
        ]
    not_strict = len(rows) - len(strict)
    if sum(reasons.values()) != not_strict:
        problems.append(f"{not_strict} tools strict false, {sum(reasons.values())} warnings")
    trips: Counter[str] = Counter()
    order = sorted(strict)
    random.Random(SEED).shuffle(order)
    by_key = {row["key"]: row for row in rows}
    for key in order:
        if trips["exact"] + trips["null"] + trips["problem"] == SAMPLED:
            break
        try:  # against the metaschema: ~5 ms a tool, so for the sampled ones
            Draft202012Validator.check_schema(strict[key])
        except Exception as exc:
            problems.append(f"tool {key}: strict parameters not a JSON Schema: {exc}")
        outcome, wrong = round_trip(by_key[key]["schema_input"], strict[key], f"{SEED}:{key}")
        trips[outcome] += 1
        problems += [f"tool {key}: {p}" for p in wrong]
    figures = {
        "tools": len(rows),
        "violating": sum(1 for row in rows if strict_violations(parameters(row["schema_input"]))),
        "strict": len(strict),
        "not_strict": not_strict,
        "not_strict_by_reason": dict(reasons.most_common()),
        "round_trips": trips["exact"] + trips["null"] + trips["problem"],
        "round_trip_null": trips["null"],
        "round_trip_unsampled": trips["unsampled"],
    }
    return figures, problems


def sdk_problems(tool: Mapping[str, Any]) -> list[str]:
    """The tool against the ``openai`` SDK's types, with no key the TypedDicts do not declare
    (pydantic lets undeclared keys by)."""
    found: list[str] = []
    for value, typed in ((tool, ChatCompletionToolParam), (tool["function"], FunctionDefinition)):
        try:
            _adapter(typed).validate_python(value, strict=False)
        except ValidationError as exc:
            found.append(f"not a {typed.__name__}: {exc}")
        undeclared = set(value) - set(typed.__annotations__)
        if undeclared:
            found.append(f"keys {sorted(undeclared)} not in {typed.__name__}")
    try:
        ChatCompletionFunctionTool.model_validate(tool)
    except ValidationError as exc:
        found.append(f"not a ChatCompletionFunctionTool: {exc}")
    return found


@functools.cache
def _adapter(typed: Any) -> TypeAdapter[Any]:
    return TypeAdapter(typed)  # built once: ~0.7 ms each, for every tool of the corpus


def round_trip(schema: Mapping[str, Any], params: Mapping[str, Any], seed: str) -> tuple[
    str, list[str]
]:  # fmt: skip
    """(``exact`` | ``null`` | ``unsampled`` | ``problem``, problems) of one tool's round trip
    through a strict call; ``null``: back with ``null`` for members left out that allow it."""
    value = sample_input(schema, seed)
    if value is None:
        return "unsampled", []
    sent = strict_call(params, value)
    problems: list[str] = []
    errors = sorted(Draft202012Validator(params).iter_errors(sent), key=str)
    if errors:
        where = "/".join(map(str, errors[0].absolute_path))
        problems.append(f"the strict call is not valid for the strict schema at /{where}:"
                        f" {errors[0].message[:200]}")  # fmt: skip
    back = from_strict_call(schema, sent)
    try:
        validate_input(schema, back)
    except InvalidInput as exc:
        problems.append(f"from_strict_call's input is not valid for schema_input: {exc}")
    if back == value:
        return ("problem", problems) if problems else ("exact", [])
    if _without_added_nulls(back, value) == value:
        return ("problem", problems) if problems else ("null", [])
    problems.append(f"from_strict_call gives {_short(back)}, not the sample {_short(value)}")
    return "problem", problems


def strict_call(params: Mapping[str, Any], value: Any) -> Any:
    """``value`` as a model sends it under strict mode: every member of an object that it
    leaves out is sent as ``null`` (strict mode has every member required), in nested objects
    too; of an ``anyOf``, the first branch the value fits once filled."""
    defs = params.get("$defs") or {}
    return _call(params, value, defs, 0)


def _call(schema: Any, value: Any, defs: Mapping[str, Any], depth: int) -> Any:
    if not isinstance(schema, Mapping) or depth > 64:
        return value
    if isinstance(schema.get("$ref"), str):
        target = defs.get(pointer_token(schema["$ref"].removeprefix("#/$defs/")))
        return _call(target, value, defs, depth + 1)
    if isinstance(schema.get("anyOf"), list):
        for branch in schema["anyOf"]:
            candidate = _call(branch, value, defs, depth + 1)
            if Draft202012Validator({"$defs": defs, **branch}).is_valid(candidate):
                return candidate
        return value
    if isinstance(value, dict) and isinstance(schema.get("properties"), Mapping):
        filled = {k: _call(schema["properties"].get(k), v, defs, depth + 1)
                  for k, v in value.items()}  # fmt: skip
        return filled | {k: None for k in schema["properties"] if k not in value}
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_call(schema["items"], item, defs, depth + 1) for item in value]
    return value


def _without_added_nulls(back: Any, value: Any) -> Any:
    """``back`` without the ``null`` members ``value`` does not have (recursively)."""
    if isinstance(back, dict) and isinstance(value, dict):
        return {
            k: _without_added_nulls(v, value.get(k))
            for k, v in back.items()
            if not (v is None and k not in value)
        }
    if isinstance(back, list) and isinstance(value, list) and len(back) == len(value):
        return [_without_added_nulls(b, v) for b, v in zip(back, value, strict=True)]
    return back


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:299] + "…"
