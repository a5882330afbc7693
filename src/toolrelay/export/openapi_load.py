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

__all__ = ["MAX_REF_DEPTH", "YAML_LOADER", "deref", "load_openapi", "pointer", "pointer_token"]

MAX_REF_DEPTH: Final = 64


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
    try:
        return yaml.load(text, Loader=YAML_LOADER)  # a safe loader (C or Python)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidArgument(f"{path}: not valid YAML or JSON{where}: {problem}") from None


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
