"""OpenAPI 3.x operations as toolrelay tools (``toolrelay import openapi``).

The stages: openapi_load.py reads the document and resolves ``$ref``; openapi_schemas.py
converts schemas (component schemas once per document and direction: readOnly properties
left out of inputs, writeOnly ones out of outputs); openapi_auth.py places credentials;
openapi_request.py maps an operation's parameters and request body to input members and a
request template; this module maps each operation to a tool and checks it as registering
will. Each operation becomes one tool (docs/interop.md
has the full mapping):

- key: ``operationId`` (or ``<method>_<path slug>``), after the optional key prefix;
  name: ``summary``; description: ``description`` (else the summary); category: first tag.
- endpoint_url: the first server URL (operation, path or document level, variables at their
  defaults) + the path before any ``#``, each ``{param}`` a ``{{input.<param>}}``
  placeholder (``.`` or ``;name=`` before it for the label and matrix styles).
- query and header parameters: ``request_template.query`` / ``.headers`` members holding
  whole-value placeholders, so optional ones left out of the input are omitted.
- a request body (openapi_body.py): JSON of any JSON type, an urlencoded or multipart form
  (text fields; files are not sent). An object's properties or a form's fields become
  top-level input members (read-only ones left out) and ``request_template.body`` is built
  from them; any other body is the input member ``body``. A type other than
  ``application/json`` is the template's ``Content-Type``; ``Accept`` names the success
  responses' (JSON) types.
- schema_input: every parameter and body member, with ``required``, and
  ``additionalProperties: false``; referenced component schemas go under ``$defs``.
  OpenAPI 3.0's ``nullable`` and boolean ``exclusiveMinimum``/``exclusiveMaximum`` become
  JSON Schema 2020-12. schema_output: the first 2xx JSON response's schema (past 64 KiB,
  only the component schemas nearest its root).
- egress_class ``write`` for any method but GET and for ``x-openai-isConsequential: true``,
  else ``read_only``.
- security: the first requirement toolrelay can place: an apiKey in a header or the query,
  HTTP bearer (``Authorization``, prefix ``Bearer ``), HTTP basic (auth method ``basic``), or
  OAuth 2 / OpenID Connect (auth method ``oauth``, bearer too); an empty requirement means
  none. With a credential's kind,
  the first scheme that kind fits; ``auth`` (``--auth``) where the document declares none
  (openapi_auth.py). ``server`` (``--server``): the base where servers are absent or relative.

A document that is not OpenAPI 3.x, or has no importable operation, is refused with one error.
An operation that is broken (a ``$ref`` that does not resolve, no absolute server URL, a key
another operation has, two parameters that become one input member, a ``?`` in its path, ...)
is skipped with the reason, or refuses the whole document with ``strict``. Operations
toolrelay cannot express (a body neither JSON nor a form, a required file, a cookie
parameter, an array in the path or query, a parameter carrying a second credential,
HEAD/OPTIONS/TRACE, a security scheme it cannot place) are skipped, each with the reason,
and optional parameters or form fields it cannot express are dropped with a warning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urljoin
from uuid import UUID

from toolrelay.dispatch.template import validate_template
from toolrelay.errors import InvalidArgument, TemplateError
from toolrelay.export.openapi_auth import Auth as _Auth
from toolrelay.export.openapi_auth import fitting, parse_auth
from toolrelay.export.openapi_auth import placeable as _placeable
from toolrelay.export.openapi_body import BODY_MEMBER, accept_header, is_json, success_contents
from toolrelay.export.openapi_body import Skip as _Skip
from toolrelay.export.openapi_load import deref as _deref
from toolrelay.export.openapi_load import load_openapi
from toolrelay.export.openapi_request import Input as _Input
from toolrelay.export.openapi_request import RequestMapper
from toolrelay.export.openapi_request import text as _text
from toolrelay.export.openapi_schemas import Schemas as _Schemas
from toolrelay.registry.models import ToolSpec
from toolrelay.registry.validation import check_json_schema

__all__ = ["ImportPlan", "load_openapi", "parse_auth", "plan_openapi", "tools_from_openapi"]

METHODS: Final = ("get", "put", "post", "delete", "patch")
UNSUPPORTED_METHODS: Final = ("head", "options", "trace")
KEY_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MAX_REASONS_SHOWN: Final = 5  # in the error for a document with nothing importable
# A response schema larger than this (JSON characters) keeps only the component schemas near
# its root (openapi_schemas.Schemas.with_defs): MCP lists tools in pages of ~512 KiB.
OUTPUT_SCHEMA_BUDGET: Final = 64 * 1024


@dataclass
class ImportPlan:
    """What an OpenAPI document gives: the tools, and what could not be imported."""

    tools: list[ToolSpec] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "<METHOD> <path>: <why>"
    warnings: list[str] = field(default_factory=list)


def tools_from_openapi(
    doc: Mapping[str, Any],
    *,
    credential_ref: UUID | None = None,
    key_prefix: str = "",
    strict: bool = False,
    server: str | None = None,
    auth: str | None = None,
    credential_kind: str | None = None,
) -> ImportPlan:
    """The tools an OpenAPI 3.x document describes; raises InvalidArgument if it is broken.

    An operation that cannot be mapped (a ``$ref`` that does not resolve, a name clash, a
    schema that is not valid, ...) is skipped with the reason, unless ``strict``: then the
    whole document is refused. A document with no importable operation is always refused.

    ``server`` is the base URL where the document has no server or a relative one; ``auth``
    (``parse_auth``) how to place the credential where the document declares no security;
    ``credential_kind`` picks, among the schemes an operation accepts, one that kind fits.
    """
    plan = plan_openapi(
        doc,
        credential_ref=credential_ref,
        key_prefix=key_prefix,
        strict=strict,
        server=server,
        auth=auth,
        credential_kind=credential_kind,
    )
    if not plan.tools:
        shown = plan.skipped[:MAX_REASONS_SHOWN]
        more = len(plan.skipped) - len(shown)
        reasons = "; ".join(shown) + (f"; and {more} more" if more else "") or "no operations"
        raise InvalidArgument(f"the document has no operation toolrelay can import ({reasons})")
    if credential_ref is not None and all(spec.credential_ref is None for spec in plan.tools):
        plan.warnings.append(
            "--credential is used by no tool: no operation declares a security scheme it fits"
            " (state one with --auth when the document declares none)"
        )
    return plan


def plan_openapi(
    doc: Mapping[str, Any],
    *,
    credential_ref: UUID | None = None,
    key_prefix: str = "",
    strict: bool = False,
    server: str | None = None,
    auth: str | None = None,
    credential_kind: str | None = None,
) -> ImportPlan:
    """``tools_from_openapi`` without refusing a document that has nothing importable: every
    operation is a tool or a skip with its reason (the corpus test reads both)."""
    version = doc.get("openapi")
    if "swagger" in doc:
        raise InvalidArgument("Swagger 2.0 is not supported: convert the document to OpenAPI 3")
    if not isinstance(version, str) or not version.startswith("3."):
        raise InvalidArgument(f"not an OpenAPI 3.x document (openapi: {version!r})")
    paths = doc.get("paths")
    if not isinstance(paths, Mapping) or not paths:
        raise InvalidArgument("the document has no paths")
    if server is not None and not re.match(r"https?://[^/?#]+", server, re.IGNORECASE):
        raise InvalidArgument(f"--server {server!r} is not an absolute http(s) URL")
    stated = parse_auth(auth) if auth is not None else None
    importer = _Importer(doc, credential_ref, key_prefix, server, stated, credential_kind)
    plan = ImportPlan()
    seen: dict[str, str] = {}
    for path, method, where in importer.operations(paths):
        try:
            spec, warnings = importer.tool(path, method)
            if spec.key in seen:
                raise InvalidArgument(f"{where}: tool key {spec.key!r} is also {seen[spec.key]}'s")
            _check(spec, where)
        except _Skip as exc:
            plan.skipped.append(_printable(f"{where}: {exc}"))
            continue
        except InvalidArgument as exc:
            if strict:
                raise
            plan.skipped.append(_printable(exc.message))  # it starts with where
            continue
        seen[spec.key] = where
        plan.tools.append(spec)
        plan.warnings.extend(_printable(f"{where}: {w}") for w in warnings)
    return plan


def _printable(line: str) -> str:
    """A skip or warning line as one printable line: the document's own text in it (a path,
    a media type, a name) cannot start another line of the CLI's output."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), line)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


# --- operations ---------------------------------------------------------------------------


class _Importer(RequestMapper):
    def __init__(
        self,
        doc: Mapping[str, Any],
        credential_ref: UUID | None,
        prefix: str,
        server: str | None = None,
        stated_auth: _Auth | None = None,
        credential_kind: str | None = None,
    ) -> None:
        self.doc = doc
        self.credential_ref = credential_ref
        self.prefix = prefix
        self.base_url = server
        self.stated_auth = stated_auth
        self.credential_kind = credential_kind
        # Component schemas converted once per document and direction, shared by its tools.
        self.inputs = _Schemas(doc, direction="write")
        self.outputs = _Schemas(doc, direction="read")

    def operations(self, paths: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
        """(path, method, where) per operation; method is "" for a path item that is not
        usable at all, which tool() then refuses (so it is skipped like any operation)."""
        for path, raw in paths.items():
            try:
                item = _deref(self.doc, raw)
            except InvalidArgument:
                item = None
            if not isinstance(path, str) or not isinstance(item, Mapping):
                yield str(path), "", f"paths.{path}"
                continue
            found = [m for m in (*METHODS, *UNSUPPORTED_METHODS) if m in item]
            for method in found:
                yield path, method, f"{method.upper()} {path}"

    def tool(self, path: str, method: str) -> tuple[ToolSpec, list[str]]:
        where = f"{method.upper()} {path}" if method else f"paths.{path}"
        try:
            if not method:
                raise InvalidArgument("a path item must be an object under a '/...' key")
            item = _deref(self.doc, self.doc["paths"][path])
            if not path.startswith("/"):
                raise InvalidArgument(f"the path {path!r} does not start with '/'")
            if "?" in path.split("#", 1)[0]:
                raise InvalidArgument("the path has a '?', which cannot be part of a URL path")
            op = _deref(self.doc, item[method])
            if not isinstance(op, Mapping):
                raise InvalidArgument("the operation must be an object")
            if method in UNSUPPORTED_METHODS:
                raise _Skip(
                    f"toolrelay sends GET, POST, PUT, PATCH and DELETE only, not {method.upper()}"
                )
            return self._tool(path, method, item, op)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}: {exc.message}") from None

    def _tool(
        self, path: str, method: str, item: Mapping[str, Any], op: Mapping[str, Any]
    ) -> tuple[ToolSpec, list[str]]:
        schemas = self.inputs
        auth = self._auth(op)
        inputs = _Input()
        url_path = self._parameters(path, item, op, schemas, inputs, auth)
        self._body(op, schemas, inputs)
        egress = (
            "write"
            if method != "get" or op.get("x-openai-isConsequential") is True
            else "read_only"
        )
        schema_input: dict[str, Any] = {
            "type": "object",
            "properties": inputs.properties,
            "additionalProperties": False,
        }
        if inputs.required:
            schema_input["required"] = inputs.required
        accept = accept_header(self.doc, op)
        if accept is not None:
            inputs.headers["Accept"] = accept
        template: dict[str, Any] = {}
        if inputs.query:
            template["query"] = inputs.query
        if inputs.headers:
            template["headers"] = inputs.headers
        if inputs.body is not None:
            template["body"] = inputs.body
        elif not inputs.properties and method in ("post", "put", "patch"):
            # No input member at all: without a placeholder the dispatcher would merge the
            # (empty) input into a {} body. The body is the input's 'body', which this
            # tool's schema (additionalProperties: false) never lets in: no body is sent.
            template["body"] = "{{input." + BODY_MEMBER + "}}"
        summary = _text(op.get("summary"))
        description = _text(op.get("description")) or summary
        tags = op.get("tags")
        category = tags[0] if isinstance(tags, list) and tags and isinstance(tags[0], str) else None
        key = self._key(path, method, op)
        spec = ToolSpec(
            key=key,
            name=summary or _text(op.get("operationId")) or f"{method.upper()} {path}",
            description=description,
            category=category or "general",
            schema_input=schemas.with_defs(schema_input),
            schema_output=self._output(op, inputs.warnings),
            auth_method=auth.method,
            requires_approval=egress == "write",
            endpoint_url=self._server(item, op) + url_path,
            http_method=method.upper(),
            request_template=template,
            auth_placement=auth.placement,
            auth_param_name=auth.name,
            auth_param_prefix=auth.prefix,
            credential_ref=self._credential_for(auth, inputs.warnings),
            egress_class=egress,
        )
        return spec, inputs.warnings

    def _credential_for(self, auth: _Auth, warnings: list[str]) -> UUID | None:
        if auth.method == "none" or self.credential_ref is None:
            return None
        if self.credential_kind is not None and auth.method != self.credential_kind:
            warnings.append(
                f"its security needs an {auth.method} credential and --credential is"
                f" {self.credential_kind}: imported without a credential"
            )
            return None
        return self.credential_ref

    def _key(self, path: str, method: str, op: Mapping[str, Any]) -> str:
        operation_id = op.get("operationId")
        if isinstance(operation_id, str) and operation_id.strip():
            base = re.sub(r"[^A-Za-z0-9_.-]", "_", operation_id.strip())
        else:
            base = "_".join(filter(None, [method, _slug(path.replace("{", "").replace("}", ""))]))
        key = f"{self.prefix}{base}"
        if not KEY_PATTERN.fullmatch(key):
            raise InvalidArgument(
                f"tool key {key!r} is not valid (a letter or digit, then letters, digits,"
                " '_', '.' or '-', at most 128 characters)"
            )
        return key

    def _server(self, item: Mapping[str, Any], op: Mapping[str, Any]) -> str:
        for holder in (op, item, self.doc):
            servers = holder.get("servers")
            if isinstance(servers, list) and servers:
                break
        else:
            if self.base_url is not None:
                return self.base_url.rstrip("/")
            raise InvalidArgument("no servers: toolrelay needs an absolute server URL (--server)")
        server = servers[0]
        if not isinstance(server, Mapping) or not isinstance(server.get("url"), str):
            raise InvalidArgument("servers[0] has no url")
        url: str = server["url"]
        variables = server.get("variables") or {}

        def default(match: re.Match[str]) -> str:
            variable = variables.get(match.group(1)) if isinstance(variables, Mapping) else None
            if not isinstance(variable, Mapping) or "default" not in variable:
                raise InvalidArgument(f"server variable {match.group(1)!r} has no default")
            return str(variable["default"])

        url = re.sub(r"\{([^{}]+)\}", default, url)
        if self.base_url is not None:
            url = urljoin(self.base_url.rstrip("/") + "/", url)  # RFC 3986 resolution
        if not re.match(r"https?://[^/?#]+", url, re.IGNORECASE):
            raise InvalidArgument(
                f"the server URL {url!r} is not an absolute http(s) URL; edit servers[0].url"
                " or give --server"
            )
        return url.rstrip("/")

    def _auth(self, op: Mapping[str, Any]) -> _Auth:
        if "security" not in op and "security" not in self.doc and self.stated_auth:
            return self.stated_auth  # --auth: the document declares none
        requirements = op.get("security", self.doc.get("security"))
        if not requirements:
            return _Auth()
        if not isinstance(requirements, list):
            raise InvalidArgument("security must be a list of requirements")
        schemes = (self.doc.get("components") or {}).get("securitySchemes") or {}
        names: list[str] = []
        candidates: list[_Auth] = []
        for requirement in requirements:
            if not isinstance(requirement, Mapping):
                raise InvalidArgument("each security requirement must be an object")
            if not requirement:
                break  # security is optional from here on
            for name in requirement:
                if name not in schemes:
                    raise InvalidArgument(f"security scheme {name!r} is not defined")
            names.append(" + ".join(requirement))
            if len(requirement) == 1:
                (name,) = requirement
                auth = _placeable(_deref(self.doc, schemes[name]))
                if auth is not None:
                    candidates.append(auth)
        else:
            if not candidates:
                raise _Skip(
                    f"its security ({' or '.join(names)}) needs a scheme toolrelay cannot place"
                    " (an apiKey in a cookie, an HTTP scheme other than bearer and basic,"
                    " mutual TLS, or several schemes at once)"
                )
        if not candidates:
            return _Auth()
        return fitting(candidates, self.credential_kind)

    def _output(self, op: Mapping[str, Any], warnings: list[str]) -> dict[str, Any]:
        for content in success_contents(self.doc, op):
            for media_type, media in content.items():
                media = _deref(self.doc, media)
                if is_json(str(media_type)) and isinstance(media, Mapping) and "schema" in media:
                    schemas = self.outputs
                    converted = schemas.top_level(schemas.convert(media["schema"]))
                    if not isinstance(converted, dict):
                        return {}
                    bounded = schemas.with_defs(dict(converted), OUTPUT_SCHEMA_BUDGET)
                    if schemas.left_out:
                        warnings.append(
                            f"schema_output cut to {OUTPUT_SCHEMA_BUDGET // 1024} KiB:"
                            f" {schemas.left_out} component schemas further from the root"
                            " accept any value"
                        )
                    return bounded
        return {}


def _check(spec: ToolSpec, where: str) -> None:
    """The checks registering makes, before anything is written (the error names where)."""
    try:
        check_json_schema("schema_input", spec.schema_input)
        check_json_schema("schema_output", spec.schema_output)
        validate_template(
            spec.endpoint_url,
            spec.http_method or "POST",
            spec.request_template or {},
            spec.auth_placement or "header",
            spec.auth_param_name or "Authorization",
        )
    except (InvalidArgument, TemplateError) as exc:
        raise InvalidArgument(f"{where} (tool {spec.key}): {exc.message}") from None
