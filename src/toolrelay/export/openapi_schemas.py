"""OpenAPI schemas as JSON Schema 2020-12, for ``toolrelay import openapi``: component
schemas collected under ``$defs`` (the importer inlines references to them, so every stored
schema is self-contained, as registering requires), OpenAPI 3.0's keywords translated."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import quote

from toolrelay.errors import InvalidArgument
from toolrelay.export.openapi_load import MAX_REF_DEPTH, pointer_token
from toolrelay.export.openapi_load import deref as _deref
from toolrelay.export.openapi_load import pointer as _pointer

__all__ = ["Schemas"]

# JSON Schema keywords whose value is a schema, a list of schemas, or a map of schemas.
_SCHEMA_KEYS: Final = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "contains",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "additionalItems",
        "contentSchema",
    }
)
_SCHEMA_LIST_KEYS: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_MAP_KEYS: Final = frozenset(
    {"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"}
)
_OPENAPI_ONLY: Final = frozenset({"nullable", "discriminator", "xml", "externalDocs", "example"})


class Schemas:
    """Converts OpenAPI schemas to JSON Schema 2020-12, collecting components under $defs."""

    PREFIX: Final = "#/components/schemas/"

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        self.defs: dict[str, Any] = {}

    def convert(self, schema: Any, depth: int = 0) -> Any:
        if depth > MAX_REF_DEPTH * 4:
            raise InvalidArgument("a schema is nested too deeply")
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, Mapping):
            raise InvalidArgument(f"a schema must be an object, got {json.dumps(schema)[:60]}")
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref.startswith(self.PREFIX):
                name = pointer_token(ref[len(self.PREFIX) :])
                if name not in self.defs:
                    self.defs[name] = True  # a placeholder while converting: cycles end here
                    self.defs[name] = self.convert(_pointer(self.doc, ref), depth + 1)
                return {"$ref": _defs_ref(name)}
            return self.convert(_deref(self.doc, schema), depth + 1)
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key in _OPENAPI_ONLY:
                continue
            if key in _SCHEMA_MAP_KEYS and isinstance(value, Mapping):
                out[key] = {k: self.convert(v, depth + 1) for k, v in value.items()}
            elif key in _SCHEMA_LIST_KEYS and isinstance(value, list):
                out[key] = [self.convert(v, depth + 1) for v in value]
            elif key in _SCHEMA_KEYS and isinstance(value, Mapping | bool):
                out[key] = self.convert(value, depth + 1)
            elif key == "items" and isinstance(value, list):  # draft-04 tuples
                out["prefixItems"] = [self.convert(v, depth + 1) for v in value]
            else:
                out[key] = value
        _openapi_30_keywords(schema, out)
        return out

    def top_level(self, schema: Any) -> Any:
        """A root that is only a ``$ref`` or an ``allOf`` of plain objects, spelled out as one
        object schema (so its ``properties`` show at the root, where MCP clients look)."""
        schema = self._target(schema)
        if not isinstance(schema, dict) or set(schema) - {"allOf", "description", "title"}:
            return schema
        parts = [self._target(part) for part in schema.get("allOf") or []]
        plain = {"type", "properties", "required", "description", "title"}
        if not parts or not all(
            isinstance(p, dict) and p.get("type", "object") == "object" and not set(p) - plain
            for p in parts
        ):
            return schema
        merged: dict[str, Any] = {"type": "object", "properties": {}}
        required: list[str] = []
        for part in parts:
            merged["properties"] |= part.get("properties") or {}
            required += [r for r in part.get("required") or [] if r not in required]
        if required:
            merged["required"] = required
        for key in ("title", "description"):
            if key in schema:
                merged[key] = schema[key]
        return merged

    def _target(self, schema: Any) -> Any:
        """The $defs entry a bare ``{"$ref": "#/$defs/X"}`` points at, else the schema."""
        if isinstance(schema, dict) and set(schema) == {"$ref"}:
            ref = schema["$ref"]
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = pointer_token(ref[len("#/$defs/") :])
                target = self.defs.get(name)
                if isinstance(target, dict):
                    return dict(target)
        return schema

    def with_defs(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The schema with the component schemas it still refers to under ``$defs``."""
        used: set[str] = set()
        pending = list(_refs(schema))
        while pending:
            name = pending.pop()
            if name not in used and name in self.defs:
                used.add(name)
                pending.extend(_refs(self.defs[name]))
        if used:
            schema["$defs"] = {name: self.defs[name] for name in sorted(used)}
        return schema


def _defs_ref(name: str) -> str:
    """The ``$ref`` to a ``$defs`` entry: a JSON Pointer in a URI fragment, so escaped twice."""
    return "#/$defs/" + quote(name.replace("~", "~0").replace("/", "~1"), safe="~!$&'()*+,;=:@")


def _refs(node: Any) -> Iterator[str]:
    """The names of the ``#/$defs/...`` entries a converted schema refers to."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            yield pointer_token(ref[len("#/$defs/") :])
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _openapi_30_keywords(schema: Mapping[str, Any], out: dict[str, Any]) -> None:
    """``nullable``, ``example`` and boolean exclusive bounds, as JSON Schema 2020-12 says."""
    if schema.get("nullable") is True:
        kind = out.get("type")
        if isinstance(kind, str) and kind != "null":
            out["type"] = [kind, "null"]
        elif isinstance(kind, list) and "null" not in kind:
            out["type"] = [*kind, "null"]
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    if "example" in schema and "examples" not in out:
        out["examples"] = [schema["example"]]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if out.get(exclusive) is True and bound in out:
            out[exclusive] = out.pop(bound)
        elif isinstance(out.get(exclusive), bool):
            del out[exclusive]
