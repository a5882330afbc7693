"""How an operation's request becomes a tool's input and request template (the middle
stage of ``toolrelay import openapi``: openapi_load.py reads and resolves, openapi.py maps
each operation and checks its tool): parameters to URL, query and header members, the
request body to body members or the input member ``body``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

from toolrelay.errors import InvalidArgument
from toolrelay.export.openapi_auth import Auth
from toolrelay.export.openapi_load import deref as _deref
from toolrelay.export.openapi_schemas import Schemas

__all__ = ["BODY_MEMBER", "Input", "RequestMapper", "Skip", "is_json", "text"]

IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
IGNORED_HEADERS: Final = frozenset({"accept", "content-type", "authorization"})
FORBIDDEN_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})
BODY_MEMBER: Final = "body"
HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token


class Skip(Exception):
    """This operation cannot be expressed as a tool; the message says why."""


@dataclass
class Input:
    """The schema_input being built and the request template members that use it."""

    properties: dict[str, Any] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)  # input member -> what it came from
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    warnings: list[str] = field(default_factory=list)

    def add(self, member: str, schema: Any, required: bool, origin: str) -> None:
        if member in self.properties:
            raise InvalidArgument(
                f"{origin} and {self.origin[member]} both become the input member {member!r}"
            )
        self.properties[member] = schema
        self.origin[member] = origin
        if required:
            self.required.append(member)


class RequestMapper:
    """Parameters and request body of an operation, as input members and a template."""

    doc: Mapping[str, Any]

    def _parameters(
        self,
        path: str,
        item: Mapping[str, Any],
        op: Mapping[str, Any],
        schemas: Schemas,
        inputs: Input,
        auth: Auth,
    ) -> str:
        """Fill ``inputs`` from the parameters; return the path with its placeholders.

        A path key's part from ``#`` (Box's ``/files/{id}#add_shared_link``) is a fragment,
        never sent: the URL path is what comes before it."""
        merged: dict[tuple[str, str], Mapping[str, Any]] = {}
        for source in (item.get("parameters") or [], op.get("parameters") or []):
            if not isinstance(source, list):
                raise InvalidArgument("parameters must be a list")
            for raw in source:
                param = _deref(self.doc, raw)
                if not isinstance(param, Mapping) or not isinstance(param.get("name"), str):
                    raise InvalidArgument("a parameter has no name")
                if param.get("in") not in ("path", "query", "header", "cookie"):
                    raise InvalidArgument(
                        f"parameter {param['name']!r}: 'in' must be path, query, header or cookie"
                    )
                merged[(param["name"], param["in"])] = param  # the operation's win
        url_path = path.split("#", 1)[0]
        declared = set(re.findall(r"\{([^{}]+)\}", url_path))
        path_members = {_input_name(name) for name, where in merged if where == "path"}
        other_keys = self._other_credentials(op, auth)
        for (name, where), param in merged.items():
            origin = f"{where} parameter {name!r}"
            required = where == "path" or param.get("required") is True
            if where == "header" and name.lower() in IGNORED_HEADERS:
                continue  # OpenAPI: such header parameters are ignored
            if auth.method != "none" and (where, name.lower()) == (
                auth.placement,
                (auth.name or "").lower(),
            ):
                continue  # it carries the credential, which toolrelay places
            raw = self._raw_parameter_schema(param)
            if where != "cookie" and raw is not None:
                narrowed = _scalar_forms(self.doc, raw)
                if narrowed is not raw:
                    inputs.warnings.append(
                        f"{origin}: its array or object forms dropped (a {where} value is a"
                        " string, number or boolean)"
                    )
                    raw = narrowed
            problem = self._inexpressible(name, where, raw)
            if problem is None and (where, name.lower()) in other_keys:
                problem = (
                    f"carries the credential of security scheme {other_keys[(where, name.lower())]!r}"
                    " too, and toolrelay places one credential per tool"
                    f" ({auth.placement} {auth.name!r})"
                )
            if problem is not None:
                if required:
                    raise Skip(f"{origin} {problem}")
                inputs.warnings.append(f"optional {origin} dropped: it {problem}")
                continue
            member = _input_name(name)
            if where in ("query", "header") and member in path_members:
                member = f"{where}_{member}"  # Kubernetes' path and ?path=, SendGrid's list_id
            inputs.add(member, self._parameter_schema(param, raw, schemas), required, origin)
            placeholder = "{{input." + member + "}}"
            if where == "path":
                if name not in declared:
                    raise InvalidArgument(f"{origin} is not in the path")
                url_path = url_path.replace("{" + name + "}", _styled(name, param, placeholder))
            elif where == "query":
                inputs.query[name] = placeholder
            else:
                inputs.headers[name] = placeholder
        missing = declared - {name for name, where in merged if where == "path"}
        if missing:
            raise InvalidArgument(f"path parameter(s) {sorted(missing)} are not declared")
        return url_path

    def _other_credentials(self, op: Mapping[str, Any], auth: Auth) -> dict[tuple[str, str], str]:
        """(in, lower-cased name) -> scheme, for the apiKey schemes the operation accepts
        that are not the one toolrelay places (Trello: ``key`` or ``token``, both needed)."""
        requirements = op.get("security", self.doc.get("security"))
        schemes = (self.doc.get("components") or {}).get("securitySchemes") or {}
        found: dict[tuple[str, str], str] = {}
        if not isinstance(requirements, list) or not isinstance(schemes, Mapping):
            return found
        for requirement in requirements:
            for scheme_name in requirement if isinstance(requirement, Mapping) else ():
                try:
                    scheme = _deref(self.doc, schemes.get(scheme_name))
                except InvalidArgument:
                    continue
                if not isinstance(scheme, Mapping) or scheme.get("type") != "apiKey":
                    continue
                where, name = scheme.get("in"), scheme.get("name")
                if not isinstance(where, str) or not isinstance(name, str):
                    continue
                placed = auth.method != "none" and (auth.placement, (auth.name or "").lower())
                if (where, name.lower()) != placed:
                    found[(where, name.lower())] = str(scheme_name)
        return found

    def _raw_parameter_schema(self, param: Mapping[str, Any]) -> Any:
        raw = param.get("schema")
        content = param.get("content")
        if raw is None and isinstance(content, Mapping) and content:
            media = _deref(self.doc, next(iter(content.values())))
            raw = media.get("schema") if isinstance(media, Mapping) else None
        return raw

    def _parameter_schema(self, param: Mapping[str, Any], raw: Any, schemas: Schemas) -> Any:
        schema = schemas.convert(raw) if raw is not None else {"type": "string"}
        if isinstance(schema, dict):
            schema = dict(schema)
            description = text(param.get("description"))
            if description and "description" not in schema:
                schema["description"] = description
        return schema

    def _inexpressible(self, name: str, where: str, raw: Any) -> str | None:
        """Why a parameter cannot be sent by a request template, or None when it can."""
        if where == "cookie":
            return "is a cookie (toolrelay does not send cookies)"
        if where == "header" and not HEADER_NAME.fullmatch(name):
            return "is not a valid HTTP header name"
        if _structured(self.doc, raw):
            return f"is an array or object (a {where} value must be a string, number or boolean)"
        if where == "header" and name.lower() in FORBIDDEN_HEADERS:
            return "is a header the HTTP client sets"
        return None

    def _body(self, op: Mapping[str, Any], schemas: Schemas, inputs: Input) -> None:
        body = _deref(self.doc, op.get("requestBody"))
        if body is None:
            return
        if not isinstance(body, Mapping) or not isinstance(body.get("content"), Mapping):
            raise InvalidArgument("requestBody has no content")
        content = body["content"]
        required = body.get("required") is True
        media_type = self._json_media_type(content, required, inputs)
        if media_type is None:
            return  # an optional body that declares nothing: not sent
        media = _deref(self.doc, content[media_type])
        raw = media.get("schema") if isinstance(media, Mapping) else None
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

    def _json_media_type(
        self, content: Mapping[str, Any], required: bool, inputs: Input
    ) -> str | None:
        """The media type whose schema the JSON body follows: ``application/json``, else
        ``*/*`` or ``application/*`` with a schema (Kubernetes: any type, JSON included).
        toolrelay sends JSON bodies as ``application/json``, so a body of other JSON types
        only (``application/merge-patch+json``) is skipped, and so is a non-JSON one; an
        optional body that declares nothing (Stripe's GETs: a form with no properties) is
        left out with a warning. None: no body."""
        types = [t for t in content if isinstance(t, str)]
        plain = [t for t in types if _base(t) == "application/json"]
        if plain:
            return plain[0]
        for media_type in types:
            if _base(media_type) in ("*/*", "application/*") and self._has_schema(
                content[media_type]
            ):
                return media_type
        listed = ", ".join(map(str, content))
        if not required and all(self._declares_nothing(content[t]) for t in types):
            inputs.warnings.append(
                f"its optional request body ({listed}) declares nothing: not sent"
            )
            return None
        if any(is_json(t) for t in types):
            raise Skip(
                f"its request body is {listed}: toolrelay sends JSON bodies as"
                " application/json (a declared Content-Type is not supported yet)"
            )
        if any(_base(t) in ("*/*", "application/*") for t in types):
            raise Skip(f"its request body is {listed} with no schema: what to send is not said")
        raise Skip(f"its request body is {listed}, not JSON")

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
        quiet = {"type", "properties", "additionalProperties", "description", "title", "example"}
        return (
            not schema.get("properties")
            and schema.get("additionalProperties") in (None, False)
            and not set(schema) - quiet
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
        if not kept or any(not IDENT.fullmatch(name) or name in inputs.properties for name in kept):
            return None
        converted = {name: schemas.convert(schema) for name, schema in kept.items()}
        return converted, required & set(kept)

    def _read_only(self, schema: Any) -> bool:
        """``readOnly: true``, on the schema itself (beside a ``$ref``) or where it points."""
        if isinstance(schema, Mapping) and schema.get("readOnly") is True:
            return True
        target = _deref(self.doc, schema)
        return isinstance(target, Mapping) and target.get("readOnly") is True


def _base(media_type: str) -> str:
    return media_type.split(";", 1)[0].strip().lower()


def is_json(media_type: str) -> bool:
    base = _base(media_type)
    return base == "application/json" or base.endswith("+json")


def _styled(name: str, param: Mapping[str, Any], placeholder: str) -> str:
    """A path parameter's placeholder with its style's prefix: ``label`` ``.value``,
    ``matrix`` ``;name=value`` (RFC 6570); ``simple``, the default, the value alone."""
    style = param.get("style", "simple")
    if style == "label":
        return "." + placeholder
    if style == "matrix":
        return f";{quote(name, safe='')}=" + placeholder
    return placeholder


def _input_name(name: str) -> str:
    """A template-safe input member name for a parameter (``filter[id]`` → ``filter_id_``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    return cleaned if IDENT.fullmatch(cleaned) else f"_{cleaned}"


def text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _structured(doc: Mapping[str, Any], raw: Any) -> bool:
    """An array or object schema (every branch of a ``oneOf``/``anyOf`` one)."""
    schema = _deref(doc, raw)
    if not isinstance(schema, Mapping):
        return False
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return all(_structured(doc, branch) for branch in branches)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return bool({"array", "object"} & set(kinds)) or "items" in schema or "properties" in schema


def _scalar_forms(doc: Mapping[str, Any], raw: Any) -> Any:
    """A ``oneOf``/``anyOf`` of scalar and array/object forms narrowed to the scalar ones
    (Stripe's ``created``: a timestamp, or a range object), which a URL or header can
    carry; any other schema as it is."""
    schema = _deref(doc, raw)
    if not isinstance(schema, Mapping):
        return raw
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and any(_structured(doc, b) for b in branches):
            scalar = [b for b in branches if not _structured(doc, b)]
            if scalar:
                return {k: v for k, v in schema.items() if k != key} | {key: scalar}
    return raw


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
