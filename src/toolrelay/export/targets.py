"""An agent's tools in each vendor's tool shape (docs/interop.md, "export").

One function name per key for every target (export/names.py); ``schema_input`` as each
vendor wants it. The result carries the warnings to print and the name → key table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from toolrelay.errors import InvalidArgument
from toolrelay.export.names import MAX_NAME, exported_names, gemini_name
from toolrelay.export.strict import NotStrict, strict_schema

__all__ = ["MAX_DESCRIPTION", "TARGETS", "Export", "export_tools"]

MAX_DESCRIPTION: Final = 1024  # characters: OpenAI's function description limit
STRICT_TARGETS: Final = frozenset({"openai", "openai-responses"})


@dataclass
class Export:
    tools: list[dict[str, Any]]
    names: dict[str, str]  # function name → tool key, every tool
    warnings: list[str] = field(default_factory=list)

    @property
    def shortened(self) -> dict[str, str]:
        """The names shortened for being over 64 characters."""
        return {n: k for n, k in self.names.items() if len(k.replace(".", "__")) > MAX_NAME}


@dataclass(frozen=True)
class _Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool | None  # None: --strict not asked


def parameters(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """schema_input; vendors want an object schema with ``properties``, added when absent."""
    params = dict(schema or {})
    params.setdefault("type", "object")
    if params["type"] == "object":
        params.setdefault("properties", {})
    return params


def _openai(tool: _Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "description": tool.description,
                                "parameters": tool.parameters}  # fmt: skip
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _responses(tool: _Tool) -> dict[str, Any]:
    # Responses defaults to strict when the flag is left out: always say which
    return {"type": "function", "name": tool.name, "description": tool.description,
            "parameters": tool.parameters, "strict": bool(tool.strict)}  # fmt: skip


def _anthropic(tool: _Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


def _gemini(tool: _Tool) -> dict[str, Any]:
    # parametersJsonSchema takes JSON Schema as it is (``parameters`` is an OpenAPI subset)
    return {"name": tool.name, "description": tool.description,
            "parametersJsonSchema": tool.parameters}  # fmt: skip


TARGETS: Final[dict[str, Callable[[_Tool], dict[str, Any]]]] = {
    "openai": _openai,
    "openai-responses": _responses,
    "anthropic": _anthropic,
    "gemini": _gemini,
}


def export_tools(
    rows: Iterable[Mapping[str, Any]], target: str = "openai", strict: bool = False
) -> Export:
    """The tools (``agent_tools`` rows) for ``target``; collisions refused before anything."""
    if target not in TARGETS:
        raise InvalidArgument(f"unknown export target {target!r} (one of {', '.join(TARGETS)})")
    if strict and target not in STRICT_TARGETS:
        raise InvalidArgument(f"--strict is OpenAI's Structured Outputs: not for {target}")
    rows = list(rows)
    names = exported_names(row["key"] for row in rows)
    if target == "gemini":  # a name starting with a digit gets a "_" first
        names = {gemini_name(key): key for key in names.values()}
    result = Export([], names)
    for name, row in zip(names, rows, strict=True):
        tool = _tool(name, row, strict, result.warnings)
        result.tools.append(TARGETS[target](tool))
    for name, key in result.shortened.items():
        result.warnings.append(f"tool {key}: exported as {name} (over 64 characters)")
    return result


def _tool(name: str, row: Mapping[str, Any], strict: bool, warnings: list[str]) -> _Tool:
    key = row["key"]
    description = row.get("description") or row.get("name") or key
    if len(description) > MAX_DESCRIPTION:
        warnings.append(
            f"tool {key}: description shortened from {len(description)}"
            f" to {MAX_DESCRIPTION} characters"
        )
        description = description[: MAX_DESCRIPTION - 1] + "…"
    if not strict:
        return _Tool(name, description, parameters(row.get("schema_input")), None)
    try:
        return _Tool(name, description, strict_schema(row.get("schema_input")), True)
    except NotStrict as exc:
        warnings.append(f"tool {key}: exported with strict false: {exc}")
        return _Tool(name, description, parameters(row.get("schema_input")), False)
