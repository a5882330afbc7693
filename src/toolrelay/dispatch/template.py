"""The request template language: check a tool's request template and render one request.

Pure functions with no I/O and no access to the environment: everything in a rendered
request comes from the endpoint URL, the template, the invocation's input and its id.
The user-facing reference is docs/templates.md.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final, TypeAlias
from urllib.parse import quote, unquote, unquote_plus

from yarl import URL

from toolrelay.dispatch.bodies import check_body
from toolrelay.errors import TemplateError

__all__ = [
    "METHODS",
    "RenderedRequest",
    "render_request",
    "uses_input_placeholders",
    "validate_template",
]

METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
_BODY_MERGE_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
_TEMPLATE_MEMBERS: Final = ("headers", "query", "body")
# Set by the HTTP client; letting a template set them enables request smuggling.
_FORBIDDEN_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})

_IDENT: Final = r"[A-Za-z_][A-Za-z0-9_-]*"
_INDEX: Final = r"\[(?:0|[1-9][0-9]*)\]"
_EXPR: Final = rf"input\.{_IDENT}(?:\.{_IDENT}|{_INDEX})*|invocation\.id"
_INNER_RE: Final = re.compile(r"[ \t]*(" + _EXPR + r")[ \t]*")
_PLACEHOLDER_RE: Final = re.compile(r"\{\{[ \t]*(" + _EXPR + r")[ \t]*\}\}")
_STEP_RE: Final = re.compile(rf"\.({_IDENT})|\[([0-9]+)\]")
_IDENT_RE: Final = re.compile(_IDENT)
_TOKEN_RE: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SCHEME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# RFC 3986 characters minus '#': anything else in a registered URL must be percent-encoded.
_URL_CHARS_RE: Final = re.compile(r"[A-Za-z0-9\-._~:/?\[\]@!$&'()*+,;=%]*")
_BAD_PERCENT_RE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True)
class RenderedRequest:
    """One concrete HTTP request, ready to send."""

    method: str
    url: str
    headers: dict[str, str]
    body: Any | None


# --- placeholders -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Placeholder:
    expr: str
    root: str
    steps: tuple[str | int, ...]

    def __str__(self) -> str:
        return "{{" + self.expr + "}}"


_Part: TypeAlias = "str | _Placeholder"


class _Missing:
    """The value of a placeholder whose path is absent from the input."""


_MISSING: Final = _Missing()


# What placeholders may put into one request, in all (bytes of text, roughly): a template
# of a thousand placeholders over one 1 MiB input would otherwise build a gigabyte in the
# worker's loop, every tenant's.
MAX_RENDERED_BYTES: Final = 16 * 2**20


@dataclass(frozen=True)
class _Context:
    input: Mapping[str, Any]
    invocation_id: str
    spent: list[int] = field(default_factory=lambda: [0])  # bytes placed so far
    sizes: dict[int, int] = field(default_factory=dict)  # id(value): its size, walked once

    def place(self, value: Any) -> None:
        """Count what one placeholder puts into the request; refuse past the limit."""
        if isinstance(value, str):
            size = len(value)
        elif isinstance(value, Mapping | list | tuple):
            if (size := self.sizes.get(id(value), -1)) < 0:
                size = self.sizes[id(value)] = _size(value)
        else:
            size = 8
        self.spent[0] += size
        if self.spent[0] > MAX_RENDERED_BYTES:
            raise TemplateError(
                f"the request's placeholders would place more than {MAX_RENDERED_BYTES >> 20}"
                " MiB of input into it (the same large value used many times?)"
            )


def _size(value: Any) -> int:
    """Roughly the bytes of a JSON value as text (walked without recursion)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            total += 2 + sum(len(k) + 4 for k in item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            total += 2 + len(item)
            stack.extend(item)
        else:
            total += len(item) + 2 if isinstance(item, str) else 8
    return total


PARSED_KEPT = 4096  # template strings kept parsed: the dispatcher renders the same ones again


@lru_cache(maxsize=PARSED_KEPT)
def _parse(text: str, where: str) -> tuple[_Part, ...]:
    """Split text into literal runs and placeholders; anything else in {{ }} is an error.

    Cached (a pure function of its arguments; an error is raised again, never cached)."""
    parts: list[_Part] = []
    pos = 0
    while (start := text.find("{{", pos)) != -1:
        end = text.find("}}", start + 2)
        if end == -1:
            raise TemplateError(f"{where}: '{{{{' is not closed by '}}}}'")
        inner = _INNER_RE.fullmatch(text, start + 2, end)
        if inner is None:
            raise TemplateError(
                f"{where}: {_snippet(text[start : end + 2])} is not a placeholder; only "
                "{{input.<path>}} and {{invocation.id}} are allowed"
            )
        if start > pos:
            parts.append(text[pos:start])
        parts.append(_placeholder(inner.group(1)))
        pos = end + 2
    if pos < len(text):
        parts.append(text[pos:])
    return tuple(parts)


def _snippet(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _placeholder(expr: str) -> _Placeholder:
    if expr == "invocation.id":
        return _Placeholder(expr, "invocation", ())
    steps: list[str | int] = []
    for match in _STEP_RE.finditer(expr, len("input")):
        name, index = match.group(1), match.group(2)
        steps.append(name if name is not None else int(index))
    return _Placeholder(expr, "input", tuple(steps))


def _whole(parts: tuple[_Part, ...]) -> _Placeholder | None:
    """The placeholder if the string is exactly one placeholder, else None."""
    if len(parts) == 1 and isinstance(parts[0], _Placeholder):
        return parts[0]
    return None


def _resolve(ph: _Placeholder, ctx: _Context) -> Any:
    """The referenced value, or _MISSING when some step of the path cannot be followed."""
    if ph.root == "invocation":
        return ctx.invocation_id
    value: Any = ctx.input
    for step in ph.steps:
        if isinstance(step, int):
            if not isinstance(value, list | tuple) or step >= len(value):
                return _MISSING
        elif not isinstance(value, Mapping) or step not in value:
            return _MISSING
        value = value[step]
    ctx.place(value)
    return value


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return "a value that is not JSON"


def _scalar_text(value: Any) -> str | None:
    """Strings raw, other JSON scalars as JSON text; None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return None


def _text(ph: _Placeholder, ctx: _Context, where: str, context: str) -> str:
    value = _resolve(ph, ctx)
    if value is _MISSING:
        raise TemplateError(f"{where}: placeholder {ph} {context} refers to a missing input path")
    text = _scalar_text(value)
    if text is None:
        raise TemplateError(f"{where}: placeholder {ph} {context} refers to {_kind(value)}")
    return text


def _join(
    parts: tuple[_Part, ...], ctx: _Context, where: str, context: str, encode: bool = False
) -> str:
    """Literal runs as they are, placeholder values as text (percent-encoded in URLs)."""
    texts = (
        p if isinstance(p, str) else _placeholder_text(p, ctx, where, context, encode)
        for p in parts
    )
    return "".join(texts)


def _placeholder_text(
    ph: _Placeholder, ctx: _Context, where: str, context: str, encode: bool
) -> str:
    text = _text(ph, ctx, where, context)
    return _pct(text, where) if encode else text


def _member_text(raw: Any, where: str, ctx: _Context, context: str) -> str | None:
    """A header or query member as text; None omits it (null, or a missing/null placeholder)."""
    if not isinstance(raw, str):
        return _scalar_text(raw) if raw is not None else None
    parts = _parse(raw, where)
    whole = _whole(parts)
    if whole is not None and _absent(_resolve(whole, ctx)):
        return None
    return _join(parts, ctx, where, context)


def _absent(value: Any) -> bool:
    """Whether a whole-value placeholder in a header or query member omits that member."""
    return value is _MISSING or value is None


def _check_unicode(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise TemplateError(f"{where}: value is not valid Unicode text") from None


def _pct(text: str, where: str) -> str:
    """Percent-encode everything but unreserved characters, so a value stays one component."""
    _check_unicode(text, where)
    return quote(text, safe="")


# --- JSON values ----------------------------------------------------------------------------


def _child(where: str, key: str) -> str:
    return f"{where}.{key}" if _IDENT_RE.fullmatch(key) else f"{where}[{json.dumps(key)}]"


def _copy_json(value: Any, where: str) -> Any:
    """A fresh copy of a JSON value, so the rendered request never aliases the input."""
    if isinstance(value, Mapping):
        copy: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TemplateError(f"{where}: object key {key!r} is not a string")
            copy[key] = _copy_json(item, where)
        return copy
    if isinstance(value, list | tuple):
        return [_copy_json(item, where) for item in value]
    if _scalar_text(value) is not None:
        return value
    raise TemplateError(f"{where}: {_kind(value)} cannot be rendered")


def _check_json(value: Any, where: str) -> None:
    if isinstance(value, str):
        _parse(value, where)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_key(key, where)
            _check_json(item, _child(where, key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]")
    elif _scalar_text(value) is None:
        raise TemplateError(f"{where}: {_kind(value)} is not allowed in a template")


def _check_key(key: Any, where: str) -> None:
    if not isinstance(key, str):
        raise TemplateError(f"{where}: object key {key!r} is not a string")
    if "{{" in key:
        raise TemplateError(
            f"{where}: key {_snippet(key)} contains a placeholder; object keys are not templated"
        )


def _render_value(value: Any, where: str, ctx: _Context, omittable: bool) -> Any:
    """Render a JSON value; returns _MISSING when an omittable member should be left out."""
    if isinstance(value, str):
        return _render_string(value, where, ctx, omittable)
    if isinstance(value, Mapping):
        rendered = {k: _render_value(v, _child(where, k), ctx, True) for k, v in value.items()}
        return {k: v for k, v in rendered.items() if v is not _MISSING}
    if isinstance(value, list | tuple):
        return [_render_value(v, f"{where}[{i}]", ctx, False) for i, v in enumerate(value)]
    return value


def _render_string(text: str, where: str, ctx: _Context, omittable: bool) -> Any:
    parts = _parse(text, where)
    whole = _whole(parts)
    if whole is None:
        return _join(parts, ctx, where, "inside a string")
    value = _resolve(whole, ctx)
    if value is not _MISSING:
        return _copy_json(value, where)
    if not omittable:
        raise TemplateError(
            f"{where}: placeholder {whole} refers to a missing input path; "
            "array elements cannot be omitted"
        )
    return _MISSING


def _deep_merge(base: Any, override: Any) -> Any:
    """Objects merge recursively with override winning; anything else is replaced."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _deep_merge(base[key], value) if key in base else value
    return merged


# --- auth and headers -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Auth:
    header: str | None = None
    query: str | None = None


def _auth(placement: str, name: str) -> _Auth:
    key = name.lower()
    return _Auth(query=key) if placement == "query" else _Auth(header=key)


def _check_headers(headers: Any, auth: _Auth) -> None:
    if not isinstance(headers, Mapping):
        raise TemplateError("headers: must be an object of strings")
    seen: set[str] = set()
    for name, value in headers.items():
        _check_header_name(name, auth)
        if name.lower() in seen:
            raise TemplateError(f"headers.{name}: header is set twice (names ignore case)")
        seen.add(name.lower())
        where = f"headers.{name}"
        if not isinstance(value, str):
            raise TemplateError(f"{where}: must be a string")
        for part in _parse(value, where):
            if isinstance(part, str) and _CONTROL_RE.search(part):
                raise TemplateError(f"{where}: contains CR, LF, NUL or another control character")


def _check_header_name(name: Any, auth: _Auth) -> None:
    if not isinstance(name, str):
        raise TemplateError(f"headers: header name {name!r} is not a string")
    if "{{" in name:
        raise TemplateError(
            f"headers: header name {_snippet(name)} contains a placeholder; names are not templated"
        )
    if not _TOKEN_RE.fullmatch(name):
        raise TemplateError(f"headers: {_snippet(name)} is not a valid header name")
    if name.lower() in _FORBIDDEN_HEADERS:
        raise TemplateError(f"headers.{name}: set by the HTTP client; a template cannot set it")
    if name.lower() == auth.header:
        raise TemplateError(f"headers.{name}: is the tool's auth header; a template cannot set it")


def _render_headers(headers: Mapping[str, Any], ctx: _Context) -> dict[str, str]:
    rendered: dict[str, str] = {}
    for name, raw in headers.items():
        where = f"headers.{name}"
        value = _member_text(raw, where, ctx, "in a header value")
        if value is None:
            continue
        if _CONTROL_RE.search(value):
            raise TemplateError(f"{where}: value contains CR, LF, NUL or another control character")
        _check_unicode(value, where)
        rendered[name] = value
    return rendered


# --- query ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    name: str  # decoded, for comparisons
    text: str  # encoded "name=value"


def _check_query(query: Any, auth: _Auth) -> None:
    if not isinstance(query, Mapping):
        raise TemplateError("query: must be an object of strings, numbers, booleans or null")
    for name, value in query.items():
        _check_key(name, "query")
        where = _child("query", name)
        if not name:
            raise TemplateError("query: parameter name must not be empty")
        if name.lower() == auth.query:
            raise TemplateError(f"{where}: is the tool's auth parameter; a template cannot set it")
        if isinstance(value, str):
            _parse(value, where)
        elif value is not None and _scalar_text(value) is None:
            raise TemplateError(f"{where}: must be a string, number, boolean or null")


def _render_query(query: Mapping[str, Any], ctx: _Context) -> list[_Param]:
    params: list[_Param] = []
    for name, raw in query.items():
        where = _child("query", name)
        value = _member_text(raw, where, ctx, "in a query value")
        if value is not None:
            params.append(_Param(name, f"{_pct(name, where)}={_pct(value, where)}"))
    return params


def _input_params(ctx: _Context, auth: _Auth) -> list[_Param]:
    """Top-level scalar input members as query parameters; others are ignored, null omitted."""
    params: list[_Param] = []
    for name, raw in ctx.input.items():
        where = _child("input", str(name))
        if not isinstance(name, str):
            raise TemplateError(f"input: member name {name!r} is not a string")
        if isinstance(raw, Mapping | list | tuple) or raw is None:
            continue
        value = _scalar_text(raw)
        if value is None:
            raise TemplateError(f"{where}: {_kind(raw)} cannot be a query parameter")
        if name.lower() == auth.query:
            raise TemplateError(f"{where}: would set the tool's auth query parameter")
        params.append(_Param(name, f"{_pct(name, where)}={_pct(value, where)}"))
    return params


def _merge_params(params: list[_Param], overrides: list[_Param]) -> list[_Param]:
    """Input wins: its parameters replace same-named ones from the URL and template."""
    names = {p.name for p in overrides}
    return [p for p in params if p.name not in names] + overrides


# --- endpoint URL ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _UrlTemplate:
    prefix: str  # "scheme://authority" exactly as registered
    origin: tuple[str, str, int]
    path: str
    query: str | None


def _split_url(url: Any) -> _UrlTemplate:
    """Check a registered endpoint URL and split it; placeholders only in path and query."""
    if not isinstance(url, str) or not url:
        raise TemplateError("endpoint_url: must be a non-empty string")
    return _split_checked(url)


@lru_cache(maxsize=PARSED_KEPT)  # pure: the same few endpoint URLs come back on every call
def _split_checked(url: str) -> _UrlTemplate:
    _parse(url, "endpoint_url")
    sep = url.find("://")
    if sep == -1:
        raise TemplateError("endpoint_url: must be an absolute http or https URL")
    end = next((i for i in range(sep + 3, len(url)) if url[i] in "/?#"), len(url))
    if "{{" in url[:end]:
        raise TemplateError(
            "endpoint_url: placeholders are allowed only in the path and query, "
            "not in the scheme, user info, host or port"
        )
    scheme = url[:sep]
    if not _SCHEME_RE.fullmatch(scheme) or scheme.lower() not in ("http", "https"):
        raise TemplateError("endpoint_url: scheme must be http or https")
    _check_url_chars(url)
    path, qmark, query = url[end:].partition("?")
    return _UrlTemplate(url[:end], _origin(url[:end]), path, query if qmark else None)


def _check_url_chars(url: str) -> None:
    if "#" in url:
        raise TemplateError("endpoint_url: must not have a fragment ('#'); it is never sent")
    literal = _PLACEHOLDER_RE.sub("", url)
    if not _URL_CHARS_RE.fullmatch(literal):
        raise TemplateError(
            "endpoint_url: has a character that must be percent-encoded "
            '(space, control, non-ASCII, or one of "<>\\^`{|})'
        )
    if _BAD_PERCENT_RE.search(literal):
        raise TemplateError("endpoint_url: '%' is not followed by two hex digits")


def _origin(url: str) -> tuple[str, str, int]:
    """Scheme, lower-cased host and effective port, as aiohttp (yarl) will read them."""
    try:
        parsed = URL(url, encoded=True)
        host, port = parsed.host, parsed.port
    except ValueError:
        raise TemplateError("endpoint_url: host or port is malformed") from None
    if not host:
        raise TemplateError("endpoint_url: must have a host")
    if port is None or not 0 < port < 65536:
        raise TemplateError("endpoint_url: port must be between 1 and 65535")
    return parsed.scheme.lower(), host.lower(), port


def _check_url(url: _UrlTemplate, auth: _Auth) -> None:
    for segment in url.path.split("/"):
        if "{{" not in segment and unquote(segment) in (".", ".."):
            raise TemplateError(f"endpoint_url path: dot-segment {segment!r} is not allowed")
    for part in _query_parts(url.query):
        name = part.partition("=")[0]
        if "{{" in name:
            raise TemplateError(
                f"endpoint_url query: parameter name {_snippet(name)} contains a placeholder; "
                "names are not templated"
            )
        if unquote_plus(name).lower() == auth.query:
            raise TemplateError(
                f"endpoint_url query: {_snippet(name)} is the tool's auth parameter; "
                "the endpoint URL cannot set it"
            )


def _query_parts(query: str | None) -> list[str]:
    return [part for part in (query or "").split("&") if part]


def _render_path(path: str, ctx: _Context) -> str:
    return "/".join(_render_segment(segment, ctx) for segment in path.split("/"))


def _render_segment(segment: str, ctx: _Context) -> str:
    where = "endpoint_url path"
    parts = _parse(segment, where)
    if all(isinstance(p, str) for p in parts):
        return segment
    rendered = _join(parts, ctx, where, "in the URL path", encode=True)
    if unquote(rendered) in ("", ".", ".."):
        raise TemplateError(
            f"{where}: segment {segment!r} renders to {unquote(rendered)!r}; "
            "empty, '.' and '..' segments are not allowed"
        )
    return rendered


def _render_url_query(query: str | None, ctx: _Context) -> list[_Param]:
    params: list[_Param] = []
    for part in _query_parts(query):
        name, eq, raw = part.partition("=")
        where = f"endpoint_url query {_snippet(name)}"
        parts = _parse(raw, where)
        whole = _whole(parts)
        if whole is not None and _absent(_resolve(whole, ctx)):
            continue
        value = _join(parts, ctx, where, "in a query value", encode=True)
        params.append(_Param(unquote_plus(name), f"{name}{eq}{value}"))
    return params


def _assemble(url: _UrlTemplate, path: str, params: list[_Param]) -> str:
    query = "&".join(p.text for p in params)
    return url.prefix + (path or "/") + (f"?{query}" if query else "")


# --- public API -----------------------------------------------------------------------------


def uses_input_placeholders(endpoint_url: str | None, request_template: Mapping[str, Any]) -> bool:
    """Whether any {{input.…}} placeholder appears in the URL or template (never raises)."""
    texts = _strings(request_template)
    strings = [endpoint_url, *texts] if isinstance(endpoint_url, str) else list(texts)
    return any(
        match.group(1).startswith("input.")
        for text in strings
        for match in _PLACEHOLDER_RE.finditer(text)
    )


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def validate_template(
    endpoint_url: str | None,
    http_method: str,
    request_template: Mapping[str, Any],
    auth_placement: str = "header",
    auth_param_name: str = "Authorization",
) -> None:
    """Raise TemplateError naming the problem if the tool's configuration can never render."""
    _check_method(http_method)
    auth = _auth(auth_placement, auth_param_name)
    if endpoint_url is not None:
        _check_url(_split_url(endpoint_url), auth)
    _check_template(request_template, auth)


def _check_method(method: Any) -> str:
    upper = method.upper() if isinstance(method, str) else ""
    if upper not in METHODS:
        raise TemplateError(f"http_method: {method!r} is not one of GET, POST, PUT, PATCH, DELETE")
    return upper


def _check_template(template: Any, auth: _Auth) -> None:
    if not isinstance(template, Mapping):
        raise TemplateError("request_template: must be a JSON object")
    unknown = sorted(str(key) for key in template if key not in _TEMPLATE_MEMBERS)
    if unknown:
        raise TemplateError(
            f"request_template: unknown member {unknown[0]!r}; only headers, query and body "
            "are allowed"
        )
    if "headers" in template:
        _check_headers(template["headers"], auth)
    if "query" in template:
        _check_query(template["query"], auth)
    if "body" in template:
        _check_json(template["body"], "body")


def render_request(
    endpoint_url: str,
    http_method: str,
    request_template: Mapping[str, Any],
    input: Mapping[str, Any],
    invocation_id: str,
    auth_placement: str = "header",
    auth_param_name: str = "Authorization",
) -> RenderedRequest:
    """Render the request for one invocation. Raises TemplateError."""
    method = _check_method(http_method)
    auth = _auth(auth_placement, auth_param_name)
    url = _split_url(endpoint_url)
    _check_url(url, auth)
    _check_template(request_template, auth)
    if not isinstance(input, Mapping):
        raise TemplateError("input: must be a JSON object")
    ctx = _Context(input, str(invocation_id))
    merge = not uses_input_placeholders(endpoint_url, request_template)
    try:
        return _render(method, url, request_template, ctx, auth, merge)
    except RecursionError:
        raise TemplateError("input: nested too deeply to render") from None


def _render(
    method: str,
    url: _UrlTemplate,
    template: Mapping[str, Any],
    ctx: _Context,
    auth: _Auth,
    merge: bool,
) -> RenderedRequest:
    headers = _render_headers(template.get("headers", {}), ctx)
    body = _render_value(template.get("body"), "body", ctx, True)
    body = None if body is _MISSING else body
    params = _render_url_query(url.query, ctx) + _render_query(template.get("query", {}), ctx)
    if merge and method in _BODY_MERGE_METHODS:
        body = _deep_merge(body, _copy_json(ctx.input, "input"))
    elif merge:
        params = _merge_params(params, _input_params(ctx, auth))
    check_body(body, headers)  # a form type needs an object (bodies.py)
    rendered = _assemble(url, _render_path(url.path, ctx), params)
    if _origin(rendered) != url.origin:
        raise TemplateError(
            "endpoint_url: the rendered URL's origin differs from the registered one"
        )
    return RenderedRequest(method, rendered, headers, body)
