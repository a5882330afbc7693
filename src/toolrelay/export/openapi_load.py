"""Reading an OpenAPI document and resolving its local ``$ref`` pointers (the first stage of
``toolrelay import openapi``; openapi.py maps the operations)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

import yaml

from toolrelay.errors import InvalidArgument

__all__ = [
    "MAX_EXPANDED_VALUES",
    "MAX_REF_DEPTH",
    "YAML_LOADER",
    "deref",
    "load_openapi",
    "load_yaml",
    "pointer",
    "pointer_token",
]

MAX_REF_DEPTH: Final = 64
# What a YAML document may stand for once its aliases are followed: the largest OpenAPI
# document of the test corpus (GitHub's, 13 MB) holds ~260,000 values. An alias names a
# node instead of copying it, so nine lines of nested aliases stand for a billion values,
# and whatever walks the document afterwards (the import, json.dumps of a schema) hangs.
MAX_EXPANDED_VALUES: Final = 10_000_000


# libyaml when PyYAML was built with it: several times faster than the pure-Python loader.
YAML_LOADER: Final[type[yaml.SafeLoader]] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_openapi(path: Path) -> dict[str, Any]:
    """Read a YAML or JSON OpenAPI 3.x document; one clear error when it is not one.

    JSON (a ``.json`` file, or text starting with ``{``) is parsed as JSON: faster, and YAML
    refuses characters JSON allows in strings (SendGrid's ``#x009f``)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{path}: cannot read: {exc}") from None
    is_json_file = path.suffix.lower() == ".json"
    doc: Any = None
    if is_json_file or text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            if is_json_file:
                raise InvalidArgument(
                    f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
                ) from None
            doc = _yaml(path, text)  # a YAML flow mapping, perhaps
    else:
        doc = _yaml(path, text)
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{path}: not an OpenAPI document (expected a mapping at the top)")
    return doc


def _yaml(path: Path, text: str) -> Any:
    return load_yaml(text, str(path), "not valid YAML or JSON")


def load_yaml(text: str, where: str, invalid: str = "not valid YAML") -> Any:
    """YAML read with a safe loader, refused (errors start with ``where``) when it is not
    YAML, when an alias makes it contain itself, or when its aliases make it stand for more
    than MAX_EXPANDED_VALUES values."""
    try:
        doc = yaml.load(text, Loader=YAML_LOADER)  # a safe loader (C or Python)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidArgument(f"{where}: {invalid}{at}: {problem}") from None
    _check_aliases(doc, where)
    return doc


def _check_aliases(doc: Any, where: str) -> None:
    """Count the values ``doc`` stands for, each shared node once per place it appears, in
    time linear in the nodes actually loaded (a size per node, kept by identity)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # the nodes being counted: their own descendants meeting one is a cycle
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        node, counted = stack.pop()
        if not isinstance(node, dict | list):
            continue
        key = id(node)
        if not counted and key in sizes:
            continue
        children = list(node.values()) if isinstance(node, dict) else node
        if counted:
            size = 1 + sum(sizes.get(id(c), 1) for c in children)
            open_.discard(key)
            sizes[key] = size
            if size > MAX_EXPANDED_VALUES:
                raise InvalidArgument(
                    f"{where}: its YAML aliases make it stand for more than"
                    f" {MAX_EXPANDED_VALUES:,} values (an alias names a node instead of copying"
                    " it, and nested ones multiply): write the repeated parts out"
                )
            continue
        if key in open_:
            raise InvalidArgument(f"{where}: a YAML alias refers to a node that contains it")
        open_.add(key)
        stack.append((node, True))
        stack.extend(
            (c, False) for c in children if isinstance(c, dict | list) and id(c) not in sizes
        )


def pointer_token(raw: str) -> str:
    """One reference token of a ``$ref`` fragment: percent-decoded first (a fragment is a URI
    part, RFC 6901 §6 and RFC 3986), then ``~1`` and ``~0`` (RFC 6901 §4)."""
    return unquote(raw).replace("~1", "/").replace("~0", "~")


def pointer(doc: Mapping[str, Any], ref: str) -> Any:
    """What a local ``$ref`` (``#/...``) points at in the document."""
    if not ref.startswith("#/"):
        raise InvalidArgument(f"$ref {ref!r}: only local references ('#/...') are supported")
    node: Any = doc
    for raw in ref[2:].split("/"):
        part = pointer_token(raw)
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise InvalidArgument(f"$ref {ref!r} does not resolve")
    return node


def deref(doc: Mapping[str, Any], node: Any) -> Any:
    """Follow ``$ref`` chains (parameters, bodies, responses, schemes, schemas)."""
    seen: list[str] = []
    while isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
        ref = node["$ref"]
        if ref in seen or len(seen) > MAX_REF_DEPTH:
            raise InvalidArgument(f"$ref {ref!r} refers to itself")
        seen.append(ref)
        node = pointer(doc, ref)
    return node
