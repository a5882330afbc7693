"""How an operation's request body becomes input members and the template's body, and
which media types the call sends and asks for (part of ``toolrelay import openapi``'s
middle stage, beside openapi_request.py's parameters).

The body's media type, in this order of preference (the first the operation declares):
``application/json``; ``application/merge-patch+json``; any other ``+json`` type;
``*/*`` or ``application/*`` with a schema (Kubernetes: JSON among any); then
``application/x-www-form-urlencoded`` and ``multipart/form-data``. A type other than
``application/json`` is set as the template's ``Content-Type``, which decides the bytes the
dispatcher sends (dispatch/bodies.py). A form's fields are top-level input members, as a
JSON object's properties are; a field toolrelay cannot send (a file, an array encoded
``spaceDelimited``/``pipeDelimited`` or unexploded) is dropped with a warning when optional
and skips the operation when required.

``Accept`` is the media types the success responses declare: their JSON types when there
is one, else every type they name; nothing when they name none or ``*/*``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from toolrelay.errors import InvalidArgument
from toolrelay.export.openapi_load import deref as _deref
from toolrelay.export.openapi_schemas import Schemas

if TYPE_CHECKING:
    from toolrelay.export.openapi_request import Input

__all__ = [
    "BODY_MEMBER", "IDENT", "BodyMapper", "Skip", "accept_header", "is_json", "success_contents",
]  # fmt: skip

BODY_MEMBER: Final = "body"
JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
FORM: Final = "application/x-www-form-urlencoded"
MULTIPART: Final = "multipart/form-data"
ANY: Final = frozenset({"*/*", "application/*"})
IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # an input member name as it is
# Keywords an object schema may carry and still say nothing about what to send.
QUIET: Final = frozenset(
    {"type", "properties", "additionalProperties", "description", "title", "example"}
)


class Skip(Exception):
    """This operation cannot be expressed as a tool; the message says why."""


class BodyMapper:
    """The request body of an operation, as input members, a template body and headers."""

    doc: Mapping[str, Any]

    def _body(self, op: Mapping[str, Any], schemas: Schemas, inputs: Input) -> None:
        body = _deref(self.doc, op.get("requestBody"))
        if body is None:
            return
        if not isinstance(body, Mapping) or not isinstance(body.get("content"), Mapping):
            raise InvalidArgument("requestBody has no content")
        content = body["content"]
        required = body.get("required") is True
        chosen = self._media_type(content, required, inputs)
        if chosen is None:
            return  # an optional body that declares nothing: not sent
        media_type, kind = chosen
        if _base(media_type) not in (JSON, *ANY):
            inputs.headers["Content-Type"] = media_type  # it decides the bytes sent
        media = _deref(self.doc, content[media_type])
        media = media if isinstance(media, Mapping) else {}
        raw = media.get("schema")
        if kind != "json":
            self._form_body(media_type, kind, media, required, schemas, inputs)
            return
        flat = self._flat_body(raw, schemas, inputs) if raw is not None else None
        if flat is None:
            schema = schemas.top_level(schemas.convert(raw)) if raw is not None else {}
            inputs.add(BODY_MEMBER, schema, required, "the request body")
            inputs.body = "{{input." + BODY_MEMBER + "}}"
            return
        properties, members = flat
        inputs.body = {}
        for name, schema in properties.items():
            inputs.add(name, schema, required and name in members, f"body property {name!r}")
            inputs.body[name] = "{{input." + name + "}}"

    def _media_type(
        self, content: Mapping[str, Any], required: bool, inputs: Input
    ) -> tuple[str, str] | None:
        """(media type, "json" | "form" | "multipart") of the body sent; None: no body. An
        optional body that declares nothing (Stripe's GETs: a form with no properties) is
        left out with a warning; a body of no type toolrelay sends skips the operation."""
        types = [t for t in content if isinstance(t, str)]

        def first(test: Callable[[str], bool]) -> str | None:
            return next((t for t in types if test(t)), None)

        for media_type in (
            first(lambda t: _base(t) == JSON),
            first(lambda t: _base(t) == MERGE_PATCH),
            first(is_json),
            first(lambda t: _base(t) in ANY and self._has_schema(content[t])),
        ):
            if media_type is not None:
                return media_type, "json"
        listed = ", ".join(map(str, content))
        if not required and all(self._declares_nothing(content[t]) for t in types):
            inputs.warnings.append(
                f"its optional request body ({listed}) declares nothing: not sent"
            )
            return None
        form = first(lambda t: _base(t) == FORM)
        if form is not None:
            return form, "form"
        multipart = first(lambda t: _base(t) == MULTIPART)
        if multipart is not None:
            return multipart, "multipart"
        if any(_base(t) in ANY for t in types):
            raise Skip(f"its request body is {listed} with no schema: what to send is not said")
        raise Skip(f"its request body is {listed}, not JSON or a form")

    def _form_body(
        self,
        media_type: str,
        kind: str,
        media: Mapping[str, Any],
        required: bool,
        schemas: Schemas,
        inputs: Input,
    ) -> None:
        """A form's fields as input members (the body member ``body`` when a field's name
        cannot be one); each field toolrelay cannot send dropped or the operation skipped."""
        parts = _object_parts(self.doc, media.get("schema"))
        if parts is None:
            raise Skip(f"its {media_type} body's schema is not an object of fields")
        properties, needed = parts
        encoding = media.get("encoding")
        encoding = encoding if isinstance(encoding, Mapping) else {}
        kept: dict[str, Any] = {}
        for name, schema in properties.items():
            if self._read_only(schema):
                continue
            problem = self._unsendable(schema, kind, encoding.get(name))
            if problem is None:
                kept[name] = schemas.convert(schema)
            elif name in needed:
                raise Skip(f"its {media_type} body's required field {name!r} {problem}")
            else:
                inputs.warnings.append(f"optional {kind} field {name!r} dropped: it {problem}")
        if not kept:
            raise Skip(f"its {media_type} body has no field toolrelay can send")
        needed &= set(kept)
        if kind == "form":
            nested = sorted(n for n in kept if self._nested(properties[n], encoding.get(n)))
            if nested:
                inputs.warnings.append(
                    f"form field(s) {', '.join(map(repr, nested))} sent in brackets"
                    " (deepObject style: card[number]=…), as the document does not say"
                )
        if all(_ident(n) and n not in inputs.properties for n in kept):
            inputs.body = {}
            for name, schema in kept.items():
                inputs.add(name, schema, required and name in needed, f"{kind} field {name!r}")
                inputs.body[name] = "{{input." + name + "}}"
            return
        whole: dict[str, Any] = {"type": "object", "properties": kept}
        if needed:
            whole["required"] = sorted(needed)
        inputs.add(BODY_MEMBER, whole, required, "the request body")
        inputs.body = "{{input." + BODY_MEMBER + "}}"

    def _unsendable(self, raw: Any, kind: str, encoding: Any) -> str | None:
        """Why a form field cannot be sent as toolrelay encodes forms, or None."""
        if self._is_file(raw) or (
            isinstance(encoding, Mapping)
            and isinstance(encoding.get("contentType"), str)
            and not _textual(encoding["contentType"])
        ):
            return "is a file upload (toolrelay sends text fields, not files)"
        if kind != "form" or not isinstance(encoding, Mapping):
            return None  # multipart ignores style and explode (OpenAPI's Encoding Object)
        style, explode = encoding.get("style", "form"), encoding.get("explode")
        schema = _deref(self.doc, raw)
        structured = isinstance(schema, Mapping) and (
            schema.get("type") in ("array", "object") or "items" in schema
        )
        if style in ("spaceDelimited", "pipeDelimited") or (structured and explode is False):
            return (
                f"is encoded {style}{' unexploded' if explode is False else ''}, which"
                " toolrelay's forms do not produce (an array repeats its key)"
            )
        return None

    def _nested(self, raw: Any, encoding: Any) -> bool:
        """An object field whose encoding does not declare deepObject."""
        schema = _deref(self.doc, raw)
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            return False
        return not (isinstance(encoding, Mapping) and encoding.get("style") == "deepObject")

    def _is_file(self, raw: Any) -> bool:
        """A binary string (3.0's ``format: binary``, 3.1's ``contentMediaType`` without a
        text encoding), or an array of them."""
        schema = _deref(self.doc, raw)
        if not isinstance(schema, Mapping):
            return False
        if schema.get("type") == "array" or "items" in schema:
            return self._is_file(schema.get("items"))
        if schema.get("format") == "binary":
            return True
        media = schema.get("contentMediaType")
        return isinstance(media, str) and "contentEncoding" not in schema and not _textual(media)

    def _has_schema(self, media: Any) -> bool:
        """A media type with a schema that says something and is not binary."""
        media = _deref(self.doc, media)
        schema = _deref(self.doc, media.get("schema")) if isinstance(media, Mapping) else None
        if not isinstance(schema, Mapping) or not schema:
            return False
        return not (schema.get("type") == "string" and schema.get("format") in ("binary", "byte"))

    def _declares_nothing(self, media: Any) -> bool:
        """No schema, or an object schema without properties (nor anything else to send)."""
        media = _deref(self.doc, media)
        schema = _deref(self.doc, media.get("schema")) if isinstance(media, Mapping) else None
        if schema is None:
            return True
        if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
            return False
        return (
            not schema.get("properties")
            and schema.get("additionalProperties") in (None, False)
            and not set(schema) - QUIET
        )

    def _flat_body(
        self, raw: Any, schemas: Schemas, inputs: Input
    ) -> tuple[dict[str, Any], set[str]] | None:
        """An object body's properties and required names, when they can be input members."""
        parts = _object_parts(self.doc, raw)
        if parts is None:
            return None
        properties, required = parts
        kept = {name: schema for name, schema in properties.items() if not self._read_only(schema)}
        if not kept or any(not _ident(name) or name in inputs.properties for name in kept):
            return None
        converted = {name: schemas.convert(schema) for name, schema in kept.items()}
        return converted, required & set(kept)

    def _read_only(self, schema: Any) -> bool:
        """``readOnly: true``, on the schema itself (beside a ``$ref``) or where it points."""
        if isinstance(schema, Mapping) and schema.get("readOnly") is True:
            return True
        target = _deref(self.doc, schema)
        return isinstance(target, Mapping) and target.get("readOnly") is True


def success_contents(doc: Mapping[str, Any], op: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The content maps of an operation's 2xx responses, by status code (YAML may key them
    by integer)."""
    responses = op.get("responses")
    if not isinstance(responses, Mapping):
        return
    for code in sorted(str(c) for c in responses):
        if not (code.startswith("2") and len(code) == 3):
            continue
        key: int | str = int(code) if code.isdigit() else code  # "2XX" stays text
        response = _deref(doc, responses.get(code, responses.get(key)))
        content = response.get("content") if isinstance(response, Mapping) else None
        if isinstance(content, Mapping):
            yield content


def accept_header(doc: Mapping[str, Any], op: Mapping[str, Any]) -> str | None:
    """``Accept`` for the call: the success responses' JSON media types (parameters left
    out: Kubernetes' ``;stream=watch`` is another resource), else every type they name;
    None when they name none, or any type (``*/*``)."""
    named = [
        _base(t)
        for content in success_contents(doc, op)
        for t in content
        if isinstance(t, str) and ";" not in t
    ]
    if not named or any(t in ANY or "*" in t for t in named):
        return None
    chosen = [t for t in named if is_json(t)] or named
    ordered = sorted(dict.fromkeys(chosen), key=lambda t: t != JSON)  # application/json first
    return ", ".join(ordered)


def _base(media_type: str) -> str:
    return media_type.split(";", 1)[0].strip().lower()


def is_json(media_type: str) -> bool:
    base = _base(media_type)
    return base == JSON or base.endswith("+json")


def _textual(media_type: str) -> bool:
    base = _base(media_type)
    return base.startswith("text/") or is_json(base)


def _ident(name: str) -> bool:
    return IDENT.fullmatch(name) is not None


def _object_parts(doc: Mapping[str, Any], raw: Any) -> tuple[dict[str, Any], set[str]] | None:
    """Properties and required names of an object schema (``allOf`` of objects merged)."""
    schema = _deref(doc, raw)
    if not isinstance(schema, Mapping) or any(k in schema for k in ("oneOf", "anyOf", "not")):
        return None
    if schema.get("type", "object") != "object" or schema.get("nullable") is True:
        return None
    properties: dict[str, Any] = dict(schema.get("properties") or {})
    required = {r for r in schema.get("required") or [] if isinstance(r, str)}
    for part in schema.get("allOf") or []:
        parts = _object_parts(doc, part)
        if parts is None:
            return None
        properties |= parts[0]
        required |= parts[1]
    return (properties, required) if properties else None
