"""Errors as JSON: ``{"error": {"code": "<stable code>", "message": "..."}}``, in one place.

toolrelay's exception classes carry the stable code; this module only picks the HTTP
status for each (docs/api.md lists them).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolrelay import errors
from toolrelay.api.schemas import ErrorBody
from toolrelay.db.errors import unstorable_text
from toolrelay.tokens import Unauthenticated

log = logging.getLogger("toolrelay.api")


class RateLimited(errors.ToolrelayError):
    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PayloadTooLarge(errors.ToolrelayError):
    code = "payload_too_large"


# First match wins: subclasses before the classes they extend.
RETRY_SOON = {"Retry-After": "1"}  # the database may be back in a moment

STATUS_BY_ERROR: tuple[tuple[type[errors.ToolrelayError], int], ...] = (
    (Unauthenticated, 401),
    (RateLimited, 429),
    (errors.TooManyPending, 429),
    (PayloadTooLarge, 413),
    (errors.NotFound, 404),
    (errors.PermissionDenied, 403),
    (errors.NotAssigned, 403),
    (errors.InvalidArgument, 422),
    (errors.InvalidInput, 422),
    (errors.TemplateError, 422),
    (errors.Conflict, 409),
    (errors.InvalidState, 409),
    (errors.ApprovalExpired, 409),
    (errors.ToolInactive, 409),
    (errors.NoEndpoint, 409),
    (errors.ConfigurationError, 503),
)

# Codes for errors that do not come from a toolrelay exception.
CODE_BY_STATUS = {
    400: "bad_request",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
}


# What each error status means in /openapi.json; every one carries ErrorBody.
ERROR_DESCRIPTIONS = {
    400: "Malformed request (a body that is not UTF-8 JSON)",
    401: "No token, or one that is unknown, revoked or expired",
    403: "The token may not do this (an agent token on an owner route, an unassigned tool)",
    404: "Not found (or not yours)",
    409: "Conflicts with the current state",
    413: "Request body too large",
    422: "Invalid request",
    429: "Rate limited; see Retry-After",
    503: "Database or configuration unavailable; see Retry-After",
}

# The sets routes are built from: any token (rate-limited, database-backed), a token of the
# wrong kind, and a request body (parsed, size-limited, validated).
AUTHENTICATED = (401, 429, 503)
SPLIT = (*AUTHENTICATED, 403)
BODY = (400, 413, 422)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route that can answer ``statuses``: each with ErrorBody."""
    return {
        status: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[status]}
        for status in sorted(set(statuses))
    }


def status_for(exc: errors.ToolrelayError) -> int:
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return status
    return 500


def error_response(
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    details: Any = None,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def toolrelay_error_response(exc: errors.ToolrelayError) -> JSONResponse:
    status = status_for(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, Unauthenticated):
        headers["WWW-Authenticate"] = 'Bearer realm="toolrelay"'
    if isinstance(exc, RateLimited):
        headers["Retry-After"] = str(max(1, round(exc.retry_after + 0.5)))
    if isinstance(exc, errors.DatabaseUnavailable):
        headers |= RETRY_SOON
    if status == 500:
        # A database error without a mapping: its text may name internals; log it, say less.
        log.error("unmapped error", extra={"action": "api_error", "error": exc.message[:500]})
        return error_response(500, "internal_error", "internal error", headers)
    return error_response(status, exc.code, exc.message, headers)


async def _on_toolrelay_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.ToolrelayError)
    return toolrelay_error_response(exc)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = [_describe(e) for e in exc.errors()]
    message = "; ".join(problems[:3]) + (
        f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    )
    return error_response(422, "invalid_request", message or "invalid request")


def _describe(error: Any) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
    return f"{where}: {error.get('msg', 'invalid')}"


async def _on_http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = CODE_BY_STATUS.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    return error_response(exc.status_code, code, message, dict(exc.headers or {}))


async def _on_database_down(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable", extra={"action": "api_db_error", "error": str(exc)[:200]})
    return error_response(
        503, "database_unavailable", "the database is unavailable; retry later", RETRY_SOON
    )


async def _on_too_deep(_: Request, __: Exception) -> JSONResponse:
    return error_response(400, "bad_request", "the request is nested too deeply")


async def _on_unencodable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnicodeEncodeError)
    said = unstorable_text(exc)  # the request's text, whatever path reached the database
    if isinstance(said, errors.ToolrelayError):
        return toolrelay_error_response(said)
    return await _on_unexpected(request, exc)


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", extra={"action": "api_error"})
    return error_response(500, "internal_error", "internal error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(errors.ToolrelayError, _on_toolrelay_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(psycopg.OperationalError, _on_database_down)
    app.add_exception_handler(RecursionError, _on_too_deep)
    app.add_exception_handler(UnicodeEncodeError, _on_unencodable)
    app.add_exception_handler(Exception, _on_unexpected)
