"""The approvals page: an owner signs in with a token, reviews the exact requests pending
invocations would send (credential masked), and approves or rejects them.

Server-rendered (Jinja2, autoescaped), a little plain JS that refreshes the list, no
third-party assets. Text that agents or upstreams control goes through ``shown``: control,
bidi and invisible format characters are drawn as marked escapes (``\\u202e``), never raw;
the masked credential is a badge drawn from ``Part.secret``, not from any text. A pasted
token is traded for a page session's own token (at most 8 hours, revoked by signing out or
by revoking the pasted token), kept in an HttpOnly, SameSite=Strict cookie; every form
carries a CSRF token bound to it, and cross-site form posts are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sys
import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlsplit
from uuid import UUID

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape

from toolrelay.api.auth import authenticate
from toolrelay.api.context import ApiContext, request_context
from toolrelay.errors import PermissionDenied, ToolrelayError
from toolrelay.registry.members import Members
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

Ctx = Annotated[ApiContext, Depends(request_context)]


# --- characters that must not be drawn raw ---------------------------------------------------

# Besides the Cc, Cf, Cs, Zl and Zp categories (C0, DEL, C1; bidi embeddings, overrides,
# isolates and marks; zero-width and other format characters; U+FEFF; line and paragraph
# separators; lone surrogates): the default-ignorable code points of other categories, which
# draw nothing either (combining grapheme joiner, Hangul fillers, Khmer inherent vowels,
# Mongolian and other variation selectors, and the reserved default-ignorable ranges), and
# format characters newer than this Python's Unicode tables (Egyptian hieroglyph controls).
_INVISIBLE = (
    (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2065, 0x2065),
    (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
    (0x13430, 0x1343F), (0xE0000, 0xE0FFF),
)  # fmt: skip
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _hidden_class() -> str:
    every = range(sys.maxunicode + 1)
    points = {c for c in every if unicodedata.category(chr(c)) in _HIDDEN_CATEGORIES}
    for first, last in _INVISIBLE:
        points.update(range(first, last + 1))
    ranges: list[str] = []
    run: list[int] = []
    for point in sorted(points):
        if run and point == run[-1] + 1:
            run[-1] = point
            continue
        if run:
            ranges.append(_range(*run))
        run = [point, point]
    ranges.append(_range(*run))
    return "".join(ranges)


def _range(first: int, last: int) -> str:
    return f"\\U{first:08x}" if first == last else f"\\U{first:08x}-\\U{last:08x}"


_HIDDEN_CLASS = _hidden_class()
_HIDDEN = re.compile(f"[{_HIDDEN_CLASS}]")
_HIDDEN_IN_BLOCK = re.compile(f"(?![\\t\\n])[{_HIDDEN_CLASS}]")  # a body keeps its layout


def shown(value: object, block: bool = False) -> Markup:
    """``value`` as HTML text in which every control, bidi or invisible character is a
    visibly marked escape (``<span class="esc">\\u202e</span>``) instead of itself; with
    ``block`` tabs and newlines stay (the indented JSON body)."""
    text = "" if value is None else str(value)
    pattern = _HIDDEN_IN_BLOCK if block else _HIDDEN
    pieces: list[Markup] = []
    pos = 0
    for match in pattern.finditer(text):
        pieces.append(escape(text[pos : match.start()]))
        pieces.append(_escape_mark(match.group()))
        pos = match.end()
    if not pieces:
        return escape(text)
    pieces.append(escape(text[pos:]))
    return Markup("").join(pieces)


def _escape_mark(char: str) -> Markup:
    point = ord(char)
    code = f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"
    name = unicodedata.name(char, "") or (
        "control character" if unicodedata.category(char) == "Cc" else "invisible character"
    )
    return Markup('<span class="esc" title="U+{:04X} {}">{}</span>').format(point, name, code)


_env.filters["shown"] = shown


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


def _html(
    template: str, status: int = 200, form_to: str | None = None, **values: Any
) -> HTMLResponse:
    """A page under a strict CSP; ``form_to`` is one more origin a form's redirect may reach
    (a connect's provider: CSP's form-action covers the redirect after a post)."""
    nonce = secrets.token_urlsafe(16)
    form_action = "'self'" + (f" {form_to}" if form_to else "")
    body = _env.get_template(template).render(nonce=nonce, refresh=REFRESH_SECONDS, **values)
    response = HTMLResponse(body, status_code=status)
    response.headers.update(
        {
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                f"connect-src 'self'; form-action {form_action}; img-src 'self' data:; "
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
    recent = [  # settled ones, however many wait (before: 16 pending hid them all)
        {"row": row, "age": _ago(row["updated_at"], now)}
        for row in registry.list_invocations(limit=RECENT_LIMIT, settled=True)
    ]
    total = registry.pending_count() if len(pending) >= QUEUE_LIMIT else len(pending)
    return {
        "pending": pending, "pending_total": total, "recent": recent,
        "csrf": _csrf(context, request),
    }  # fmt: skip


def _page(
    context: ApiContext, caller: Caller, request: Request, status: int = 200, **notice: Any
) -> HTMLResponse:
    values = _queue_values(context, caller, request)
    return _html("approvals.html", status, **values, who=_who(context, caller), **notice)


def _who(context: ApiContext, caller: Caller) -> str:
    """Who the page is signed in as, for its bar."""
    if caller.member_id is None:
        return "the owner (a tenant token)"
    member = Members(context.db).get(caller, caller.member_id)
    return f"{member.name} ({member.role})"


def _signin(
    context: ApiContext, status: int = 200, error: str | None = None, **values: Any
) -> HTMLResponse:
    oidc = context.oidc.settings.name if context.oidc else None
    return _html("signin.html", status, error=error, oidc_name=oidc, **values)


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
        response = _signin(context, error="Your session ended; sign in again." if expired else None)
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
        return _signin(context, 401, f"That token was not accepted: {exc.message}")
    if caller.is_agent:
        return _signin(
            context, 403, "That is an agent token. Agents cannot approve; use an owner token."
        )
    session = context.signins.page_session(token.strip())
    if session is None:  # revoked or expired between the two statements
        return _signin(context, 401, "That token was not accepted: it ended as you signed in")
    response = RedirectResponse("/approvals", status_code=303)
    response.set_cookie(
        COOKIE,
        session,
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
    token = request.cookies.get(COOKIE)
    if token:
        context.signins.sign_out(token)  # the page's session token ends
    response = RedirectResponse("/approvals", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.post("/approvals/bulk-approve")
def bulk_approve(
    request: Request,
    context: Ctx,
    csrf: Annotated[str, Form()] = "",
    pick: Annotated[list[str] | None, Form()] = None,
) -> Response:
    """Approve the selected cards, each bound to the digest of the request its card showed
    (``<id>:<digest>``): one that would now send anything else is not approved, and said."""
    caller = _session(request, context)
    if caller is None:
        return RedirectResponse("/approvals", status_code=303)
    _check_csrf(context, request, csrf)
    registry = context.registry(caller)
    picks = (pick or [])[:QUEUE_LIMIT]
    approved, failed = 0, []
    for item in picks:
        ident, _, digest = item.partition(":")
        try:
            registry.approve(UUID(ident), digest or None)
            approved += 1
        except ValueError:
            failed.append(f"{ident[:40]!r} is not a call's id.")
        except ToolrelayError as exc:
            failed.append(exc.message)
    bulk = {"asked": len(picks), "approved": approved, "failed": failed}
    return _page(context, caller, request, status=409 if failed else 200, bulk=bulk)


@router.post("/approvals/{invocation_id}/approve")
def approve(
    invocation_id: UUID,
    request: Request,
    context: Ctx,
    csrf: Annotated[str, Form()] = "",
    digest: Annotated[str, Form()] = "",
) -> Response:
    # The digest of the request the card showed: when the call would now send anything
    # else (the tool changed meanwhile), nothing is approved and the page says why.
    return _decide(request, context, csrf, invocation_id, None, approve=True, digest=digest)


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
    digest: str = "",
) -> Response:
    caller = _session(request, context)
    if caller is None:
        return RedirectResponse("/approvals", status_code=303)
    _check_csrf(context, request, csrf)
    registry = context.registry(caller)
    try:
        if approve:
            registry.approve(invocation_id, digest or None)
        else:
            registry.reject(invocation_id, reason)
    except ToolrelayError as exc:
        return _page(context, caller, request, status=409, error=exc.message)
    done = "approved" if approve else "rejected"
    return RedirectResponse(f"/approvals?{done}={invocation_id}", status_code=303)
