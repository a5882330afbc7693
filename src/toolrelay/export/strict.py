"""A tool's input schema in OpenAI Structured Outputs' strict subset (``strict: true``).

Strict mode wants every property required and ``additionalProperties: false`` on every
object, and refuses many keywords. The conversion keeps the meaning: an optional property
becomes required and nullable (``null`` = left out), ``oneOf`` becomes ``anyOf``, and
keywords strict mode refuses (``default``, ``examples``, ``minLength``, ``format: int64``…)
are written into the description, since toolrelay still validates every call against the
tool's own schema. What has no strict form (a free-form object, a map, ``allOf``, an array
of anything) raises NotStrict and the tool is exported non-strict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["NotStrict", "from_strict_call", "strict_schema"]

# Kept as they are (OpenAI "Supported schemas"); ``format`` only for these values.
KEPT: Final = frozenset(
    {"title", "description", "enum", "const", "pattern", "multipleOf", "minimum", "maximum",
     "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems"}
)  # fmt: skip
FORMATS: Final = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
# Structure that cannot be written into a description without losing the shape.
REFUSED: Final = frozenset(
    {"allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
     "patternProperties", "propertyNames", "prefixItems", "contains", "unevaluatedProperties",
     "unevaluatedItems", "$dynamicRef"}
)  # fmt: skip
DROPPED: Final = frozenset({"$schema", "$id", "$comment"})
STRUCTURE: Final = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "anyOf", "oneOf",
     "$ref", "$defs", "definitions", "format"}
)  # fmt: skip
MAX_DEPTH: Final = 10  # nesting levels strict mode accepts
NOTE_CHARS: Final = 200  # a folded keyword's value past this is cut (examples can be long)


class NotStrict(Exception):
    """The schema has no faithful strict form; ``str(exc)`` says why."""


def strict_schema(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The strict form of an input schema (an object at the root), or NotStrict."""
    root = dict(schema or {})
    root.setdefault("type", "object")
    if root["type"] != "object" or "anyOf" in root or "oneOf" in root:
        raise NotStrict("the input is not a plain object")
    root.setdefault("properties", {})
    converter = _Converter(root.get("$defs") or root.get("definitions") or {})
    out = converter.node(root, nullable=False, depth=0)
    for defs in ("$defs", "definitions"):
        if isinstance(root.get(defs), Mapping):
            out[defs] = {k: converter.node(v, False, 1) for k, v in root[defs].items()}
    return out


class _Converter:
    def __init__(self, defs: Mapping[str, Any]) -> None:
        self.defs = defs
        self.inlining: list[str] = []

    def node(self, schema: Any, nullable: bool, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise NotStrict(f"nested deeper than {MAX_DEPTH} levels")
        if not isinstance(schema, Mapping) or not schema:
            raise NotStrict("a value of any type")
        if "$ref" in schema:
            return self._ref(schema, nullable, depth)
        refused = sorted(REFUSED & schema.keys())
        if refused:
            raise NotStrict(f"{refused[0]} has no strict form")
        out: dict[str, Any] = {k: v for k, v in schema.items() if k in KEPT}
        notes = [_note(k, v) for k, v in schema.items() if k not in KEPT | STRUCTURE | DROPPED]
        if "format" in schema:
            if schema["format"] in FORMATS:
                out["format"] = schema["format"]
            else:
                notes.append(_note("format", schema["format"]))
        if "type" in schema:
            out["type"] = schema["type"]
        variants = schema.get("anyOf", schema.get("oneOf"))
        if variants is not None:
            out["anyOf"] = [self.node(v, False, depth + 1) for v in variants]
            if "oneOf" in schema:
                notes.append("exactly one of these")
        if _is_object(schema):
            self._object(schema, out, depth)
        if _types(schema) & {"array"} or "items" in schema:
            if "items" not in schema:
                raise NotStrict("an array of any values")
            out["items"] = self.node(schema["items"], False, depth + 1)
        if "type" not in out and "anyOf" not in out and not {"enum", "const"} & out.keys():
            raise NotStrict("a value of any type")
        if notes:
            folded = "; ".join(notes)
            description = schema.get("description")
            out["description"] = f"{description} ({folded})" if description else folded
        return _nullable(out) if nullable else out

    def _object(self, schema: Mapping[str, Any], out: dict[str, Any], depth: int) -> None:
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        if extra not in (None, False) or (not properties and depth > 0 and extra is None):
            raise NotStrict("an object with free-form members")
        required = set(schema.get("required") or ())
        out.setdefault("type", "object")
        out["properties"] = {
            name: self.node(sub, name not in required and not _allows_null(sub), depth + 1)
            for name, sub in properties.items()
        }
        out["required"] = list(properties)
        out["additionalProperties"] = False

    def _ref(self, schema: Mapping[str, Any], nullable: bool, depth: int) -> dict[str, Any]:
        ref = schema["$ref"]
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        if siblings and ref not in self.inlining:
            # a $ref with siblings is refused: spell the target out, the siblings on top
            self.inlining.append(ref)
            try:
                return self.node({**self._target(ref), **siblings}, nullable, depth)
            finally:
                self.inlining.pop()
        self._target(ref)  # an unresolvable ref is refused here, not by the vendor
        out: dict[str, Any] = {"$ref": ref}
        return {"anyOf": [out, {"type": "null"}]} if nullable else out

    def _target(self, ref: str) -> Mapping[str, Any]:
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix) and ref[len(prefix) :] in self.defs:
                target = self.defs[ref[len(prefix) :]]
                if isinstance(target, Mapping):
                    return target
        raise NotStrict(f"$ref {ref} is not one of the schema's $defs")


def _types(schema: Mapping[str, Any]) -> set[str]:
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind or ())


def _is_object(schema: Mapping[str, Any]) -> bool:
    return "object" in _types(schema) or "properties" in schema


def _allows_null(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return False
    variants = schema.get("anyOf", schema.get("oneOf")) or ()
    return "null" in _types(schema) or any(_allows_null(v) for v in variants)


def _nullable(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` or null: ``type: [X, "null"]`` (and None in its enum), else an anyOf."""
    if "type" in out and "const" not in out:
        kinds = [out["type"]] if isinstance(out["type"], str) else list(out["type"])
        out["type"] = [*kinds, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    if "anyOf" in out and "const" not in out and "enum" not in out:
        out["anyOf"] = [*out["anyOf"], {"type": "null"}]
        return out
    return {"anyOf": [out, {"type": "null"}]}


def _note(keyword: str, value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if len(text) > NOTE_CHARS:
        text = text[: NOTE_CHARS - 1] + "…"
    return f"{keyword}: {text}"


def from_strict_call(schema: Mapping[str, Any] | None, value: Any) -> Any:
    """A strict call's input as the tool's own schema takes it: a ``null`` the conversion
    added (an optional member the schema does not let be null) is dropped, as left out.
    Members under ``anyOf``/``oneOf`` are left as they are (which branch is unknown)."""
    root = schema or {}
    defs = root.get("$defs") or root.get("definitions") or {}
    return _from_strict(root, value, defs, 0)


def _from_strict(schema: Any, value: Any, defs: Mapping[str, Any], depth: int) -> Any:
    while isinstance(schema, Mapping) and "$ref" in schema and depth <= MAX_DEPTH:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        schema, depth = defs.get(name), depth + 1
    if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
        return value
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        return {
            name: _from_strict(properties.get(name), member, defs, depth + 1)
            for name, member in value.items()
            if not (
                member is None
                and name in properties
                and name not in required
                and not _allows_null(_resolved(properties[name], defs))
            )
        }
    if isinstance(value, list) and "items" in schema:
        return [_from_strict(schema["items"], item, defs, depth + 1) for item in value]
    return value


def _resolved(schema: Any, defs: Mapping[str, Any]) -> Any:
    for _ in range(MAX_DEPTH):
        if not (isinstance(schema, Mapping) and "$ref" in schema):
            break
        schema = defs.get(str(schema["$ref"]).rsplit("/", 1)[-1])
    return schema
