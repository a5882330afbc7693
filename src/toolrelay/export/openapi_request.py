"""How an operation's parameters become a tool's input and request template (the middle
stage of ``toolrelay import openapi``: openapi_load.py reads and resolves, openapi.py maps
each operation and checks its tool): parameters to URL, query and header members;
openapi_body.py maps the request body."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

from toolrelay.errors import InvalidArgument
from toolrelay.export.openapi_auth import Auth
from toolrelay.export.openapi_body import IDENT, BodyMapper, Skip
from toolrelay.export.openapi_load import deref as _deref
from toolrelay.export.openapi_schemas import Schemas

__all__ = ["Input", "RequestMapper", "text"]

IGNORED_HEADERS: Final = frozenset({"accept", "content-type", "authorization"})
FORBIDDEN_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})
SPELLED: Final = {
    "<": "lt", ">": "gt", "=": "eq", "!": "not", ".": "dot", "[": "", "]": "", " ": "",
    "$": "dollar", "@": "at", "*": "star", "+": "plus", ":": "colon", "/": "slash",
}  # fmt: skip
HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token


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


class RequestMapper(BodyMapper):
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
        names = _member_names([name for name, _ in merged])
        path_members = {names[name] for name, where in merged if where == "path"}
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
            member = names[name]
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


def _styled(name: str, param: Mapping[str, Any], placeholder: str) -> str:
    """A path parameter's placeholder with its style's prefix: ``label`` ``.value``,
    ``matrix`` ``;name=value`` (RFC 6570); ``simple``, the default, the value alone."""
    style = param.get("style", "simple")
    if style == "label":
        return "." + placeholder
    if style == "matrix":
        return f";{quote(name, safe='')}=" + placeholder
    return placeholder


def _member_names(names: list[str]) -> dict[str, str]:
    """Each parameter name's input member: ``_input_name``, or, for names that would share
    one (Twilio's ``StartTime>`` and ``StartTime<``), ``_spelled``."""
    plain = Counter(_input_name(name) for name in set(names))
    return {
        name: _spelled(name) if plain[_input_name(name)] > 1 else _input_name(name)
        for name in names
    }


def _spelled(name: str) -> str:
    """An input member name with each character outside ``[A-Za-z0-9_-]`` spelled out
    (``StartTime>`` → ``StartTime_gt``, ``a.b`` → ``a_dot_b``; others by code point)."""
    out = ""
    for here, after in zip(name, [*name[1:], ""], strict=True):
        if re.fullmatch(r"[A-Za-z0-9_-]", here):
            out += here
            continue
        word = SPELLED.get(here, f"u{ord(here):04x}")
        out += f"_{word}" + ("_" if word and re.fullmatch(r"[A-Za-z0-9]", after) else "")
    return out if IDENT.fullmatch(out) else f"_{out}"


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
