"""A tool's input schema in OpenAI Structured Outputs' strict subset (``strict: true``).

Strict mode wants every property required and ``additionalProperties: false`` on every
object, and refuses many keywords. The conversion keeps the meaning: an optional property
becomes required and nullable (``null`` = left out), ``oneOf`` becomes ``anyOf``, and
keywords strict mode refuses (``default``, ``examples``, ``minLength``, ``format: int64``…)
are written into the description, since toolrelay still validates every call against the
tool's own schema. Structure strict mode refuses is rewritten when an equivalent form
exists: an ``allOf`` is merged into one schema, a ``$ref`` with keywords beside it is spelt
out with them, and keywords beside an ``anyOf``/``oneOf`` go into each of its branches (JSON
Schema's keywords at one level all apply, so each rewrite admits the same values). What has
no strict form (a free-form object, a map, ``not``, an array of anything, an ``allOf`` whose
parts disagree on a keyword that cannot be combined) raises NotStrict and the tool is
exported non-strict.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any, Final

from toolrelay.export.openapi_load import pointer_token

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
    {"not", "if", "then", "else", "dependentRequired", "dependentSchemas", "patternProperties",
     "propertyNames", "prefixItems", "contains", "unevaluatedProperties", "unevaluatedItems",
     "$dynamicRef"}
)  # fmt: skip
DROPPED: Final = frozenset({"$schema", "$id", "$comment"})
STRUCTURE: Final = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "anyOf", "oneOf",
     "$ref", "$defs", "definitions", "format"}
)  # fmt: skip
# The keywords JSON Schema 2020-12 validates with; any other one is an annotation, of which
# a merge keeps the first.
ASSERTING: Final = frozenset(
    {"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
     "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems", "minItems",
     "uniqueItems", "maxContains", "minContains", "contains", "maxProperties", "minProperties",
     "required", "dependentRequired", "dependentSchemas", "properties", "patternProperties",
     "additionalProperties", "propertyNames", "items", "prefixItems", "unevaluatedItems",
     "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref",
     "$dynamicRef"}
)  # fmt: skip
LOWER: Final = frozenset(
    {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains"}
)
UPPER: Final = frozenset(
    {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains"}
)
MAX_DEPTH: Final = 10  # nesting levels strict mode accepts
MAX_CALL_DEPTH: Final = 64  # levels of a call's input from_strict_call reads
NOTE_CHARS: Final = 200  # a folded keyword's value past this is cut (examples can be long)


class NotStrict(Exception):
    """The schema has no faithful strict form; ``str(exc)`` says why."""


class _Unsendable(NotStrict):
    """No strict call fits this schema: it admits nothing (an allOf of a string and an
    integer), or only with a member that is not among its properties (which no strict call
    has). An anyOf/oneOf branch that is so is left out; anywhere else it is NotStrict."""


def strict_schema(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The strict form of an input schema (an object at the root), or NotStrict."""
    root = dict(schema or {})
    root.setdefault("type", "object")
    if root["type"] != "object" or "anyOf" in root or "oneOf" in root:
        raise NotStrict("the input is not a plain object")
    root.setdefault("properties", {})
    converter = _Converter(_defs(root))
    out = converter.node(root, nullable=False, depth=0)
    for defs in ("$defs", "definitions"):
        if isinstance(root.get(defs), Mapping):
            out[defs] = {k: converter.node(v, False, 1) for k, v in root[defs].items()}
    return out


def _defs(root: Mapping[str, Any]) -> Mapping[str, Any]:
    defs = root.get("$defs") or root.get("definitions") or {}
    return defs if isinstance(defs, Mapping) else {}


class _Schemas:
    """A schema read as one node: a ``$ref`` with keywords beside it spelt out with them, an
    ``allOf`` merged, and the keywords beside an ``anyOf``/``oneOf`` moved into each branch.
    NotStrict when that cannot be done without changing which values the schema admits."""

    def __init__(self, defs: Mapping[str, Any]) -> None:
        self.defs = defs
        self.active: list[str] = []  # $refs being spelt out: one inside itself is a cycle

    def target(self, ref: Any) -> Mapping[str, Any]:
        for prefix in ("#/$defs/", "#/definitions/"):
            if isinstance(ref, str) and ref.startswith(prefix):
                target = self.defs.get(pointer_token(ref[len(prefix) :]))
                if isinstance(target, Mapping):
                    return target
        raise NotStrict(f"$ref {ref} is not one of the schema's $defs")

    def flat(self, schema: Mapping[str, Any], spelt: list[str]) -> Mapping[str, Any]:
        """``schema`` as one node (a bare ``$ref`` stays); the $refs spelt out go to ``spelt``."""
        parts = schema.get("allOf")
        if (
            isinstance(parts, list)
            and len(parts) == 1
            and _bare_ref(parts[0])
            and ("$ref" not in schema)
        ):  # the same as the $ref, the keywords beside it on top
            schema = {k: v for k, v in schema.items() if k != "allOf"} | dict(parts[0])
        if "$ref" in schema and len(schema) > 1:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            if schema["$ref"] in self.active:
                if ASSERTING & rest.keys():
                    raise NotStrict(f"$ref {schema['$ref']} is spelt out inside itself")
                return {"$ref": schema["$ref"]}  # only annotations beside it: left out
            schema = self.merge(rest, self.spelt(schema["$ref"], spelt), spelt)
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list):
                raise NotStrict("allOf is not a list")
            merged: Mapping[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts:
                merged = self.merge(merged, self.part(part, spelt), spelt)
            schema = merged
        return self.distributed(schema, spelt)

    def part(self, schema: Any, spelt: list[str]) -> Mapping[str, Any]:
        """A schema to merge, as one node: a bare ``$ref`` spelt out too."""
        if schema is True:
            return {}
        if not isinstance(schema, Mapping):
            raise NotStrict("a part that admits nothing" if schema is False else "not a schema")
        if _bare_ref(schema):
            return self.spelt(schema["$ref"], spelt)
        return self.flat(schema, spelt)

    def spelt(self, ref: Any, spelt: list[str]) -> Mapping[str, Any]:
        if ref in self.active:
            raise NotStrict(f"$ref {ref} is spelt out inside itself")
        target = self.target(ref)
        self.active.append(ref)
        try:
            out = self.part(target, spelt)
        finally:
            self.active.pop()
        spelt.append(ref)
        return out

    def distributed(self, schema: Mapping[str, Any], spelt: list[str]) -> Mapping[str, Any]:
        """Keywords beside an anyOf/oneOf merged into each branch (A and (B or C) is
        (A and B) or (A and C)); annotations stay beside it."""
        keys = [k for k in ("anyOf", "oneOf") if k in schema]
        if len(keys) > 1:
            raise NotStrict("anyOf and oneOf side by side")
        if not keys:
            return schema
        key = keys[0]
        rest = {k: v for k, v in schema.items() if k in ASSERTING and k != key}
        if not rest:
            return schema
        if not isinstance(schema[key], list):
            raise NotStrict(f"{key} is not a list")
        out = {k: v for k, v in schema.items() if k not in rest}
        out[key] = []
        for branch in schema[key]:
            try:
                out[key].append(self.merge(rest, self.part(branch, spelt), spelt))
            except _Unsendable:
                continue  # a branch no strict call fits
        if not out[key]:
            raise _Unsendable(f"no branch of the {key} with the keywords beside it")
        return out

    def merge(
        self, a: Mapping[str, Any], b: Mapping[str, Any], spelt: list[str]
    ) -> Mapping[str, Any]:
        """One schema admitting what both admit, or NotStrict (``b`` is one node)."""
        if "$ref" in a or "$ref" in b:  # left by flat(): a $ref met again inside itself
            raise NotStrict("a $ref merged inside itself")
        names = set(_properties(a)) | set(_properties(b))
        closed = [one for one in (a, b) if _extra(one) is False]
        maps = [one for one in (a, b) if not isinstance(_extra(one), bool)]
        forbidden = set().union(*(names - set(_properties(one)) for one in closed))
        # members outside a map's properties would have to be values of the map too
        if any(names - set(_properties(one)) for one in maps) or (
            len(maps) == 2 and not _same(_extra(a), _extra(b))
        ):
            raise NotStrict("allOf of a map and members or a map it does not have")
        out = dict(a)
        for key, value in b.items():
            if key not in out:
                out[key] = value
            elif key in ASSERTING - {"additionalProperties"} and not _same(out[key], value):
                out[key] = self._both(key, out[key], value, spelt)
        if closed:
            out["additionalProperties"] = False
        if forbidden:  # members a closed part does not have: not allowed in the merge
            if forbidden & set(out.get("required") or ()):
                raise _Unsendable("allOf of a closed object and a member it does not have")
            out["properties"] = {k: v for k, v in _properties(out).items() if k not in forbidden}
        return self.flat(out, spelt) if "allOf" in out else self.distributed(out, spelt)

    def _both(self, key: str, x: Any, y: Any, spelt: list[str]) -> Any:
        """One value of ``key`` meaning both ``x`` and ``y``."""
        if key == "type":
            ys = _kinds(y)
            kinds: list[str] = []
            for kind in _kinds(x):
                if kind in ys:
                    kinds.append(kind)
                elif {kind, *ys} >= {"integer", "number"} and kind in ("integer", "number"):
                    kinds.append("integer")  # an integer is a number
            kinds = list(dict.fromkeys(kinds))
            if not kinds:
                raise _Unsendable("allOf of types with no value in common")
            return kinds[0] if len(kinds) == 1 else kinds
        if key == "required" and isinstance(x, list) and isinstance(y, list):
            return [*x, *(name for name in y if name not in x)]
        if key == "properties" and isinstance(x, Mapping) and isinstance(y, Mapping):
            both = dict(x)
            for name, sub in y.items():
                both[name] = self._schema(both[name], sub, spelt) if name in both else sub
            return both
        if key == "items":
            return self._schema(x, y, spelt)
        if key == "enum" and isinstance(x, list) and isinstance(y, list):
            common = [v for v in x if any(_same(v, w) for w in y)]
            if not common:
                raise _Unsendable("allOf of enums with no value in common")
            return common
        if _number(x) and _number(y) and key in LOWER | UPPER | {"multipleOf"}:
            if key in LOWER:
                return max(x, y)
            if key in UPPER:
                return min(x, y)
            high, low = max(x, y), min(x, y)
            if low > 0 and float(high / low).is_integer():
                return high
        if key == "uniqueItems" and isinstance(x, bool) and isinstance(y, bool):
            return x or y
        if key == "const":
            raise _Unsendable("allOf of two different const")
        raise NotStrict(f"allOf of two different {key}")

    def _schema(self, x: Any, y: Any, spelt: list[str]) -> Any:
        if _same(x, y):
            return x
        if x is True or x == {}:
            return y
        if y is True or y == {}:
            return x
        return self.merge(self.part(x, spelt), self.part(y, spelt), spelt)

    def allows_null(self, schema: Any) -> bool:
        """Whether the strict form of ``schema`` takes ``null`` as it is: a type, enum, const
        or branches that include it (a schema with none of them is not written nullable)."""
        if not isinstance(schema, Mapping):
            return False
        with contextlib.suppress(NotStrict):
            schema = self.part(schema, [])
        kinds = _kinds(schema.get("type"))
        variants = schema.get("anyOf", schema.get("oneOf"))
        tests = [
            "type" not in schema or "null" in kinds,
            "enum" not in schema or None in (schema["enum"] or ()),
            "const" not in schema or schema["const"] is None,
            not isinstance(variants, list) or any(self.allows_null(v) for v in variants),
        ]
        return all(tests) and bool({"type", "enum", "const", "anyOf", "oneOf"} & schema.keys())


class _Converter(_Schemas):
    def node(self, schema: Any, nullable: bool, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise NotStrict(f"nested deeper than {MAX_DEPTH} levels")
        if not isinstance(schema, Mapping) or not schema:
            raise NotStrict("a value of any type")
        if set(schema) == {"$ref"}:
            return self._ref(schema["$ref"], nullable)
        spelt: list[str] = []
        flat = self.flat(schema, spelt)
        mark = len(self.active)
        self.active += spelt  # a $ref spelt out here, met again inside it, is a cycle
        try:
            if set(flat) == {"$ref"}:
                return self._ref(flat["$ref"], nullable)
            return self._node(flat, nullable, depth)
        finally:
            del self.active[mark:]

    def _node(self, schema: Mapping[str, Any], nullable: bool, depth: int) -> dict[str, Any]:
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
            out["anyOf"] = []
            for variant in variants:
                try:
                    out["anyOf"].append(self.node(variant, False, depth + 1))
                except _Unsendable:
                    continue  # no strict call fits it: one branch fewer to choose from
            if not out["anyOf"]:
                raise _Unsendable("no branch of the anyOf/oneOf can be sent")
            if "oneOf" in schema:
                notes.append("exactly one of these")
        if _is_object(schema):
            self._object(schema, out, depth)
        if "array" in _kinds(schema.get("type")) or "items" in schema:
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
        if required - set(properties):
            raise _Unsendable("a required member that is not among its properties")
        out.setdefault("type", "object")
        out["properties"] = {
            name: self.node(sub, name not in required and not self.allows_null(sub), depth + 1)
            for name, sub in properties.items()
        }
        out["required"] = list(properties)
        out["additionalProperties"] = False

    def _ref(self, ref: Any, nullable: bool) -> dict[str, Any]:
        self.target(ref)  # an unresolvable ref is refused here, not by the vendor
        out: dict[str, Any] = {"$ref": ref}
        return {"anyOf": [out, {"type": "null"}]} if nullable else out


def _bare_ref(schema: Any) -> bool:
    return isinstance(schema, Mapping) and set(schema) == {"$ref"}


def _extra(schema: Mapping[str, Any]) -> Any:
    """additionalProperties: True (any member), False, or the schema of the other members."""
    extra = schema.get("additionalProperties", True)
    return True if extra == {} else extra


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    properties = schema.get("properties")
    return properties if isinstance(properties, Mapping) else {}


def _kinds(kind: Any) -> list[str]:
    return [kind] if isinstance(kind, str) else list(kind or ())


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(x: Any, y: Any) -> bool:
    return json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # True is not 1


def _is_object(schema: Mapping[str, Any]) -> bool:
    return "object" in _kinds(schema.get("type")) or "properties" in schema


def _nullable(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` or null: ``type: [X, "null"]`` (and None in its enum), else an anyOf."""
    if "type" in out and "const" not in out:
        kinds = _kinds(out["type"])
        if "null" not in kinds:
            out["type"] = [*kinds, "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        return out
    if "anyOf" in out and "const" not in out and "enum" not in out:
        if {"type": "null"} not in out["anyOf"]:
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
    added (an optional member whose schema does not take null) is dropped, as left out.

    The schema is read as the conversion reads it (allOf merged, $refs followed). Under an
    ``anyOf``/``oneOf`` the branch the call took is not known: a member's ``null`` is dropped
    when no branch that has the member takes null there."""
    root = schema or {}
    return _from_strict(_Schemas(_defs(root)), [root], value, 0)


def _from_strict(schemas: _Schemas, candidates: list[Any], value: Any, depth: int) -> Any:
    if depth > MAX_CALL_DEPTH or not isinstance(value, dict | list):
        return value
    nodes = _nodes(schemas, candidates)
    if isinstance(value, list):
        items = [node["items"] for node in nodes if isinstance(node.get("items"), Mapping)]
        return [_from_strict(schemas, items, item, depth + 1) for item in value]
    objects = [node for node in nodes if _properties(node)]
    out: dict[str, Any] = {}
    for name, member in value.items():
        having = [node for node in objects if name in _properties(node)]
        subs = [_properties(node)[name] for node in having]
        if (
            member is None
            and any(name not in (node.get("required") or ()) for node in having)
            and not any(schemas.allows_null(sub) for sub in subs)
        ):
            continue
        out[name] = _from_strict(schemas, subs, member, depth + 1)
    return out


def _nodes(schemas: _Schemas, candidates: list[Any]) -> list[Mapping[str, Any]]:
    """The candidates read as one node each, with the branches of their anyOf/oneOf (and of
    an allOf that cannot be merged, read as candidates too)."""
    found: list[Mapping[str, Any]] = []
    todo = list(candidates)
    for _ in range(256):
        if not todo:
            break
        node = todo.pop(0)
        if not isinstance(node, Mapping):
            continue
        try:
            node = schemas.part(node, [])
        except NotStrict:
            if set(node) == {"$ref"}:
                with contextlib.suppress(NotStrict):
                    todo.append(schemas.target(node["$ref"]))
                continue
            parts = node.get("allOf")
            todo.extend(parts if isinstance(parts, list) else [])
            if "$ref" in node:
                todo.append({"$ref": node["$ref"]})
        found.append(node)
        for key in ("anyOf", "oneOf"):
            branches = node.get(key)
            todo.extend(branches if isinstance(branches, list) else [])
    return found
