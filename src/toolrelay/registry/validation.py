"""Checks made in the application before anything is written."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

from toolrelay.dispatch.template import validate_template
from toolrelay.errors import InvalidArgument, InvalidInput, TemplateError


def check_json_schema(where: str, schema: Mapping[str, Any]) -> None:
    if not isinstance(schema, Mapping):
        raise InvalidArgument(f"{where} must be a JSON object")
    try:
        validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.path) or "(root)"
        raise InvalidArgument(
            f"{where} is not a valid JSON Schema at {path}: {exc.message}"
        ) from None


VALIDATOR_CACHE_SIZE = 1024  # distinct schemas kept compiled per process


@lru_cache(maxsize=VALIDATOR_CACHE_SIZE)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    return validator_for(schema)(schema)


def validator(schema: Mapping[str, Any]) -> Any:
    """A compiled validator, reused for every value checked against the same schema."""
    return _validator(json.dumps(schema, sort_keys=True))


def validate_input(schema: Mapping[str, Any], value: Any) -> None:
    """Raise InvalidInput naming the first violation, with its location in the input."""
    error = best_match(validator(schema).iter_errors(value))
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
