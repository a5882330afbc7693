"""An agent's tools as OpenAI function-calling definitions.

MCP tool names are the tool keys as they are; OpenAI function names allow only
``[A-Za-z0-9_-]{1,64}``, so ``.`` becomes ``__`` (``postiz.create_post`` →
``postiz__create_post``). Map a function name back with the table ``openai_names`` gives,
not by string replacement: a key may hold ``__`` itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from toolrelay.errors import InvalidArgument

__all__ = ["openai_name", "openai_names", "openai_tools"]

OPENAI_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def openai_name(key: str) -> str:
    """The function name for a tool key: ``.`` → ``__``."""
    name = key.replace(".", "__")
    if not OPENAI_NAME.fullmatch(name):
        raise InvalidArgument(
            f"tool {key}: {name!r} is not a valid OpenAI function name"
            " (letters, digits, '_' and '-', at most 64 characters)"
        )
    return name


def openai_names(keys: Iterable[str]) -> dict[str, str]:
    """Function name → tool key; two keys mapping to the same name are an error."""
    names: dict[str, str] = {}
    for key in keys:
        name = openai_name(key)
        if name in names:
            raise InvalidArgument(
                f"tools {names[name]} and {key} both become the OpenAI function name {name!r}"
            )
        names[name] = key
    return names


def _parameters(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """schema_input; OpenAI wants an object schema with ``properties``, added when absent."""
    parameters = dict(schema or {})
    parameters.setdefault("type", "object")
    if parameters["type"] == "object":
        parameters.setdefault("properties", {})
    return parameters


def openai_tools(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[{"type": "function", "function": {name, description, parameters}}]`` per tool."""
    rows = list(rows)
    openai_names(row["key"] for row in rows)  # refuse collisions before building anything
    return [
        {
            "type": "function",
            "function": {
                "name": openai_name(row["key"]),
                "description": row.get("description") or row.get("name") or row["key"],
                "parameters": _parameters(row.get("schema_input")),
            },
        }
        for row in rows
    ]
