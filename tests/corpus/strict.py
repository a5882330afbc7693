"""OpenAI's documented strict rules (Structured Outputs, "Supported schemas") as a checker:
``strict_violations`` of a tool's parameters, for the export tests and the corpus."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["STRICT_FORMATS", "STRICT_KEYWORDS", "strict_violations"]

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
            name = node["$ref"].removeprefix("#/$defs/")
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
