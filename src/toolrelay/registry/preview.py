"""What approving an invocation will send: the rendered request with the credential masked.

Rendered exactly as the dispatcher renders it (same template function, no schema defaults,
same added headers). The credential is never read, let alone decrypted.

Its place is structured, never a substring: a header value and the URL are sequences of
``Part``s, and the credential is the one ``Part`` with ``secret=True`` (no text). The page
draws that part as its own badge, so agent input that happens to contain ``••••`` (or any
other text) cannot pass for it. ``url`` and ``headers`` are plain-text views for logs and
tests, where the credential is ``MASK`` and cannot be told from input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from toolrelay.dispatch.bodies import media_type, shown_body
from toolrelay.dispatch.executor import MASK, auth_prefix, build_request, request_digest
from toolrelay.errors import TemplateError

__all__ = ["MASK", "Header", "Part", "RequestPreview", "approval_digest", "preview_request"]


@dataclass(frozen=True)
class Part:
    """A run of a header value or of the URL: text as it is sent, or (``secret``) the place
    where the dispatcher puts the credential, which has no text here."""

    text: str = ""
    secret: bool = False

    @property
    def plain(self) -> str:
        return MASK if self.secret else self.text


SECRET = Part(secret=True)


@dataclass(frozen=True)
class Header:
    name: str
    value: tuple[Part, ...]

    @property
    def plain(self) -> str:
        return "".join(part.plain for part in self.value)


@dataclass(frozen=True)
class RequestPreview:
    method: str
    url_parts: tuple[Part, ...] = ()
    header_lines: list[Header] = field(default_factory=list)
    body: str | None = None  # as bodies.shown_body shows it: JSON indented, or the form
    error: str | None = None  # the request cannot be rendered: approving will fail it
    warnings: list[str] = field(default_factory=list)
    digest: str | None = None  # of what is shown: approving binds to exactly this request

    @property
    def url(self) -> str:
        """The URL as text, the credential as ``MASK`` (not for display: see ``url_parts``)."""
        return "".join(part.plain for part in self.url_parts)

    @property
    def headers(self) -> list[tuple[str, str]]:
        """Headers as text, the credential as ``MASK`` (not for display: ``header_lines``)."""
        return [(header.name, header.plain) for header in self.header_lines]

    @property
    def has_secret(self) -> bool:
        return any(part.secret for part in self.url_parts) or any(
            part.secret for header in self.header_lines for part in header.value
        )


def _text(value: str) -> tuple[Part, ...]:
    return (Part(value),) if value else ()


def approval_digest(row: Mapping[str, Any]) -> str | None:
    """The digest of the request the call renders now, which an approval binds to; None when
    it cannot render (the dispatcher then fails it before sending)."""
    if not row["endpoint_url"]:
        return None
    try:
        return request_digest(build_request(row))
    except TemplateError:
        return None


def preview_request(row: Mapping[str, Any]) -> RequestPreview:
    """``row`` has the invocation's id and input and its tool's dispatch settings."""
    warnings = _warnings(row)
    if not row["endpoint_url"]:
        return RequestPreview(
            row["http_method"], error="the tool has no endpoint_url", warnings=warnings
        )
    try:
        rendered = build_request(row)
    except TemplateError as exc:
        return RequestPreview(
            row["http_method"],
            _text(row["endpoint_url"]),
            error=f"{exc.message} (approving fails it with template_error)",
            warnings=warnings,
        )
    headers = [Header(name, _text(value)) for name, value in rendered.headers.items()]
    url: tuple[Part, ...] = _text(rendered.url)
    if _uses_credential(row):
        prefix = auth_prefix(row)
        if row["auth_placement"] == "query":
            sep = "&" if "?" in rendered.url else "?"
            name = quote(row["auth_param_name"], safe="")
            url = (Part(f"{rendered.url}{sep}{name}={prefix}"), SECRET)
        else:
            headers.append(Header(row["auth_param_name"], (*_text(prefix), SECRET)))
    body = None
    if rendered.body is not None:
        if media_type(rendered.headers) is None:  # what the client adds (bodies.py)
            headers.append(Header("Content-Type", _text("application/json")))
        body = shown_body(rendered.body, rendered.headers)
    return RequestPreview(
        rendered.method, url, headers, body, warnings=warnings, digest=request_digest(rendered)
    )


def _uses_credential(row: Mapping[str, Any]) -> bool:
    return row["auth_method"] != "none" or row["credential_ref"] is not None


def _warnings(row: Mapping[str, Any]) -> list[str]:
    found = []
    if row.get("tool_changed"):
        found.append(
            "The tool's configuration changed after this call was made: approving fails it "
            "with tool_changed instead of sending."
        )
    if row["auth_method"] != "none" and row["credential_ref"] is None:
        found.append("The tool has no credential: approving fails it with credential_missing.")
    return found
