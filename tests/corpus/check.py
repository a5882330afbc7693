"""Checks for the OpenAPI corpus test, read from the document itself, not from the importer:
every operation is accounted for (a tool or a skip with its reason), and a sampled tool's
rendered request is the one its operation describes.

What the request is checked against, for one operation and one sample input:

- method: the operation's;
- URL: the first server (operation, path item, document; variables at their defaults;
  a relative one resolved against ``--server``) + the path, each ``{param}`` replaced by the
  input's value percent-encoded as one segment (RFC 3986 unreserved characters kept);
- query: exactly the query parameters the input holds, each with its value as text
  (JSON for numbers and booleans), and the credential's parameter when it is placed there;
- headers: the header parameters the input holds, nothing else but the dispatcher's own
  (X-Toolrelay-Invocation, Content-Type), Accept and the credential's;
- Accept: only types the success responses declare, their JSON types when they declare one;
  absent only when they declare none or a wildcard;
- body: none when the operation has no request body; otherwise its Content-Type is one of
  the body's media types (``application/json`` also for ``*/*`` / ``application/*``), the
  body validates against that media type's schema (an OpenAPI validator, write direction:
  readOnly members are not required), the bytes are that type's encoding of it (JSON as
  JSON; a form parsed as a server parses it, each field sent as a form carries it), each
  body member of the input is in it, and a required body is sent;
- auth: the tool's placement is one of the operation's security alternatives (apiKey in a
  header or the query by its name; HTTP bearer and OAuth 2 / OpenID Connect as
  ``Authorization: Bearer``; HTTP basic as ``Authorization: Basic``; none when the document
  declares none and no ``--auth`` is given), and the dispatcher's placement puts the secret
  there and nowhere else.

Input member names follow the documented rule (docs/interop.md): characters outside
``[A-Za-z0-9_-]`` become ``_``, ``_`` first when it does not then start with a letter or
``_``; parameters whose names would so share a member have those characters spelled out
(``StartTime>`` → ``StartTime_gt``); a query or header parameter whose member would be a path parameter's is
``query_<name>`` / ``header_<name>``.
"""

from __future__ import annotations

import email
import email.policy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urljoin, urlsplit

import openapi_schema_validator as oas
from jsonschema.validators import extend
from openapi_schema_validator import _keywords as oas_keywords
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4, DRAFT202012

from toolrelay.export.openapi_load import deref, pointer

__all__ = [
    "METHODS",
    "Operation",
    "Problem",
    "categorize",
    "expected_key",
    "member_name",
    "operations",
]

METHODS: Final = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
IGNORED_HEADERS: Final = frozenset({"accept", "content-type", "authorization"})
DISPATCHER_HEADERS: Final = frozenset({"x-toolrelay-invocation", "content-type"})
DOC_URI: Final = "urn:toolrelay-corpus:document"
# The write direction: a required readOnly property is required in responses only (OpenAPI
# 3.0.3's Schema Object; 3.1's practice), for 3.1 as the validator has it for 3.0. Sending a
# readOnly property is a SHOULD NOT, not invalid (an allOf part may declare it writable).
OAS30WriteValidator: Final = extend(
    oas.OAS30Validator, validators={"required": oas_keywords.write_required}
)
OAS31WriteValidator: Final = extend(
    oas.OAS31Validator, validators={"required": oas_keywords.write_required}
)

# Skip reasons by kind, for the figures; the first pattern that matches names the kind.
CATEGORIES: Final = [
    ("file upload in a form", r"is a file upload"),
    (
        "form field encoding toolrelay does not produce",
        r"toolrelay's forms do not produce|no field toolrelay can send|not an object of fields",
    ),
    ("other non-JSON body", r"not JSON or a form|request body .* no schema"),
    (
        "cookie, digest or combined security",
        r"needs a scheme toolrelay cannot place",
    ),
    ("another scheme's credential as a parameter", r"carries the credential of"),
    ("HEAD, OPTIONS or TRACE", r"sends GET, POST, PUT, PATCH and DELETE only"),
    ("array or object in query or header", r"is an array or object"),
    ("cookie parameter", r"is a cookie"),
    ("header the HTTP client sets", r"is a header the HTTP client sets|not a valid HTTP header"),
    ("no absolute server URL", r"server URL|no servers|server variable"),
    ("broken in the document", r"does not resolve|is not defined|not declared|is not in the path"),
    # reasons the importer gave before (for the figures before)
    ("before: form or multipart body", r"x-www-form-urlencoded|multipart/"),
    ("before: a declared Content-Type", r"sends JSON bodies as application/json"),
    ("before: other non-JSON body", r"its request body is .*not JSON"),
    ("before: the credential's own parameter", r"carries the credential \(toolrelay places it\)"),
    ("before: two parameters, one input member", r"both become the input member"),
    ("before: '#' in the path key", r"has a '#' or '\?'"),
    ("before: $schema below the root", r"\$schema is only allowed at the root"),
]


def categorize(reason: str) -> str:
    for name, pattern in CATEGORIES:
        if re.search(pattern, reason):
            return name
    return "other"


@dataclass
class Problem:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass
class Operation:
    doc: Mapping[str, Any]
    path: str
    method: str
    item: Mapping[str, Any]
    op: Mapping[str, Any]
    server: str | None = None  # --server
    auth: str | None = None  # --auth
    problems: list[Problem] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.method.upper()} {self.path}"

    def fail(self, what: str) -> None:
        self.problems.append(Problem(self.where, what))

    # --- what the document says -------------------------------------------------------------

    def parameters(self) -> dict[tuple[str, str], Mapping[str, Any]]:
        merged: dict[tuple[str, str], Mapping[str, Any]] = {}
        for source in (self.item.get("parameters") or [], self.op.get("parameters") or []):
            for raw in source:
                param = deref(self.doc, raw)
                merged[(param["name"], param["in"])] = param
        return merged

    def members(self) -> dict[tuple[str, str], str]:
        """Each parameter's input member, by the documented rule."""
        params = self.parameters()
        plain = [member_name(n) for n in {n for n, _ in params}]

        def named(name: str) -> str:
            return spelled(name) if plain.count(member_name(name)) > 1 else member_name(name)

        path_members = {named(n) for n, where in params if where == "path"}
        out: dict[tuple[str, str], str] = {}
        for name, where in params:
            member = named(name)
            if where in ("query", "header") and member in path_members:
                member = f"{where}_{member}"
            out[(name, where)] = member
        return out

    def base_url(self) -> str:
        for holder in (self.op, self.item, self.doc):
            servers = holder.get("servers")
            if isinstance(servers, list) and servers:
                break
        else:
            assert self.server is not None, "no servers and no --server"
            return self.server.rstrip("/")
        server = servers[0]
        variables = server.get("variables") or {}
        url = re.sub(
            r"\{([^{}]+)\}", lambda m: str(variables[m.group(1)]["default"]), server["url"]
        )
        if self.server is not None:
            url = urljoin(self.server.rstrip("/") + "/", url)
        return url.rstrip("/")

    def body(self) -> tuple[Mapping[str, Any] | None, bool]:
        """The request body's content map (None: no body) and whether it is required."""
        body = deref(self.doc, self.op.get("requestBody"))
        if not isinstance(body, Mapping):
            return None, False
        return body.get("content") or {}, body.get("required") is True

    def security(self) -> list[Mapping[str, Any]] | None:
        """The security requirements in force; None when the document declares none."""
        if "security" in self.op:
            return list(self.op["security"] or [])
        if "security" in self.doc:
            return list(self.doc["security"] or [])
        return None


def operations(
    doc: Mapping[str, Any], server: str | None = None, auth: str | None = None
) -> Iterator[Operation]:
    for path, raw in (doc.get("paths") or {}).items():
        item = deref(doc, raw)
        if not isinstance(item, Mapping):
            continue
        for method in METHODS:
            if method in item:
                yield Operation(doc, path, method, item, deref(doc, item[method]), server, auth)


def member_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    return cleaned if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", cleaned) else f"_{cleaned}"


SPELLED: Final = {"<": "lt", ">": "gt", "=": "eq", "!": "not", ".": "dot", "[": "", "]": "",
                   " ": "", "$": "dollar", "@": "at", "*": "star", "+": "plus", ":": "colon",
                   "/": "slash"}  # fmt: skip


def spelled(name: str) -> str:
    """Names that would share a member: each other character spelled out, ``_`` around."""
    out = ""
    for here, after in zip(name, [*name[1:], ""], strict=True):
        if re.fullmatch(r"[A-Za-z0-9_-]", here):
            out += here
            continue
        word = SPELLED.get(here, f"u{ord(here):04x}")
        out += f"_{word}" + ("_" if word and re.fullmatch(r"[A-Za-z0-9]", after) else "")
    return out if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", out) else f"_{out}"


def expected_key(operation: Operation, prefix: str = "") -> str:
    operation_id = operation.op.get("operationId")
    if isinstance(operation_id, str) and operation_id.strip():
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", operation_id.strip())
    else:
        slug = re.sub(
            r"[^A-Za-z0-9]+", "_", operation.path.replace("{", "").replace("}", "")
        ).strip("_")
        base = "_".join(filter(None, [operation.method, slug]))
    return prefix + base


def text(value: Any) -> str:
    """A scalar as the template language sends it in a URL or header."""
    return value if isinstance(value, str) else json.dumps(value)


def base(media_type: str | None) -> str:
    return (media_type or "").split(";", 1)[0].strip().lower()


def declared_media(content: Mapping[str, Any], sent: str | None) -> str | None:
    """The media type of the operation's body the Content-Type sent is: the same type, or
    ``*/*`` / ``application/*`` for JSON; None when it declares no such type."""
    for media_type in content:
        if base(str(media_type)) == base(sent):
            return str(media_type)
    if base(sent) == "application/json":
        for media_type in content:
            if base(str(media_type)) in ("*/*", "application/*"):
                return str(media_type)
    return None


class BodyValidator:
    """Validates a body against a schema of the document, as OpenAPI reads it: 3.0's
    dialect (nullable, boolean exclusive bounds) or 3.1's (JSON Schema 2020-12)."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.v31 = str(doc.get("openapi", "")).startswith("3.1")
        spec = DRAFT202012 if self.v31 else DRAFT4
        doc = _local_mappings(doc)
        self.doc = doc
        self.registry: Registry[Any] = Registry().with_resource(
            DOC_URI, Resource.from_contents(doc, default_specification=spec)
        )

    def _discriminated(self, schema_ref: str, error: Any) -> bool:
        """A ``oneOf`` at the body's root that two branches accept, under a discriminator
        the validator cannot read (a mapping to schema names): OpenAPI picks the branch by
        the discriminator, so it is not an error."""
        if error.validator != "oneOf" or list(error.absolute_path):
            return False
        schema = deref(self.doc, pointer(self.doc, schema_ref))
        return isinstance(schema, Mapping) and "discriminator" in schema

    def errors(self, schema_ref: str, value: Any) -> list[str]:
        cls = OAS31WriteValidator if self.v31 else OAS30WriteValidator
        validator = cls({"$ref": f"{DOC_URI}{schema_ref}"}, registry=self.registry)
        try:
            return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in
                    validator.iter_errors(value) if not self._discriminated(schema_ref, e)][:3]  # fmt: skip
        except Exception as exc:  # a pattern Python cannot read, a $ref it cannot follow
            return [f"not checkable: {type(exc).__name__}: {str(exc)[:120]}"]


def _local_mappings(node: Any) -> Any:
    """The document without discriminators whose mapping names other files (DigitalOcean's
    ``models/x.yml#/...``), which the validator would try to fetch, and without an
    ``additionalProperties: false`` beside a discriminated ``oneOf`` that declares no
    properties of its own; shared where unchanged."""
    if isinstance(node, Mapping):
        changed = {k: _local_mappings(v) for k, v in node.items()}
        discriminator = changed.get("discriminator")
        mapping = discriminator.get("mapping") if isinstance(discriminator, Mapping) else None
        if isinstance(mapping, Mapping) and any(
            ("/" in str(v) or "#" in str(v)) and not str(v).startswith("#")
            for v in mapping.values()
        ):  # a reference into another file (a bare name is a schema's name: kept)
            return {k: v for k, v in changed.items() if k != "discriminator"}
        if (
            discriminator is not None
            and changed.get("additionalProperties") is False
            and not changed.get("properties")
            and ("oneOf" in changed or "anyOf" in changed)
        ):  # Jira's: read literally, no value with properties passes; meant for the branches
            return {k: v for k, v in changed.items() if k != "additionalProperties"}
        if all(changed[k] is node[k] for k in node):
            return node
        return changed
    if isinstance(node, list):
        items = [_local_mappings(v) for v in node]
        return node if all(a is b for a, b in zip(items, node, strict=True)) else items
    return node


def body_schema_ref(operation: Operation, media_type: str) -> str | None:
    """A JSON pointer (from the document's root) to the schema of the body's media type."""
    raw = operation.op.get("requestBody")
    pointer = f"#/paths/{_token(operation.path)}/{operation.method}/requestBody"
    if isinstance(raw, Mapping) and isinstance(raw.get("$ref"), str):
        pointer = raw["$ref"]
        raw = deref(operation.doc, raw)
    if not isinstance(raw, Mapping):
        return None
    media = (raw.get("content") or {}).get(media_type)
    here = f"{pointer}/content/{_token(media_type)}"
    if isinstance(media, Mapping) and isinstance(media.get("$ref"), str):
        here, media = media["$ref"], deref(operation.doc, media)
    if isinstance(media, Mapping) and "schema" in media:
        return f"{here}/schema"
    return None


def _token(text: str) -> str:
    return quote(text.replace("~", "~0").replace("/", "~1"), safe="")


# --- the request check ----------------------------------------------------------------------


def scheme_placement(scheme: Mapping[str, Any]) -> tuple[str, str, str, str] | None:
    """(auth_method, placement, name, prefix) for a scheme toolrelay places, else None."""
    kind = scheme.get("type")
    if kind == "apiKey" and scheme.get("in") in ("header", "query"):
        return "api_key", scheme["in"], scheme["name"], ""
    if kind == "http" and str(scheme.get("scheme", "")).lower() == "bearer":
        return "api_key", "header", "Authorization", "Bearer "
    if kind == "http" and str(scheme.get("scheme", "")).lower() == "basic":
        return "basic", "header", "Authorization", ""  # the dispatcher adds "Basic "
    if kind in ("oauth2", "openIdConnect"):
        return "oauth", "header", "Authorization", "Bearer "
    return None


def stated_placement(auth: str) -> tuple[str, str, str, str]:
    kind, _, name = auth.partition(":")
    if kind == "bearer":
        return "api_key", "header", "Authorization", "Bearer "
    if kind == "oauth":
        return "oauth", "header", "Authorization", "Bearer "
    if kind == "basic":
        return "basic", "header", "Authorization", ""
    return "api_key", kind, name, ""


def check_auth(operation: Operation, tool: Mapping[str, Any]) -> None:
    placed = (
        tool["auth_method"],
        tool["auth_placement"],
        tool["auth_param_name"],
        tool["auth_param_prefix"] or "",
    )
    requirements = operation.security()
    allowed: list[tuple[str, str, str, str] | None] = []
    if requirements is None:
        allowed.append(stated_placement(operation.auth) if operation.auth else None)
    else:
        schemes = (operation.doc.get("components") or {}).get("securitySchemes") or {}
        for requirement in requirements:
            if not requirement:
                allowed.append(None)
            elif len(requirement) == 1:
                (name,) = requirement
                allowed.append(scheme_placement(deref(operation.doc, schemes[name])))
        if not requirements:
            allowed.append(None)
    if tool["auth_method"] == "none":
        if None not in allowed:
            operation.fail(f"imported without auth, but its security is {requirements}")
        return
    fits = [a for a in allowed if a is not None]
    same = [
        a for a in fits if a[0] == placed[0] and a[1] == placed[1] and a[3] == placed[3]
        and a[2].lower() == str(placed[2]).lower()
    ]  # fmt: skip
    if not same:
        operation.fail(f"auth {placed} is none of its security alternatives {fits}")


def check_request(
    operation: Operation,
    tool: Mapping[str, Any],
    sample: Mapping[str, Any],
    rendered: Any,
    sent: tuple[str, Mapping[str, str], bytes | None],
    secret: str,
    validator: BodyValidator,
) -> None:
    """Compare one rendered request (and the URL, headers and bytes sent once the dispatcher
    has placed the credential ``secret``) with what the operation describes."""
    fail = operation.fail
    if rendered.method != operation.method.upper():
        fail(f"method {rendered.method}, expected {operation.method.upper()}")
    if (operation.method != "get") != bool(tool["requires_approval"]):
        fail("a write (any method but GET) must wait for approval, and a read need not")
    params = operation.parameters()
    members = operation.members()
    used: set[str] = set()

    # URL: server + path, each path parameter percent-encoded as one segment
    path = operation.path.split("#", 1)[0]  # a fragment is never sent
    for (name, where), param in params.items():
        if where != "path":
            continue
        member = members[(name, where)]
        if member not in sample:
            fail(f"path parameter {name!r} has no input member {member!r}")
            continue
        used.add(member)
        value = quote(text(sample[member]), safe="")
        style = param.get("style", "simple")
        if style == "label":
            value = "." + value
        elif style == "matrix":
            value = f";{quote(name, safe='')}={value}"
        path = path.replace("{" + name + "}", value)
    url, headers, payload = sent
    expected = operation.base_url() + path
    split = urlsplit(url)
    got = f"{split.scheme}://{split.netloc}{split.path}"
    if got != expected:
        fail(f"URL {got!r}, expected {expected!r}")

    # query: exactly the parameters the input holds, and the credential
    query = parse_qsl(split.query, keep_blank_values=True)
    placed_in_query = tool["auth_method"] != "none" and tool["auth_placement"] == "query"
    want: list[tuple[str, str]] = []
    for (name, where), param in params.items():
        member = members[(name, where)]
        if where != "query":
            continue
        if member in sample and sample[member] is not None:
            want.append((name, text(sample[member])))
            used.add(member)
        elif param.get("required") is True and member not in tool["schema_input"].get(
            "properties", {}
        ):
            fail(f"required query parameter {name!r} is not an input member")
    if placed_in_query:
        want.append((tool["auth_param_name"], secret))
    if sorted(query) != sorted(want):
        fail(f"query {sorted(query)}, expected {sorted(want)}")

    # headers: the header parameters the input holds, the credential, the dispatcher's own
    lowered = {k.lower(): v for k, v in headers.items()}
    want_headers: dict[str, str] = {}
    for name, where in params:
        member = members[(name, where)]
        if where != "header" or name.lower() in IGNORED_HEADERS:
            continue
        if member in sample and sample[member] is not None:
            want_headers[name.lower()] = text(sample[member])
            used.add(member)
    if tool["auth_method"] != "none" and tool["auth_placement"] == "header":
        prefix = tool["auth_param_prefix"] or ("Basic " if tool["auth_method"] == "basic" else "")
        want_headers[tool["auth_param_name"].lower()] = prefix + secret
    check_accept(operation, lowered.get("accept"))
    got_headers = {
        k: v for k, v in lowered.items() if k not in DISPATCHER_HEADERS and k != "accept"
    }
    if got_headers != want_headers:
        fail(f"headers {got_headers}, expected {want_headers}")
    if secret in url and not placed_in_query:
        fail("the credential is in the URL, but the tool places it in a header")

    # body and Content-Type
    check_body(operation, sample, used, rendered.body, lowered.get("content-type"), payload,
               validator)  # fmt: skip


def check_accept(operation: Operation, accept: str | None) -> None:
    """Accept names only types the success responses declare, their JSON types when they
    declare one; it is left out only when they name no type or any type."""
    declared: set[str] = set()
    for code, response in (operation.op.get("responses") or {}).items():
        if str(code).startswith("2") and len(str(code)) == 3:
            response = deref(operation.doc, response)
            content = response.get("content") if isinstance(response, Mapping) else None
            declared |= {base(str(t)) for t in content or {} if ";" not in str(t)}
    json_types = {t for t in declared if t == "application/json" or t.endswith("+json")}
    if accept is None:
        if declared and not any("*" in t for t in declared):
            operation.fail(f"no Accept, but its success responses are {sorted(declared)}")
        return
    asked = [base(t) for t in accept.split(",")]
    if not set(asked) <= declared or (json_types and not set(asked) <= json_types):
        operation.fail(f"Accept {accept!r} for success responses of {sorted(declared)}")


def check_body(
    operation: Operation,
    sample: Mapping[str, Any],
    used: set[str],
    body: Any,
    content_type: str | None,
    payload: bytes | None,
    validator: BodyValidator,
) -> None:
    """The body sent is of a media type the operation declares, encoded as that type says,
    valid for its schema, and holds each body member of the input."""
    fail = operation.fail
    content, required = operation.body()
    if content is None or not content:
        if body is not None:
            fail(f"a body is sent ({json.dumps(body)[:80]}), but the operation has none")
        for member in sample:
            if member not in used:
                fail(f"input member {member!r} is sent nowhere the operation declares")
        if content_type is not None:
            fail(f"Content-Type {content_type!r} without a body")
        return
    if body is None:
        if required:
            fail("its request body is required, and none is sent")
        if content_type is not None:
            fail(f"Content-Type {content_type!r} without a body")
        return
    media_type = declared_media(content, content_type)
    if media_type is None:
        fail(f"Content-Type {content_type!r}, but it accepts {sorted(content)}")
        return
    ref = body_schema_ref(operation, media_type)
    if ref is not None:
        for error in validator.errors(ref, body):
            fail(f"the body does not match its schema: {error}")
    kind = base(content_type)
    if kind == "application/x-www-form-urlencoded":
        sent = form_fields(payload or b"")
    elif kind == "multipart/form-data":
        sent = multipart_fields(str(content_type), payload or b"")
    else:
        if json.loads(payload or b"null") != body:
            fail("the bytes sent are not the body's JSON")
        sent = None
    body_members = [m for m in sample if m not in used]
    if body_members == ["body"]:
        if body != sample["body"]:
            fail("the body member is not sent as it is")
        members: Mapping[str, Any] = sample["body"] if sent is not None else {}
    else:
        members = {m: sample[m] for m in body_members}
        for member in body_members:
            if not isinstance(body, Mapping) or body.get(member) != sample[member]:
                fail(f"input member {member!r} is not in the body as it is")
    if sent is not None:
        for name, value in members.items():
            if not form_value_sent(sent, name, value, kind):
                fail(f"form field {name!r} is not sent as {json.dumps(value)[:80]}: {sent[:5]}")


def form_fields(payload: bytes) -> list[tuple[str, str]]:
    """An urlencoded body's (name, value) pairs, as a server parses them."""
    return parse_qsl(payload.decode("ascii"), keep_blank_values=True, strict_parsing=False)


def multipart_fields(content_type: str, payload: bytes) -> list[tuple[str, str]]:
    """A multipart body's (field name, text) parts, parsed by the standard MIME parser."""
    message = email.message_from_bytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + payload, policy=email.policy.HTTP
    )
    fields = []
    for part in message.iter_parts():  # type: ignore[attr-defined]
        name = part.get_param("name", header="content-disposition")
        raw = part.get_payload(decode=True)
        assert isinstance(raw, bytes)
        fields.append((str(name), raw.decode("utf-8")))  # WHATWG: a form's parts are UTF-8
    return fields


def form_value_sent(sent: list[tuple[str, str]], name: str, value: Any, kind: str) -> bool:
    """A field is sent as a form carries it: a scalar as its text, an array of scalars one
    field per element, an object or array of objects in brackets (urlencoded: Stripe's
    ``card[number]``) or as one JSON part (multipart); null not at all."""
    mine = [v for k, v in sent if k == name or k.startswith(name + "[")]
    if value is None:
        return not mine
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return mine == [text(v) for v in value if v is not None]
    if isinstance(value, dict | list) and kind == "multipart/form-data":
        return len(mine) == 1 and json.loads(mine[0]) == value
    if isinstance(value, dict | list):
        return len(mine) == leaves(value)  # one field per non-null scalar inside
    return mine == [text(value)]


def leaves(value: Any) -> int:
    if isinstance(value, dict):
        return sum(leaves(v) for v in value.values())
    if isinstance(value, list):
        return sum(leaves(v) for v in value)
    return value is not None
