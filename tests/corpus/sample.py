"""A sample instance of a JSON Schema (2020-12, the converted schemas tools store), for the
corpus test: deterministic for a seed, valid where it can be (the caller validates it), and
awkward where it may be: strings without a format or pattern carry characters a URL must
percent-encode (``/``, space, ``?``, ``&``, ``#``, ``%``, non-ASCII), so a path or query
parameter that is not encoded shows.

Not a general generator: ``not``, ``if``/``then``, ``dependentRequired`` and the like are
ignored; ``oneOf``/``anyOf`` take the first branch whose sample validates.
"""

from __future__ import annotations

import random
import re
import re._parser as sre_parse
from collections.abc import Mapping
from typing import Any, Final

from jsonschema import Draft202012Validator

from toolrelay.errors import InvalidInput
from toolrelay.export.openapi_load import pointer_token
from toolrelay.registry.validation import validate_input

__all__ = ["NoSample", "Sampler", "sample_input"]

AWKWARD: Final = "a b/c?d&e=f#g%h é"  # a string value that must be percent-encoded in a URL
FORMATS: Final = {
    "date-time": "2024-01-02T03:04:05Z",
    "date": "2024-01-02",
    "time": "03:04:05Z",
    "email": "someone@example.com",
    "idn-email": "someone@example.com",
    "uri": "https://example.com/a?b=c",
    "url": "https://example.com/a",
    "uri-reference": "/a/b",
    "iri": "https://example.com/a",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "hostname": "example.com",
    "byte": "aGVsbG8=",
    "duration": "P1D",
    "int32": "7",
    "int64": "7",
}
MAX_DEPTH: Final = 6  # optional members are left out below this depth
OPTIONAL_DEPTH: Final = 2  # optional members are included above this depth
MAX_BRANCHES: Final = 8


class NoSample(Exception):
    """No instance could be made (``false``, a required cycle, an unreadable pattern)."""


class Sampler:
    def __init__(self, root: Mapping[str, Any], seed: str) -> None:
        self.root = root
        self.defs: Mapping[str, Any] = root.get("$defs") or {}
        self.rng = random.Random(seed)
        self.dropped: list[str] = []  # optional top-level members no instance was found for

    def valid(self, schema: Any, value: Any) -> bool:
        wrapped = dict(schema) if isinstance(schema, Mapping) else {"allOf": [schema]}
        if self.defs:
            wrapped["$defs"] = self.defs
        try:
            return Draft202012Validator(wrapped).is_valid(value)
        except Exception:  # an unreadable pattern, a bad $ref: not a valid sample then
            return False

    def value(self, schema: Any, depth: int = 0) -> Any:
        if schema is True or schema == {}:
            return AWKWARD
        if schema is False or depth > MAX_DEPTH * 3:
            raise NoSample("a schema that admits nothing, or nested too deeply")
        if not isinstance(schema, Mapping):
            raise NoSample(f"not a schema: {schema!r}")
        schema = self._resolved(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            choices = [v for v in schema["enum"] if v is not None] or schema["enum"]
            return choices[0]
        for example in _examples(schema):
            if self.valid(schema, example):
                return example
        for key in ("oneOf", "anyOf"):
            if isinstance(schema.get(key), list):
                return self._branch(schema, key, depth)
        kind = _kind(schema)
        make = getattr(self, f"_{kind}", None)
        if make is None:
            raise NoSample(f"type {kind!r}")
        return make(schema, depth)

    def _resolved(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        """``$ref`` (with its siblings) and ``allOf`` merged into one schema."""
        seen: set[str] = set()
        while isinstance(schema.get("$ref"), str):
            ref = schema["$ref"]
            if ref in seen or not ref.startswith("#/$defs/"):
                raise NoSample(f"$ref {ref}")
            seen.add(ref)
            target = self.defs.get(pointer_token(ref[len("#/$defs/") :]))
            if not isinstance(target, Mapping):
                raise NoSample(f"$ref {ref}")
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = _merge(target, rest)
        parts = schema.get("allOf")
        if isinstance(parts, list) and parts:
            merged: Mapping[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts:
                if isinstance(part, Mapping):
                    merged = _merge(merged, self._resolved(part))
            return merged
        return schema

    def _branch(self, schema: Mapping[str, Any], key: str, depth: int) -> Any:
        rest = {k: v for k, v in schema.items() if k != key}
        branches = list(schema[key])[:MAX_BRANCHES]
        last: Exception = NoSample(f"no {key} branch")
        for branch in branches:
            try:
                candidate = self.value(
                    _merge(rest, self._resolved(branch) if isinstance(branch, Mapping) else {}),
                    depth + 1,
                )
            except NoSample as exc:
                last = exc
                continue
            if self.valid(schema, candidate):
                return candidate
        raise NoSample(str(last))

    def _string(self, schema: Mapping[str, Any], depth: int) -> str:
        fmt = schema.get("format")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            text = regex_sample(pattern, self.rng)
        elif isinstance(fmt, str) and fmt in FORMATS:
            text = FORMATS[fmt]
        else:
            text = AWKWARD
        low, high = schema.get("minLength"), schema.get("maxLength")
        if isinstance(low, int) and len(text) < low:
            text += "x" * (low - len(text))
        if isinstance(high, int) and len(text) > high:
            text = text[:high]
        return text

    def _integer(self, schema: Mapping[str, Any], depth: int) -> int:
        return int(self._number(schema, depth, integer=True))

    def _number(self, schema: Mapping[str, Any], depth: int, integer: bool = False) -> float:
        low = _bound(schema, "minimum", "exclusiveMinimum", +1)
        high = _bound(schema, "maximum", "exclusiveMaximum", -1)
        value: float = 7 if integer else 7.5
        if low is not None and value < low:
            value = low
        if high is not None and value > high:
            value = high
        step = schema.get("multipleOf")
        if isinstance(step, int | float) and step > 0:
            value = step * max(1, int(value // step)) if value > 0 else step * int(value // step)
        return value

    def _boolean(self, schema: Mapping[str, Any], depth: int) -> bool:
        return True

    def _null(self, schema: Mapping[str, Any], depth: int) -> None:
        return None

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list):
            return [self.value(item, depth + 1) for item in prefix]
        items = schema.get("items", True)
        count = max(1, schema.get("minItems") or 0) if depth < MAX_DEPTH else 0
        if isinstance(schema.get("minItems"), int):
            count = max(count, schema["minItems"])
        values = [self.value(items, depth + 1) for _ in range(count)]
        if schema.get("uniqueItems") and len(values) > 1:
            values = [v if i == 0 else _vary(v, i) for i, v in enumerate(values)]
        return values

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties") or {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        out: dict[str, Any] = {}
        for name, sub in properties.items():
            if name in required or depth < OPTIONAL_DEPTH:
                skippable = isinstance(sub, Mapping) and (
                    sub.get("readOnly") or sub.get("deprecated")
                )
                if skippable and name not in required:
                    continue
                try:
                    out[name] = self.value(sub, depth + 1)
                except NoSample:
                    if name in required:
                        raise
                    if depth == 0:
                        self.dropped.append(name)
        for name in required:
            if name not in out:
                extra = schema.get("additionalProperties", True)
                out[name] = self.value(extra if isinstance(extra, Mapping) else True, depth + 1)
        return out


def _examples(schema: Mapping[str, Any]) -> list[Any]:
    """Values the schema offers for a string with a pattern or format (tried first)."""
    if _kind(schema) != "string" or not ("pattern" in schema or "format" in schema):
        return []
    found = list(schema.get("examples") or [])
    if "default" in schema:
        found.append(schema["default"])
    return found


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or ["null"]
        kind = kinds[0]
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "multipleOf")):
        return "number"
    return "string"


def _merge(base: Mapping[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in more.items():
        if key == "properties" and isinstance(merged.get(key), Mapping):
            both = {
                k: {"allOf": [merged[key][k], v]} if k in merged[key] else v
                for k, v in value.items()
            }
            merged[key] = {**merged[key], **both}
        elif key == "required" and isinstance(merged.get(key), list):
            merged[key] = [*merged[key], *(r for r in value if r not in merged[key])]
        else:
            merged[key] = value
    return merged


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str, side: int) -> float | None:
    if isinstance(schema.get(exclusive), int | float) and not isinstance(
        schema.get(exclusive), bool
    ):
        return float(schema[exclusive]) + side
    value = schema.get(inclusive)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _vary(value: Any, index: int) -> Any:
    if isinstance(value, str):
        return f"{value}{index}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value + index
    return value


# --- a string matching a regular expression -------------------------------------------------

_CLASS_SAMPLES: Final = {
    sre_parse.CATEGORY_DIGIT: "7",
    sre_parse.CATEGORY_NOT_DIGIT: "a",
    sre_parse.CATEGORY_WORD: "a",
    sre_parse.CATEGORY_NOT_WORD: "-",
    sre_parse.CATEGORY_SPACE: " ",
    sre_parse.CATEGORY_NOT_SPACE: "a",
}


def regex_sample(pattern: str, rng: random.Random) -> str:
    """A string ``re.search(pattern)`` finds (the shortest repetitions, first branches)."""
    try:
        parsed = sre_parse.parse(pattern)
        text = _emit(parsed, rng)
    except (re.error, NoSample, RecursionError, OverflowError) as exc:
        raise NoSample(f"pattern {pattern!r}: {exc}") from None
    if re.search(pattern, text) is None:
        raise NoSample(f"pattern {pattern!r}")
    return text


def _emit(parsed: Any, rng: random.Random) -> str:
    out: list[str] = []
    for op, arg in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "NOT_LITERAL":
            out.append("a" if chr(arg) != "a" else "b")
        elif name == "ANY":
            out.append("a")
        elif name == "IN":
            out.append(_in(arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            count = max(low, 1) if high else 0
            count = min(count, high) if isinstance(high, int) else count
            out.extend(_emit(sub, rng) for _ in range(count))
        elif name == "SUBPATTERN":
            out.append(_emit(arg[-1], rng))
        elif name == "ATOMIC_GROUP":
            out.append(_emit(arg, rng))
        elif name == "BRANCH":
            out.append(_emit(arg[1][0], rng))
        elif name in ("AT", "ASSERT", "ASSERT_NOT", "GROUPREF"):
            continue
        else:
            raise NoSample(f"regex {name}")
    return "".join(out)


def _in(items: Any) -> str:
    negate = False
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif negate:
            continue
        elif name == "LITERAL":
            return chr(arg)
        elif name == "RANGE":
            return chr(arg[0])
        elif name == "CATEGORY":
            return _CLASS_SAMPLES.get(arg, "a")
    if negate:
        excluded = "".join(_members(items))
        for candidate in "aZ7-_ x":
            if candidate not in excluded:
                return candidate
    raise NoSample("an empty character class")


def _members(items: Any) -> list[str]:
    out: list[str] = []
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "RANGE":
            out.extend(chr(c) for c in range(arg[0], min(arg[1], arg[0] + 256) + 1))
        elif name == "CATEGORY":
            out.append(_CLASS_SAMPLES.get(arg, ""))
    return out


def sample_input(schema: Mapping[str, Any], seed: str) -> dict[str, Any] | None:
    """An input valid for ``schema`` (optional members it could not make dropped), or None."""
    sampler = Sampler(schema, seed)
    try:
        value = sampler.value(schema)
    except NoSample:
        return None
    if not isinstance(value, dict) or sampler.dropped:
        return None
    for _ in range(len(value) + 1):
        try:
            validate_input(schema, value)
            return value
        except InvalidInput as exc:
            member = exc.message.removeprefix("input.").split(".")[0].split("[")[0].split(":")[0]
            if member not in value or member in (schema.get("required") or []):
                return None
            del value[member]
    return None
