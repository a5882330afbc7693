"""What approving an invocation will send: the rendered request with the credential masked.

Rendered exactly as the dispatcher renders it (same template function, no schema defaults,
same added headers). The credential is never read, let alone decrypted: its place in the
request shows ``••••`` after the tool's prefix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from toolrelay.dispatch.executor import build_request
from toolrelay.errors import TemplateError

MASK = "••••"

__all__ = ["MASK", "RequestPreview", "preview_request"]


@dataclass(frozen=True)
class RequestPreview:
    method: str
    url: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: str | None = None  # JSON text, indented
    error: str | None = None  # the request cannot be rendered: approving will fail it
    warnings: list[str] = field(default_factory=list)


def preview_request(row: Mapping[str, Any]) -> RequestPreview:
    """``row`` has the invocation's id and input and its tool's dispatch settings."""
    warnings = _warnings(row)
    if not row["endpoint_url"]:
        return RequestPreview(row["http_method"], "", error="the tool has no endpoint_url")
    try:
        rendered = build_request(row)
    except TemplateError as exc:
        return RequestPreview(
            row["http_method"],
            row["endpoint_url"],
            error=f"{exc.message} (approving fails it with template_error)",
            warnings=warnings,
        )
    headers = list(rendered.headers.items())
    url = rendered.url
    if _uses_credential(row):
        masked = f"{row['auth_param_prefix']}{MASK}"
        if row["auth_placement"] == "query":
            url += (
                "&" if "?" in url else "?"
            ) + f"{quote(row['auth_param_name'], safe='')}={masked}"
        else:
            headers.append((row["auth_param_name"], masked))
    body = None
    if rendered.body is not None:
        headers.append(("Content-Type", "application/json"))
        body = json.dumps(rendered.body, indent=2, ensure_ascii=False)
    return RequestPreview(rendered.method, url, headers, body, warnings=warnings)


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
