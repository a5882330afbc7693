"""Signing in to the approvals page through OpenID Connect (docs/approvals.md).

``GET /approvals/signin/oidc`` starts the code flow (PKCE S256, state, nonce; the flow kept in
the database, used once; its state also in a cookie, so the callback must come back to the
browser that started it) and sends the person to the provider. ``GET /approvals/oidc/callback``
checks all of that, exchanges the code once, validates the ID token and signs the member in
with a session token of their own (the same HttpOnly cookie a pasted token uses).
"""

from __future__ import annotations

import hmac
from typing import Final
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool

from toolrelay.api.approvals import COOKIE, Ctx, _html, _signin
from toolrelay.api.context import ApiContext
from toolrelay.notify import public_url
from toolrelay.signin import AmbiguousMember, SignInError
from toolrelay.signin.sessions import FLOW_TTL_S, PAGE_SESSION_S

router = APIRouter(include_in_schema=False)

STATE_COOKIE: Final = "toolrelay_oidc_state"
CALLBACK_PATH: Final = "/approvals/oidc/callback"


def redirect_uri(request: Request) -> str:
    """Where the provider sends the person back: under TOOLRELAY_PUBLIC_URL when set (behind
    a proxy), else this request's own address; the provider only accepts registered ones."""
    base = public_url() or str(request.base_url).rstrip("/")
    return base + CALLBACK_PATH


@router.get("/approvals/signin/oidc")
async def start(request: Request, context: Ctx, owner: UUID | None = None) -> Response:
    if context.oidc is None:
        return _signin(context, 404, "Sign-in through an identity provider is not set up here.")
    client = request.client.host if request.client else "unknown"
    if context.limiter.take(f"signin:{client}") > 0:  # each start writes a row: bounded
        return _signin(context, 429, "Too many sign-ins from here; wait a moment and retry.")
    try:
        started = await context.oidc.start(redirect_uri(request))
        await run_in_threadpool(context.signins.remember, started, owner)
    except SignInError as exc:
        return _signin(context, 502, f"Sign-in could not start: {exc.message}")
    response = RedirectResponse(started.url, status_code=303)
    response.set_cookie(
        STATE_COOKIE,
        started.state,
        max_age=FLOW_TTL_S,
        path=CALLBACK_PATH,
        httponly=True,
        samesite="lax",  # it must come along on the provider's redirect back
        secure=request.url.scheme == "https",
    )
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get(CALLBACK_PATH)
async def callback(
    request: Request,
    context: Ctx,
    state: str = "",
    code: str = "",
    iss: str | None = None,
    error: str | None = None,
    error_description: str | None = None,
) -> Response:
    if context.oidc is None:
        return _signin(context, 404, "Sign-in through an identity provider is not set up here.")
    try:
        response = await _finish(request, context, state, code, iss, error, error_description)
    except AmbiguousMember as exc:
        response = _signin(context, 409, exc.message, choices=exc.matches)
    except SignInError as exc:
        response = _signin(context, 401, f"Sign-in failed: {exc.message}")
    response.delete_cookie(STATE_COOKIE, path=CALLBACK_PATH)
    return response


async def _finish(
    request: Request,
    context: ApiContext,
    state: str,
    code: str,
    iss: str | None,
    error: str | None,
    error_description: str | None,
) -> Response:
    assert context.oidc is not None
    if not state:
        raise SignInError("the provider's answer carries no state")
    # The flow is used up first, whatever follows: a callback cannot be tried twice.
    flow = await run_in_threadpool(context.signins.consume, state)
    cookie = request.cookies.get(STATE_COOKIE, "")
    if not hmac.compare_digest(cookie.encode(), state.encode()):
        raise SignInError("this sign-in was started in another browser; start it here")
    meta = await context.oidc.metadata()
    context.oidc.check_response_issuer(meta, iss)
    if error is not None:
        said = f"{error}: {error_description}" if error_description else error
        raise SignInError(f"the provider said {said[:300]}")
    if not code:
        raise SignInError("the provider's answer carries no code")
    who = await context.oidc.finish(code, flow.redirect_uri, flow.code_verifier, flow.nonce)
    session = await run_in_threadpool(context.signins.sign_in, who, flow.owner, "page")
    # A page, not a redirect: a cookie set on the provider's cross-site redirect would not be
    # sent (SameSite=Strict) on a redirect that follows it; a navigation from here is ours.
    response = _html(
        "signed_in.html", name=session.name, role=session.role, target=Markup("/approvals")
    )
    response.set_cookie(
        COOKIE,
        session.token,
        max_age=PAGE_SESSION_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response
