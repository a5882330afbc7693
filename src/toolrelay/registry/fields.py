"""What each tool field accepts, checked before anything is written.

The database enforces the same rules with constraints, but a constraint violation names the
constraint, not the field, the value and what is allowed. These checks do, for every door
that goes through Registry (CLI, API, YAML, OpenAPI import).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from toolrelay.errors import InvalidArgument
from toolrelay.registry.models import AUTH_METHODS, EGRESS_CLASSES, HTTP_METHODS, TOOL_STATUSES

INVOCATION_STATUSES = ("pending", "running", "completed", "failed", "rejected", "expired")
AUTH_PLACEMENTS = ("header", "query")
TEMPLATE_MEMBERS = ("headers", "query", "body")

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_URL = re.compile(r"^https?://[^/?#]+", re.IGNORECASE)

Check = Callable[[Any], str | None]  # the problem with a value, or None when it is fine


def one_of(allowed: tuple[str, ...]) -> Check:
    def check(value: Any) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(allowed)}"

    return check


def number(low: float, high: float, *, integer: bool = False, low_open: bool = False) -> Check:
    kind = "a whole number" if integer else "a number"
    bounds = f"{'more than' if low_open else 'at least'} {low:g} and at most {high:g}"

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be {kind}, {bounds}"
        if integer and not isinstance(value, int):
            return f"must be {kind}, {bounds}"
        if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
            return f"must be {kind}, {bounds}"
        return None

    return check


def _text(pattern: re.Pattern[str], what: str) -> Check:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) and pattern.match(value) else what

    return check


def _not_blank(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must not be empty"


def _object(value: Any) -> str | None:
    return None if isinstance(value, Mapping) else "must be a JSON object"


def _template(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return "must be a JSON object with optional members headers, query and body"
    extra = sorted(set(value) - set(TEMPLATE_MEMBERS))
    return f"may only have the members headers, query and body (not {extra})" if extra else None


def _pointer(value: Any) -> str | None:
    ok = isinstance(value, str) and (value == "" or value.startswith("/"))
    return None if ok else "must be a JSON Pointer starting with '/' (or empty)"


def _prefix(value: Any) -> str | None:
    ok = isinstance(value, str) and "\r" not in value and "\n" not in value
    return None if ok else "must be text without line breaks"


RULES: dict[str, Check] = {
    "key": _text(_KEY, "must be 1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit"),
    "name": _not_blank,
    "endpoint_url": _text(_URL, "must be an http:// or https:// URL with a host"),
    "http_method": one_of(HTTP_METHODS),
    "auth_method": one_of(AUTH_METHODS),
    "egress_class": one_of(EGRESS_CLASSES),
    "auth_placement": one_of(AUTH_PLACEMENTS),
    "status": one_of(TOOL_STATUSES),
    "schema_input": _object,
    "schema_output": _object,
    "request_template": _template,
    "response_pointer": _pointer,
    "auth_param_prefix": _prefix,
    "connect_timeout_seconds": number(0, 600, low_open=True),
    "timeout_seconds": number(0, 3600, low_open=True),
    "max_response_bytes": number(1, 1024**3, integer=True),
    "max_attempts": number(1, 20, integer=True),
    "max_concurrency": number(1, 1_000_000, integer=True),
    "approval_ttl_seconds": number(1, 10 * 365 * 86400, integer=True),
    "approvals_required": number(1, 10, integer=True),
}  # fmt: skip


def check_fields(where: str, values: Mapping[str, Any]) -> None:
    """Raise InvalidArgument naming the field, the value and what is allowed."""
    for field, value in values.items():
        rule = RULES.get(field)
        if rule is None or value is None:
            continue
        problem = rule(value)
        if problem is not None:
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "…"
            raise InvalidArgument(f"{where}: {field} {shown} is not allowed: it {problem}")


def check_status(status: str | None) -> None:
    if status is not None and status not in INVOCATION_STATUSES:
        raise InvalidArgument(
            f"status {status!r} is not an invocation status: use one of"
            f" {', '.join(INVOCATION_STATUSES)}"
        )


def check_limit(limit: int, most: int = 1000) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most:
        raise InvalidArgument(f"limit {limit!r} is not allowed: it must be from 1 to {most}")
