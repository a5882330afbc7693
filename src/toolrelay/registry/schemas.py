"""Owners' JSON Schemas, applied so that they are self-contained and run in linear time.

A tool's schemas are applied to agents' input (API, CLI, MCP, the worker's precheck) and to
upstream output (the worker, MCP). Wherever one is applied:

- **Nothing in it reaches the network or the filesystem.** References (``$ref``,
  ``$dynamicRef``, ``$recursiveRef``) resolve only inside the document, against a registry
  whose retrieval always refuses; the known metaschemas (jsonschema_specifications) are in
  memory. ``find_problem`` refuses a reference that leaves the document, naming the JSON
  Pointer of the keyword, when a tool is registered and again before a schema is compiled,
  so a schema stored past registration (plain SQL) is refused, never fetched.
- **Patterns run on RE2** (``pattern``, ``patternProperties`` and the properties they let
  through ``additionalProperties`` / ``unevaluatedProperties``, and the ``regex`` format):
  linear in the text whatever the pattern. A pattern RE2 cannot compile (backreferences,
  lookaround) is refused with its pointer.
- **The work is bounded by the value's size.** A schema a few kB long can branch without
  end (``anyOf`` of two references to the next level, 20 levels: a million evaluations of
  one number), and validation runs in the event loop every tenant shares (serve's, the
  worker's). Each keyword applied costs a step; a value may take ``STEPS_PER_NODE`` steps
  per array, object or scalar it holds, plus ``STEPS_BASE``; past that it is refused,
  saying the schema branches too much for it. ``uniqueItems`` and ``enum`` compare by
  hashing (JSON Schema's equality: 1 == 1.0, true != 1, keys unordered), linear where
  jsonschema compares every pair.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, NoReturn

import re2
import referencing.jsonschema
from jsonschema import FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

__all__ = [
    "DIALECTS",
    "REGISTRY",
    "PatternError",
    "Problem",
    "SchemaValidator",
    "compile_pattern",
    "compile_schema",
    "dialect",
    "find_problem",
    "schema_problem",
]

PATTERN_CACHE_SIZE: Final = 4096  # distinct compiled patterns kept per process
# A value's validation may apply this many keywords per node of it, plus the base (a
# schema's ordinary keywords take a handful per node; an anyOf of references to the next
# level doubles at each level).
STEPS_PER_NODE: Final = 64
STEPS_BASE: Final = 20_000
_STEPS: ContextVar[_Steps | None] = ContextVar("schema_steps", default=None)
OUTSIDE: Final = "only references inside the document ('#…') are allowed"
RE2_RULE: Final = "patterns run on RE2, in linear time: no backreferences, no lookaround"

# --- patterns: RE2 ------------------------------------------------------------------------

_RE2_OPTIONS: Final = re2.Options()
_RE2_OPTIONS.log_errors = False  # the reason goes into our error, not to stderr
# ECMA-262 (JSON Schema's dialect) and Python spell these differently from RE2. Matched
# only at a backslash, on the owner's pattern text: linear.
_UNICODE_ESCAPE: Final = re.compile(r"\\u(?:([0-9A-Fa-f]{4})|\{([0-9A-Fa-f]{1,6})\})")
_REASONS: Final = (
    (re.compile(r"invalid escape sequence: \\[1-9]"), "backreferences are not supported"),
    (
        re.compile(r"invalid perl operator: \(\?<?[=!]"),
        "lookahead and lookbehind are not supported",
    ),
    (re.compile(r"invalid repetition size"), "repetition counts above 1000 are not supported"),
    (re.compile(r"pattern too large"), "the pattern is too large"),
)


class PatternError(ValueError):
    """A pattern RE2 cannot run; ``reason`` says why, for a person."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"pattern {pattern!r} cannot be used: {reason}")
        self.pattern = pattern
        self.reason = reason


def _re2_syntax(pattern: str) -> str:
    """``\\uXXXX`` and ``\\u{X…}`` as ``\\x{…}``, Python's ``\\Z`` as ``\\z``; the rest as is."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] != "\\" or i + 1 == len(pattern):
            out.append(pattern[i])
            i += 1
            continue
        escape = _UNICODE_ESCAPE.match(pattern, i)
        if escape is not None:
            out.append(f"\\x{{{escape.group(1) or escape.group(2)}}}")
            i = escape.end()
        else:
            out.append("\\z" if pattern[i + 1] == "Z" else pattern[i : i + 2])
            i += 2
    return "".join(out)


def _reason(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else exc
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    for found, reason in _REASONS:
        if found.search(text):
            return f"{reason} (RE2: {text})"
    return f"RE2: {text}"


@lru_cache(maxsize=PATTERN_CACHE_SIZE)
def compile_pattern(pattern: str) -> Any:
    """The pattern compiled by RE2 (searched, as JSON Schema says); PatternError if it can't be."""
    try:
        return re2.compile(_re2_syntax(pattern), _RE2_OPTIONS)
    except re2.error as exc:
        raise PatternError(pattern, f"{_reason(exc)}; {RE2_RULE}") from None


# --- keywords whose stock implementations call Python's re ---------------------------------
# Signatures are jsonschema's: (validator, keyword value, instance, schema).


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not compile_pattern(patrn).search(instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = compile_pattern(pattern)
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _matches_a_pattern(schema: Mapping[str, Any]) -> Callable[[str], bool]:
    regexes = [compile_pattern(p) for p in schema.get("patternProperties", {})]
    return lambda key: any(regex.search(key) for regex in regexes)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    """jsonschema's, with the properties patternProperties lets through matched by RE2."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    matched = _matches_a_pattern(schema)
    extras = {key for key in instance if key not in properties and not matched(key)}
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            listed = ", ".join(repr(each) for each in sorted(extras, key=str))
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({listed} {verb} unexpected)"
            )


def _no_errors(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _evaluated_keys(validator: Any, instance: Any, schema: Any, draft2019: bool) -> list[str]:
    """jsonschema's find_evaluated_property_keys_by_schema (2020-12, and 2019-09 when
    ``draft2019``), with patternProperties matched by RE2. Uses the validator's resolver as
    jsonschema's own keywords do."""
    if validator.is_type(schema, "boolean"):
        return []
    keys: list[str] = []

    def follow(resolved: Any) -> list[str]:
        inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
        return _evaluated_keys(inner, instance, resolved.contents, draft2019)

    if schema.get("$ref") is not None:
        keys += follow(validator._resolver.lookup(schema["$ref"]))
    if draft2019 and "$recursiveRef" in schema:
        keys += follow(referencing.jsonschema.lookup_recursive_ref(validator._resolver))
    if not draft2019 and schema.get("$dynamicRef") is not None:
        keys += follow(validator._resolver.lookup(schema["$dynamicRef"]))
    if draft2019:
        for keyword in ("properties", "additionalProperties", "unevaluatedProperties"):
            value = schema.get(keyword)
            if validator.is_type(value, "boolean") and value:
                keys += instance.keys()
            elif validator.is_type(value, "object"):
                keys += [key for key in value if key in instance]
    else:
        properties = schema.get("properties")
        if validator.is_type(properties, "object"):
            keys += properties.keys() & instance.keys()
        for keyword in ("additionalProperties", "unevaluatedProperties"):
            subschema = schema.get(keyword)
            if subschema is not None:
                keys += [
                    k for k, v in instance.items() if _no_errors(validator.descend(v, subschema))
                ]
    for regex in (compile_pattern(p) for p in schema.get("patternProperties", {})):
        keys += [key for key in instance if regex.search(key)]
    for key, subschema in schema.get("dependentSchemas", {}).items():
        if key in instance:
            keys += _evaluated_keys(validator, instance, subschema, draft2019)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if _no_errors(validator.descend(instance, subschema)):
                keys += _evaluated_keys(validator, instance, subschema, draft2019)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys += _evaluated_keys(validator, instance, schema["if"], draft2019)
            if "then" in schema:
                keys += _evaluated_keys(validator, instance, schema["then"], draft2019)
        elif "else" in schema:
            keys += _evaluated_keys(validator, instance, schema["else"], draft2019)
    return keys


def _unevaluated(draft2019: bool) -> Callable[..., Iterator[ValidationError]]:
    def unevaluated_properties(
        validator: Any, unevaluated: Any, instance: Any, schema: Any
    ) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        evaluated = _evaluated_keys(validator, instance, schema, draft2019)
        bad = [
            key
            for key in instance
            if key not in evaluated
            and not _no_errors(
                validator.descend(instance[key], unevaluated, path=key, schema_path=key)
            )
        ]
        if not bad:
            return
        verb = "was" if len(bad) == 1 else "were"
        if unevaluated is False:
            listed = ", ".join(repr(each) for each in sorted(bad, key=str))
            yield ValidationError(
                f"Unevaluated properties are not allowed ({listed} {verb} unexpected)"
            )
        else:
            listed = ", ".join(repr(each) for each in bad)
            yield ValidationError(
                "Unevaluated properties are not valid under the given schema"
                f" ({listed} {verb} unevaluated and invalid)"
            )

    return unevaluated_properties


def _is_pattern(instance: object) -> bool:
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


# --- the dialects -------------------------------------------------------------------------

DRAFTS: Final = (
    validators.Draft3Validator,
    validators.Draft4Validator,
    validators.Draft6Validator,
    validators.Draft7Validator,
    validators.Draft201909Validator,
    validators.Draft202012Validator,
)
DEFAULT_DRAFT: Final = validators.Draft202012Validator  # no $schema: jsonschema's latest


def _meta_id(draft: Any) -> str:
    return str(draft.ID_OF(draft.META_SCHEMA)).rstrip("#")


# $schema values accepted, without their empty fragment: the drafts jsonschema ships.
DIALECTS: Final[Mapping[str, Any]] = {_meta_id(d): d for d in DRAFTS}


def _format_checker(draft: Any) -> FormatChecker:
    """The draft's formats, with ``regex`` meaning "RE2 compiles it"."""
    checker = FormatChecker(formats=())
    checker.checkers = dict(draft.FORMAT_CHECKER.checkers)
    checker.checkers["regex"] = (_is_pattern, PatternError)
    return checker


# --- the work a value may take -------------------------------------------------------------


class TooMuchWork(Exception):
    """The schema took more steps on this value than its size allows."""


class _Steps:
    """The steps one validation has left. The value's size is counted only once the base
    is spent: an ordinary value never is, and pays no walk."""

    __slots__ = ("grown", "left", "nodes", "value")

    def __init__(self, value: Any) -> None:
        self.value, self.left, self.grown, self.nodes = value, STEPS_BASE, False, 0

    @property
    def allowed(self) -> int:
        return STEPS_BASE + STEPS_PER_NODE * self.nodes

    def spend(self) -> None:
        self.left -= 1
        if self.left >= 0:
            return
        if self.grown:
            raise TooMuchWork
        self.grown, self.nodes = True, _nodes(self.value)
        self.left += STEPS_PER_NODE * self.nodes


def _counted(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def applied(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        steps = _STEPS.get()
        if steps is not None:
            steps.spend()
        return keyword(validator, value, instance, schema)

    return applied


def _nodes(value: Any) -> int:
    """Arrays, objects and scalars in a JSON value (walked without recursion)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _canonical(value: Any) -> Any:
    """A hashable form equal for values JSON Schema calls equal (1 == 1.0, true != 1, an
    object's keys in any order). Values are bounded in depth before they are validated."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    return (type(value).__name__, value)


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


_ENUMS: dict[int, tuple[Any, frozenset[Any]]] = {}  # id(enum list): (the list, its forms)


def _enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    kept = _ENUMS.get(id(enums))
    if kept is None or kept[0] is not enums:
        if len(_ENUMS) >= PATTERN_CACHE_SIZE:
            _ENUMS.clear()
        kept = (enums, frozenset(_canonical(e) for e in enums))
        _ENUMS[id(enums)] = kept
    if _canonical(instance) not in kept[1]:
        yield ValidationError(f"{instance!r} is not one of {enums!r}")


def _safe_class(draft: Any) -> Any:
    overrides: dict[str, Callable[..., Iterator[ValidationError]]] = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    }
    if "unevaluatedProperties" in draft.VALIDATORS:
        overrides["unevaluatedProperties"] = _unevaluated(draft is validators.Draft201909Validator)
    if "uniqueItems" in draft.VALIDATORS:
        overrides["uniqueItems"] = _unique_items
    if "enum" in draft.VALIDATORS:
        overrides["enum"] = _enum
    overrides = {
        name: _counted(overrides.get(name, keyword)) for name, keyword in draft.VALIDATORS.items()
    }
    # No ``version``: the class is not registered with jsonschema, whose validator_for keeps
    # answering its stock classes to everyone else in the process.
    safe = validators.extend(draft, overrides, format_checker=_format_checker(draft))
    safe.__name__ = safe.__qualname__ = f"SelfContained{draft.__name__}"
    return safe


_SAFE_CLASSES: Final = {draft: _safe_class(draft) for draft in DRAFTS}


def _refuse(uri: str) -> NoReturn:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


# What compiled schemas resolve against: their own document and the metaschemas, in memory.
_REFUSING: Final[Registry[Any]] = Registry(retrieve=_refuse)  # type: ignore[call-arg]
REGISTRY: Final[Registry[Any]] = SPECIFICATIONS.combine(_REFUSING)


def dialect(schema: Mapping[str, Any]) -> Any:
    """The stock jsonschema class of the schema's draft (its ``$schema``, else 2020-12).
    Call it only on a schema find_problem accepted."""
    raw = schema.get("$schema")
    return DIALECTS[raw.rstrip("#")] if isinstance(raw, str) else DEFAULT_DRAFT


def without_dialect(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema as compiled: the root ``$schema`` was read once (``dialect``). Left in,
    jsonschema would switch back to its stock class (Python ``re``) whenever a reference
    re-enters the root."""
    return {k: v for k, v in schema.items() if k != "$schema"}


# --- the static check ---------------------------------------------------------------------

# Where jsonschema (any draft) descends into a subschema; the union, so at least as much
# is checked as any draft applies.
_ONE: Final = frozenset(
    {
        "additionalItems", "additionalProperties", "contains", "contentSchema", "else",
        "extends", "if", "items", "not", "propertyNames", "then", "unevaluatedItems",
        "unevaluatedProperties",
    }
)  # fmt: skip
_LIST: Final = frozenset(
    {"allOf", "anyOf", "oneOf", "prefixItems", "items", "extends", "type", "disallow"}
)
_MAP: Final = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)
_REFERENCES: Final = ("$ref", "$dynamicRef")
_NAMES: Final = ("$anchor", "$dynamicAnchor")


@dataclass(frozen=True)
class Problem:
    """Why a schema cannot be used: ``pointer`` is the JSON Pointer of the keyword."""

    pointer: str
    message: str

    def describe(self, where: str) -> str:
        return f"{where} at {self.pointer or '(root)'}: {self.message}"


def _token(segment: object) -> str:
    return str(segment).replace("~", "~0").replace("/", "~1")


def _locations(document: Any) -> dict[int, str]:
    """The JSON Pointer of every object and array in the document, by identity."""
    found: dict[int, str] = {}
    stack: list[tuple[Any, str]] = [(document, "")]
    while stack:
        node, pointer = stack.pop()
        if isinstance(node, Mapping):
            items: Iterable[tuple[object, Any]] = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        found.setdefault(id(node), pointer)
        stack.extend((child, f"{pointer}/{_token(key)}") for key, child in items)
    return found


def _children(node: Mapping[str, Any], pointer: str) -> Iterator[tuple[Any, str]]:
    for keyword, value in node.items():
        at = f"{pointer}/{_token(keyword)}"
        if keyword in _ONE and isinstance(value, Mapping | bool):
            yield value, at
        if keyword in _LIST and isinstance(value, list):
            yield from ((item, f"{at}/{i}") for i, item in enumerate(value))
        if keyword in _MAP and isinstance(value, Mapping):
            yield from ((item, f"{at}/{_token(k)}") for k, item in value.items())


class _Walk:
    """Every subschema, and every subschema a reference reaches, resolved as jsonschema
    would resolve it (``referencing``, the draft's rules for ``$id``), against a registry
    holding only the document: a reference that would need anything else is refused."""

    def __init__(self, draft: Any, document: Mapping[str, Any]) -> None:
        self.spec = referencing.jsonschema.specification_with(_meta_id(draft))
        self.id_keyword = "id" if draft in DRAFTS[:2] else "$id"
        self.retrieved: list[str] = []
        self.locations = _locations(document)
        self.seen: set[int] = set()
        self.document = document
        self.registry: Registry[Any] = Registry(retrieve=self._retrieve)  # type: ignore[call-arg]

    def _retrieve(self, uri: str) -> NoReturn:
        self.retrieved.append(uri)
        raise NoSuchResource(ref=uri)  # type: ignore[call-arg]

    def run(self) -> Problem | None:
        # First what needs no resolving, wherever a keyword applies: resolving crawls those
        # places and relies on their identifiers being strings.
        stack: list[tuple[Any, str]] = [(self.document, "")]
        while stack:
            node, pointer = stack.pop()
            if isinstance(node, Mapping):
                problem = self._node(node, pointer)
                if problem is not None:
                    return problem
                stack += reversed(list(_children(node, pointer)))
        return self._resolve()

    def _node(self, node: Mapping[str, Any], pointer: str) -> Problem | None:
        if pointer and "$schema" in node:
            return Problem(f"{pointer}/$schema", "$schema is only allowed at the root")
        return self._identifiers(node, pointer) or self._patterns(node, pointer)

    def _resolve(self) -> Problem | None:
        root = self.registry.resolver_with_root(self.spec.create_resource(self.document))
        # (schema, pointer, resolver, whether the resolver is already the schema's own)
        stack: list[tuple[Any, str, Any, bool]] = [(self.document, "", root, True)]
        while stack:
            node, pointer, resolver, own = stack.pop()
            if not isinstance(node, Mapping) or id(node) in self.seen:
                continue  # booleans; anything else is for the metaschema check to name
            self.seen.add(id(node))
            problem = self._node(node, pointer)  # again: a reference may lead off the keywords
            if problem is not None:
                return problem
            if not own:
                try:
                    resolver = resolver.in_subresource(self.spec.create_resource(node))
                except ValueError:
                    ident = node.get(self.id_keyword)
                    return Problem(
                        f"{pointer}/{self.id_keyword}", f"{ident!r} is not a URI reference"
                    )
            targets: list[tuple[Any, str, Any, bool]] = []
            for keyword in (*_REFERENCES, "$recursiveRef"):
                if keyword in node:
                    found = self._follow(keyword, node[keyword], f"{pointer}/{keyword}", resolver)
                    if isinstance(found, Problem):
                        return found
                    targets += found
            children = [(child, at, resolver, False) for child, at in _children(node, pointer)]
            stack += reversed(children + targets)
        return None

    def _identifiers(self, node: Mapping[str, Any], pointer: str) -> Problem | None:
        for keyword in (self.id_keyword, *_NAMES):
            if keyword in node and not isinstance(node[keyword], str):
                return Problem(f"{pointer}/{keyword}", "must be a string")
        return None

    def _patterns(self, node: Mapping[str, Any], pointer: str) -> Problem | None:
        found: list[tuple[Any, str]] = [(node.get("pattern"), f"{pointer}/pattern")]
        pattern_properties = node.get("patternProperties")
        if isinstance(pattern_properties, Mapping):
            at = f"{pointer}/patternProperties"
            found += [(key, f"{at}/{_token(key)}") for key in pattern_properties]
        for pattern, at in found:
            if not isinstance(pattern, str):
                continue
            try:
                compile_pattern(pattern)
            except PatternError as exc:
                return Problem(at, str(exc))
        return None

    def _follow(
        self, keyword: str, ref: Any, pointer: str, resolver: Any
    ) -> Problem | list[tuple[Any, str, Any, bool]]:
        if not isinstance(ref, str):
            return Problem(pointer, f"must be a string; {OUTSIDE}")
        if keyword == "$recursiveRef" and ref != "#":
            return Problem(pointer, f"{keyword} {ref!r}: only '#' is allowed")
        self.retrieved.clear()
        try:
            resolved = resolver.lookup(ref)
        except Exception:  # Unresolvable, or a reference or document referencing cannot parse
            if self.retrieved:
                uri = self.retrieved[0]
                shown = repr(ref) if uri in (ref, ref.split("#")[0]) else f"{ref!r} ({uri})"
                return Problem(pointer, f"reference {shown} is outside the schema; {OUTSIDE}")
            return Problem(pointer, f"reference {ref!r} does not resolve inside the schema")
        target = resolved.contents
        if isinstance(target, bool):
            return []
        if not isinstance(target, Mapping):
            return Problem(pointer, f"reference {ref!r} does not point at a schema")
        at = self.locations.get(id(target), pointer)
        return [(target, at, resolved.resolver, True)]


def find_problem(schema: Any) -> Problem | None:
    """What makes ``schema`` reach outside itself or run a pattern RE2 cannot: the first
    such keyword, or None. Structure (types, required members) is the metaschema's check."""
    if not isinstance(schema, Mapping):
        return Problem("", "must be a JSON object")
    if "$schema" in schema:
        raw = schema["$schema"]
        if not isinstance(raw, str) or raw.rstrip("#") not in DIALECTS:
            known = ", ".join(f"'{uri}'" for uri in DIALECTS)
            return Problem("/$schema", f"unknown $schema {raw!r}; known drafts: {known}")
    draft = dialect(schema)
    try:
        return _Walk(draft, without_dialect(schema)).run()
    except RecursionError:
        return Problem("", "is nested too deeply")


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be used, as the end of a sentence that starts with its name
    (``schema_input at /properties/x/$ref: reference …``), or None."""
    if not isinstance(schema, Mapping):
        return "must be a JSON object"
    problem = find_problem(schema)
    if problem is not None:
        return f"at {problem.pointer or '(root)'}: {problem.message}"
    draft = dialect(schema)
    try:
        return _metaschema_problem(draft, schema)
    except RecursionError:
        return "is nested too deeply"


# Drafts whose metaschema checks each ``$defs`` and ``properties`` member as a schema of its
# own (through ``$dynamicRef``/``$recursiveRef`` to the same metaschema).
_SPLIT_DRAFTS: Final = (validators.Draft201909Validator, validators.Draft202012Validator)
_SPLIT_KEYWORDS: Final = ("$defs", "properties")
SPLIT_CHECK_CACHE_SIZE: Final = 16384  # distinct schema parts whose verdict is kept


def _metaschema_problem(draft: Any, schema: Mapping[str, Any]) -> str | None:
    """The metaschema check, one part at a time and each part's verdict remembered: the
    tools imported from one API share their component and parameter schemas, which would
    otherwise be checked again inside every tool (34 s for GitHub's). The same verdict: the
    metaschema checks each ``$defs``/``properties`` member on its own, and ``true``, its
    stand-in in the part above, is a valid schema."""
    split = draft in _SPLIT_DRAFTS
    found = _split_check(draft, schema) if split else _check_schema(draft, schema)
    if found is None:
        return None
    path = "/".join(str(p) for p in found[0]) or "(root)"
    return f"is not a valid JSON Schema at {path}: {found[1]}"


def _split_check(draft: Any, schema: Any) -> tuple[list[Any], str] | None:
    shell = dict(schema) if isinstance(schema, Mapping) else schema
    parts: list[tuple[str, str, Any]] = []
    for keyword in _SPLIT_KEYWORDS if isinstance(schema, Mapping) else ():
        members = schema.get(keyword)
        if isinstance(members, Mapping) and members:
            shell[keyword] = dict.fromkeys(members, True)
            parts += [(keyword, name, member) for name, member in members.items()]
    try:
        found = _part_problem(draft, json.dumps(shell, sort_keys=True))
    except (TypeError, ValueError):  # not JSON (a YAML date, say): checked, not remembered
        found = _check_schema(draft, shell)
    if found is not None:
        return found
    for keyword, name, member in parts:
        found = _split_check(draft, member)
        if found is not None:
            return [keyword, name, *found[0]], found[1]
    return None


@lru_cache(maxsize=SPLIT_CHECK_CACHE_SIZE)
def _part_problem(draft: Any, part_json: str) -> tuple[list[Any], str] | None:
    return _check_schema(draft, json.loads(part_json))


def _check_schema(draft: Any, schema: Any) -> tuple[list[Any], str] | None:
    """Where and why the schema fails its draft's metaschema, with its ``regex`` format
    meaning what patterns run on; None when it passes."""
    try:
        draft.check_schema(schema, format_checker=_SAFE_CLASSES[draft].FORMAT_CHECKER)
    except SchemaError as exc:
        return list(exc.path), exc.message
    return None


class SchemaValidator:
    """A compiled schema: the part of jsonschema's Validator interface toolrelay uses.

    ``refusal`` is set when the schema cannot be used (``schema_problem``); every value is
    then invalid, with that reason, and nothing is resolved, fetched or matched.
    """

    __slots__ = ("_compiled", "refusal", "schema")

    def __init__(self, schema: Any, compiled: Any, refusal: str | None) -> None:
        self.schema = schema
        self.refusal = refusal
        self._compiled = compiled

    def iter_errors(self, instance: Any) -> Iterator[ValidationError]:
        if self.refusal is not None:
            yield _refused(instance, f"the tool's schema {self.refusal}")
            return
        # Materialized: an exception part way makes the errors before it meaningless.
        steps = _Steps(instance)
        budget = _STEPS.set(steps)
        try:
            errors = list(self._compiled.iter_errors(instance))
        except TooMuchWork:
            errors = [
                _refused(
                    instance,
                    f"the tool's schema branches too much for this value: it took more than"
                    f" {steps.allowed:,} steps ({STEPS_PER_NODE} for each of its"
                    f" {steps.nodes:,} parts, plus {STEPS_BASE:,}); the tool's schema must be"
                    " simplified",
                )
            ]
        except Unresolvable as exc:  # not expected past schema_problem; never a fetch
            ref = getattr(exc, "ref", "?")
            errors = [_refused(instance, f"the tool's schema: reference {ref!r} does not resolve")]
        except PatternError as exc:  # likewise
            errors = [_refused(instance, f"the tool's schema: {exc}")]
        except RecursionError:
            errors = [_refused(instance, "the tool's schema refers to itself without end here")]
        finally:
            _STEPS.reset(budget)
        yield from errors

    def is_valid(self, instance: Any) -> bool:
        return next(self.iter_errors(instance), None) is None

    def validate(self, instance: Any) -> None:
        error = best_match(self.iter_errors(instance))
        if error is not None:
            raise error


def _refused(instance: Any, message: str) -> ValidationError:
    return ValidationError(message, validator="$schema", instance=instance, schema={})


def compile_schema(schema: Any) -> SchemaValidator:
    """A validator that never fetches and matches patterns with RE2; a schema that cannot
    be used gives one that says so for every value."""
    problem = schema_problem(schema)
    if problem is not None:
        return SchemaValidator(schema, None, problem)
    draft = dialect(schema)
    compiled = _SAFE_CLASSES[draft](without_dialect(schema), registry=REGISTRY)
    return SchemaValidator(schema, compiled, None)
