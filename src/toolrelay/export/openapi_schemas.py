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
# Meaningful at a schema resource's root only: a stored schema has its own root, and an $id
# below it would make the #/$defs/... references under it resolve against another base.
_NOT_NESTED: Final = frozenset({"$schema", "$id"})


class Schemas:
    """Converts OpenAPI schemas to JSON Schema 2020-12, collecting components under $defs."""

    PREFIX: Final = "#/components/schemas/"

    def __init__(self, doc: Mapping[str, Any], direction: str | None = None) -> None:
        """``direction``: ``write`` (a tool's input: ``readOnly`` properties left out, as
        OpenAPI says they are not sent) or ``read`` (its output: ``writeOnly`` ones left
        out, as they never come back); None keeps both."""
        self.doc = doc
        self.defs: dict[str, Any] = {}
        self.hidden = {"write": "readOnly", "read": "writeOnly"}.get(direction or "")
        self.sizes: dict[str, int] = {}  # of each $defs entry as JSON, for with_defs' budget
        self.left_out = 0  # $defs entries the last with_defs left out (its budget)

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
                    try:
                        self.defs[name] = self.convert(_pointer(self.doc, ref), depth + 1)
                    except InvalidArgument:
                        del self.defs[name]  # not left as `true` for the next tool to use
                        raise
                target: Any = {"$ref": _defs_ref(name)}
            else:
                target = self.convert(_deref(self.doc, {"$ref": ref}), depth + 1)
            siblings = {k: v for k, v in schema.items() if k != "$ref" and k not in _OPENAPI_ONLY}
            if not siblings and schema.get("nullable") is not True:
                return target
            return self._with_siblings(target, siblings, schema.get("nullable") is True, depth)
        out: dict[str, Any] = {}
        hidden: set[str] = set()
        for key, value in schema.items():
            if key in _OPENAPI_ONLY or key in _NOT_NESTED:
                continue
            if key == "properties" and isinstance(value, Mapping) and self.hidden:
                hidden = {k for k, v in value.items() if self._is_hidden(v)}
                out[key] = {
                    k: self.convert(v, depth + 1) for k, v in value.items() if k not in hidden
                }
            elif key in _SCHEMA_MAP_KEYS and isinstance(value, Mapping):
                out[key] = {k: self.convert(v, depth + 1) for k, v in value.items()}
            elif key in _SCHEMA_LIST_KEYS and isinstance(value, list):
                out[key] = [self.convert(v, depth + 1) for v in value]
            elif key in _SCHEMA_KEYS and isinstance(value, Mapping | bool):
                out[key] = self.convert(value, depth + 1)
            elif key == "items" and isinstance(value, list):  # draft-04 tuples
                out["prefixItems"] = [self.convert(v, depth + 1) for v in value]
            else:
                out[key] = value
        if hidden and isinstance(out.get("required"), list):
            out["required"] = [r for r in out["required"] if r not in hidden]
            if not out["required"]:
                del out["required"]
        _openapi_30_keywords(schema, out)
        return out

    def _with_siblings(
        self, target: Any, siblings: dict[str, Any], nullable: bool, depth: int
    ) -> Any:
        """A ``$ref`` with keywords beside it (``{"$ref": ..., "nullable": true,
        "description": ...}``, as Asana and 3.1 documents write): the keywords are kept
        (JSON Schema 2020-12 applies them with the reference), ``nullable`` as
        ``anyOf: [<ref>, {"type": "null"}]``."""
        rest = self.convert(siblings, depth + 1) if siblings else {}
        if nullable:
            return {"anyOf": [target, {"type": "null"}]} | rest
        if isinstance(target, dict) and set(target) == {"$ref"}:
            return target | rest
        return {"allOf": [target]} | rest if rest else target

    def _is_hidden(self, schema: Any) -> bool:
        if isinstance(schema, Mapping) and schema.get(self.hidden or "") is True:
            return True  # beside a $ref, as Asana writes it
        try:
            target = _deref(self.doc, schema)
        except InvalidArgument:
            return False
        return isinstance(target, Mapping) and target.get(self.hidden or "") is True

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

    def with_defs(self, schema: dict[str, Any], budget: int | None = None) -> dict[str, Any]:
        """The schema with the component schemas it still refers to under ``$defs``.

        With ``budget`` (characters of JSON): when the whole is larger, only the component
        schemas within as many references of the root as fit are kept, and references to
        the others become ``{}`` (any value). Stripe's expandable objects refer to most of
        its API: 670 kB per response schema, 93 MB for its 234 GET tools."""
        self.left_out = 0
        depth: dict[str, int] = {}
        level = sorted(set(_refs(schema)))
        hops = 0
        while level:
            for name in level:
                depth[name] = hops
            hops += 1
            found = {r for name in level if name in self.defs for r in _refs(self.defs[name])}
            level = sorted(found - depth.keys())
        used = [name for name in depth if name in self.defs]
        if budget is not None:
            size = len(json.dumps(schema))
            sizes = {name: self._size(name) for name in used}
            if size + sum(sizes.values()) > budget:
                kept: set[str] = set()
                for hop in range(hops):
                    at = [n for n in used if depth[n] == hop]
                    grown = size + sum(sizes[n] for n in at)
                    if grown > budget:
                        break
                    kept.update(at)
                    size = grown
                schema = _cut(schema, kept)
                schema["$defs"] = {n: _cut(self.defs[n], kept) for n in sorted(kept)}
                if not kept:
                    del schema["$defs"]
                self.left_out = len(used) - len(kept)
                return schema
        if used:
            schema["$defs"] = {name: self.defs[name] for name in sorted(used)}
        return schema

    def _size(self, name: str) -> int:
        size = self.sizes.get(name)
        if size is None:
            size = self.sizes[name] = len(json.dumps(self.defs[name]))
        return size


def _cut(node: Any, kept: set[str]) -> Any:
    """A copy of a converted schema whose references to ``$defs`` not kept are ``{}``."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if (
            isinstance(ref, str)
            and ref.startswith("#/$defs/")
            and pointer_token(ref[len("#/$defs/") :]) not in kept
        ):
            return {k: _cut(v, kept) for k, v in node.items() if k != "$ref"}  # siblings apply
        return {k: _cut(v, kept) for k, v in node.items()}
    if isinstance(node, list):
        return [_cut(item, kept) for item in node]
    return node


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
    """``nullable``, ``example`` and boolean exclusive bounds, as JSON Schema 2020-12 says;
    a ``discriminator``'s property required (OpenAPI: the payload carries it), and its
    ``oneOf`` read as ``anyOf`` (OpenAPI picks the branch by that property, so a payload two
    branches accept is still valid; JSON Schema's ``oneOf`` alone would refuse it)."""
    discriminator = schema.get("discriminator")
    if isinstance(discriminator, Mapping) and isinstance(discriminator.get("propertyName"), str):
        name = discriminator["propertyName"]
        required = out.get("required")
        if required is None:
            out["required"] = [name]
        elif isinstance(required, list) and name not in required:
            out["required"] = [*required, name]
        if isinstance(out.get("oneOf"), list) and "anyOf" not in out:
            out["anyOf"] = out.pop("oneOf")
        values = _discriminator_values(schema, discriminator)
        properties = out.get("properties")
        if values and isinstance(properties, dict | type(None)):
            known = (properties or {}).get(name)
            if not (isinstance(known, dict) and "enum" in known):
                out["properties"] = (properties or {}) | {
                    name: (known if isinstance(known, dict) else {}) | {"enum": values}
                }
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


def _discriminator_values(schema: Mapping[str, Any], discriminator: Mapping[str, Any]) -> list[str]:
    """The values a ``oneOf``/``anyOf`` discriminator property may take: the mapping's keys
    and the names of the branches the mapping does not name (OpenAPI's implicit mapping)."""
    if not any(isinstance(schema.get(key), list) for key in ("oneOf", "anyOf")):
        return []  # on a base schema that subtypes extend (allOf): they are not listed here
    mapping = discriminator.get("mapping")
    mapping = mapping if isinstance(mapping, Mapping) else {}
    values = [str(key) for key in mapping]
    targets = {str(v) for v in mapping.values()}
    for key in ("oneOf", "anyOf"):
        for branch in schema.get(key) or []:
            ref = branch.get("$ref") if isinstance(branch, Mapping) else None
            if not isinstance(ref, str) or not ref.startswith(Schemas.PREFIX):
                if key in schema:
                    return []  # an inline branch: its value is not named anywhere
                continue
            name = pointer_token(ref[len(Schemas.PREFIX) :])
            if ref not in targets and name not in targets and name not in values:
                values.append(name)
    return values
