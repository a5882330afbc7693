"""The approvals page: an owner signs in with a token, reviews the exact requests pending
invocations would send (credential masked), and approves or rejects them.

Server-rendered (Jinja2, autoescaped), a little plain JS that refreshes the list, no
third-party assets. The owner token lives in an HttpOnly, SameSite=Strict cookie; every
form carries a CSRF token bound to it, and cross-site form posts are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlsplit
from uuid import UUID

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from toolrelay.api.auth import authenticate
from toolrelay.api.context import ApiContext, get_context
from toolrelay.errors import PermissionDenied, ToolrelayError
from toolrelay.registry.preview import preview_request
from toolrelay.tokens import Caller, Unauthenticated, hash_token

router = APIRouter(include_in_schema=False)

COOKIE = "toolrelay_session"
SESSION_MAX_AGE = 8 * 3600  # seconds a sign-in lasts
REFRESH_SECONDS = 4  # how often the page refreshes its list
QUEUE_LIMIT = 100
RECENT_LIMIT = 8
SOON = 3600  # seconds: an expiry closer than this is highlighted

_env = Environment(
    loader=PackageLoader("toolrelay.api", "templates"),
    autoescape=select_autoescape(("html",)),
    trim_blocks=True,
    lstrip_blocks=True,
)

Ctx = Annotated[ApiContext, Depends(get_context)]


# --- sessions and CSRF -----------------------------------------------------------------------


def _session(request: Request, context: ApiContext) -> Caller | None:
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        caller = authenticate(request, context, token)
    except Unauthenticated:
        return None
    return None if caller.is_agent else caller


def _csrf(context: ApiContext, request: Request) -> str:
    token = request.cookies.get(COOKIE, "")
    return hmac.new(context.csrf_key, b"csrf:" + hash_token(token), hashlib.sha256).hexdigest()


def _check_form_origin(request: Request) -> None:
    """Refuse a form posted from another site (besides SameSite=Strict and the CSRF token)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise PermissionDenied("cross-site form posts are refused")
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        parts = urlsplit(origin)
        if parts.netloc != request.headers.get("host", ""):
            raise PermissionDenied("the form was posted from another origin")


def _check_csrf(context: ApiContext, request: Request, submitted: str) -> None:
    _check_form_origin(request)
    if not hmac.compare_digest(submitted, _csrf(context, request)):
        raise PermissionDenied("the form is stale or was not made by this page; reload it")


# --- rendering -------------------------------------------------------------------------------


def _html(template: str, status: int = 200, **values: Any) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    body = _env.get_template(template).render(nonce=nonce, refresh=REFRESH_SECONDS, **values)
    response = HTMLResponse(body, status_code=status)
    response.headers.update(
        {
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                "connect-src 'self'; form-action 'self'; img-src 'self' data:; "
                "base-uri 'none'; frame-ancestors 'none'"
            ),
            "X-Frame-Options": "DENY",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        }
    )
    return response


def _ago(when: datetime, now: datetime) -> str:
    seconds = int((now - when).total_seconds())
    if seconds < 10:
        return "just now"
    return f"{_span(seconds)} ago"


def _until(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "never"
    seconds = int((when - now).total_seconds())
    return "now" if seconds <= 0 else f"in {_span(seconds)}"


def _span(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _queue_values(context: ApiContext, caller: Caller, request: Request) -> dict[str, Any]:
    registry = context.registry(caller)
    registry.expire_pending()
    now = datetime.now(UTC)
    pending = [
        {
            "row": row,
            "preview": preview_request(row),
            "age": _ago(row["created_at"], now),
            "expires": _until(row["approval_expires_at"], now),
            "expires_soon": row["approval_expires_at"] is not None
            and (row["approval_expires_at"] - now).total_seconds() < SOON,
        }
        for row in registry.review_queue(QUEUE_LIMIT)
    ]
    recent = [
        {"row": row, "age": _ago(row["updated_at"], now)}
        for row in registry.list_invocations(limit=RECENT_LIMIT * 2)
        if row["status"] != "pending"
    ][:RECENT_LIMIT]
    return {"pending": pending, "recent": recent, "csrf": _csrf(context, request)}


def _page(
    context: ApiContext, caller: Caller, request: Request, status: int = 200, **notice: Any
) -> HTMLResponse:
    values = _queue_values(context, caller, request)
    return _html("approvals.html", status, **values, **notice)


def _signin(status: int = 200, error: str | None = None) -> HTMLResponse:
    return _html("signin.html", status, error=error)


# --- routes ----------------------------------------------------------------------------------


@router.get("/approvals")
def page(
    request: Request,
    context: Ctx,
    approved: UUID | None = None,
    rejected: UUID | None = None,
) -> Response:
    caller = _session(request, context)
    if caller is None:
        expired = request.cookies.get(COOKIE) is not None
        response = _signin(error="Your session ended; sign in again." if expired else None)
        if expired:
            response.delete_cookie(COOKIE, path="/")
        return response
    return _page(context, caller, request, approved=approved, rejected=rejected)


@router.get("/approvals/queue")
def queue(request: Request, context: Ctx) -> Response:
    caller = _session(request, context)
    if caller is None:
        return HTMLResponse("signed out", status_code=401, headers={"Cache-Control": "no-store"})
    return _html("_queue.html", **_queue_values(context, caller, request))


@router.post("/approvals/session")
def sign_in(request: Request, context: Ctx, token: Annotated[str, Form()] = "") -> Response:
    try:
        _check_form_origin(request)
        caller = authenticate(request, context, token.strip())
    except Unauthenticated as exc:
        return _signin(401, f"That token was not accepted: {exc.message}")
    if caller.is_agent:
        return _signin(403, "That is an agent token. Agents cannot approve; use an owner token.")
    response = RedirectResponse("/approvals", status_code=303)
    response.set_cookie(
        COOKIE,
        token.strip(),
        max_age=SESSION_MAX_AGE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/approvals/signout")
def sign_out(request: Request, context: Ctx, csrf: Annotated[str, Form()] = "") -> Response:
    _check_csrf(context, request, csrf)
    response = RedirectResponse("/approvals", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.post("/approvals/{invocation_id}/approve")
def approve(
    invocation_id: UUID, request: Request, context: Ctx, csrf: Annotated[str, Form()] = ""
) -> Response:
    return _decide(request, context, csrf, invocation_id, None, approve=True)


@router.post("/approvals/{invocation_id}/reject")
def reject(
    invocation_id: UUID,
    request: Request,
    context: Ctx,
    csrf: Annotated[str, Form()] = "",
    reason: Annotated[str, Form(max_length=2000)] = "",
) -> Response:
    reason = reason.replace("\x00", "").strip()
    return _decide(request, context, csrf, invocation_id, reason or None, approve=False)


def _decide(
    request: Request,
    context: ApiContext,
    csrf: str,
    invocation_id: UUID,
    reason: str | None,
    approve: bool,
) -> Response:
    caller = _session(request, context)
    if caller is None:
        return RedirectResponse("/approvals", status_code=303)
    _check_csrf(context, request, csrf)
    registry = context.registry(caller)
    try:
        if approve:
            registry.approve(invocation_id)
        else:
            registry.reject(invocation_id, reason)
    except ToolrelayError as exc:
        return _page(context, caller, request, status=409, error=exc.message)
    done = "approved" if approve else "rejected"
    return RedirectResponse(f"/approvals?{done}={invocation_id}", status_code=303)
