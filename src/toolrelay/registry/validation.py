"""Checks made in the application before anything is written."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jsonschema.exceptions import best_match

from toolrelay.dispatch.template import validate_template
from toolrelay.errors import InvalidArgument, InvalidInput, TemplateError
from toolrelay.registry.schemas import SchemaValidator, compile_schema, schema_problem


def check_json_schema(where: str, schema: Mapping[str, Any]) -> None:
    """Refuse a schema that is not valid, reaches outside itself (a ``$ref`` that is not
    inside the document, an unknown ``$schema``) or has a pattern RE2 cannot run; the
    error names the JSON Pointer of the keyword (registry/schemas.py)."""
    problem = schema_problem(schema)
    if problem is not None:
        raise InvalidArgument(f"{where} {problem}")


VALIDATOR_CACHE_SIZE = 1024  # distinct schemas kept compiled per process
# Levels of arrays and objects a call's input or an upstream's answer may nest. Every step
# after the parse recurses per level (the schema validator, credential scrubbing, the JSON
# sent to the database and to the agent): bounded here, each stays far inside Python's
# recursion limit, whatever an agent or an upstream sends. Real APIs nest a few dozen.
MAX_JSON_DEPTH = 100
# What no PostgreSQL text or jsonb holds: U+0000, and a UTF-16 surrogate left unpaired
# (JSON's "\ud800"; json.loads pairs the others into one character).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
UNSTORABLE_SAYS = "a NUL (U+0000) or an unpaired surrogate (U+D800 to U+DFFF)"
# Python's JSON parser reads NaN, Infinity and 1e400 (as infinity); JSON and jsonb hold none.
NOT_FINITE_SAYS = "NaN, Infinity or a number too large for a double (such as 1e400)"


def _unstorable(value: Any) -> str | None:
    """What PostgreSQL's jsonb cannot hold in a scalar (a string or a number); None: fine."""
    if isinstance(value, str):
        return UNSTORABLE_SAYS if UNSTORABLE.search(value) else None
    if isinstance(value, float) and not math.isfinite(value):
        return NOT_FINITE_SAYS
    return None


def nested_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` levels deep (walked
    without recursion, so any depth can be asked about)."""
    return _walk(value, limit, strings=False) is not None


def _walk(value: Any, limit: int, strings: bool) -> str | None:
    """What is wrong with a JSON value: nesting deeper than ``limit``, or (``strings``) a
    character in a string or key, or a number, that PostgreSQL cannot store. None: nothing."""
    if not isinstance(value, dict | list):
        return _unstorable(value) if strings else None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            if strings and any(UNSTORABLE.search(key) for key in item):
                return f"{UNSTORABLE_SAYS} in a key"
            children: Any = item.values()
        else:
            children = item
        for child in children:
            if isinstance(child, dict | list):
                if level >= limit:
                    return f"arrays and objects nested more than {limit} levels deep"
                stack.append((child, level + 1))
            elif strings and (problem := _unstorable(child)) is not None:
                return problem
    return None


@lru_cache(maxsize=VALIDATOR_CACHE_SIZE)
def _validator(schema_json: str) -> SchemaValidator:
    return compile_schema(json.loads(schema_json))


def validator(schema: Mapping[str, Any]) -> SchemaValidator:
    """A compiled validator, reused for every value checked against the same schema.

    The schema is checked again here (it may have been stored past registration): one that
    cannot be used makes every value invalid, saying why, and is never fetched from.
    """
    return _validator(json.dumps(schema, sort_keys=True))


def validate_input(schema: Mapping[str, Any], value: Any) -> None:
    """Raise InvalidInput naming the first violation, with its location in the input."""
    check_input(validator(schema), value)


def check_input(compiled: SchemaValidator, value: Any) -> None:
    """``validate_input`` with the schema's validator already in hand."""
    problem = _walk(value, MAX_JSON_DEPTH, strings=True)
    if problem is not None:  # later steps recurse per level; PostgreSQL cannot store some
        raise InvalidInput(f"input holds {problem}, which cannot be accepted")
    if compiled.refusal is not None:
        raise InvalidInput(
            f"the tool's schema_input {compiled.refusal}; the tool must be fixed before it"
            " can be invoked"
        )
    error = best_match(compiled.iter_errors(value))
    if error is not None:
        where = "input" + "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
        )
        raise InvalidInput(f"{where}: {error.message}")


def check_response_pointer(pointer: str | None) -> None:
    if pointer in (None, ""):
        return
    assert pointer is not None
    if not pointer.startswith("/"):
        raise InvalidArgument(
            f"response_pointer must be a JSON Pointer starting with '/': {pointer!r}"
        )


def check_tool(tool: Mapping[str, Any]) -> None:
    """Validate a tool's full configuration (the row as it will be stored)."""
    check_json_schema("schema_input", tool["schema_input"])
    check_json_schema("schema_output", tool["schema_output"])
    check_response_pointer(tool.get("response_pointer"))
    try:
        validate_template(
            tool.get("endpoint_url"),
            tool["http_method"],
            tool["request_template"],
            tool["auth_placement"],
            tool["auth_param_name"],
        )
    except TemplateError as exc:
        raise InvalidArgument(f"tool {tool['key']}: {exc.message}") from None
