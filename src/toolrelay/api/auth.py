"""Who is calling: bearer tokens (or a JWT) for /v1, checked once per request, rate-limited."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from toolrelay.api.context import ApiContext, request_context
from toolrelay.api.errors import RateLimited
from toolrelay.api.limits import retry_after_seconds
from toolrelay.errors import PermissionDenied
from toolrelay.tokens import Caller, Unauthenticated

bearer = HTTPBearer(
    auto_error=False,
    description="An owner or agent token from `toolrelay token create`, or an HS256 JWT "
    "whose `sub` is the owner (when TOOLRELAY_JWT_SECRET is set).",
)


def authenticate(request: Request, context: ApiContext, token: str | None) -> Caller:
    """The caller behind ``token``; failures are rate-limited per client address."""
    with failures_limited(request, context):
        caller = context.authenticator.authenticate(presented(token))
    limit(context, caller.rate_key)
    return caller


async def authenticate_async(
    request: Request, context: ApiContext, token: str | None, deferred: bool = False
) -> Caller:
    """``authenticate`` in the event loop: the token's one round trip needs no worker
    thread (db/aio.py), a hand-off that cost more than the query. ``deferred``: the
    request only calls, and a remembered agent token is checked by the call (migration
    0039)."""
    with failures_limited(request, context):
        caller = await context.authenticator.authenticate_async(presented(token), deferred=deferred)
    limit(context, caller.rate_key)
    return caller


def presented(token: str | None) -> str:
    if not token:
        raise Unauthenticated("no bearer token: send 'Authorization: Bearer <token>'")
    return token


@contextmanager
def failures_limited(request: Request, context: ApiContext) -> Iterator[None]:
    """A failed attempt (Unauthenticated) spends a rate token of the client's address."""
    try:
        yield
    except Unauthenticated:
        client = request.client.host if request.client else "unknown"
        limit(context, f"ip:{client}")
        raise


def limit(context: ApiContext, key: str) -> None:
    wait = context.limiter.take(key)
    if wait > 0:
        # the same whole seconds as the Retry-After header (never "retry in 0.0 s")
        raise RateLimited(f"too many requests; retry in {retry_after_seconds(wait)} s", wait)


async def any_caller(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    context: ApiContext = Depends(request_context),
) -> Caller:
    token = credentials.credentials if credentials else None
    return await authenticate_async(request, context, token)


# async: a check without I/O runs in the event loop (a plain def dependency gets a thread)
async def owner_caller(caller: Caller = Depends(any_caller)) -> Caller:
    if caller.is_agent:
        raise PermissionDenied("this needs an owner token; an agent token cannot do it")
    return caller


async def agent_caller(caller: Caller = Depends(any_caller)) -> Caller:
    if not caller.is_agent:
        raise PermissionDenied("this is an agent endpoint; use an agent token")
    return caller


async def calling_agent(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    context: ApiContext = Depends(request_context),
) -> Caller:
    """``agent_caller`` for a request that only makes a call: its token may be left to the
    call's transaction to check (``Caller.unchecked``); a refusal there is a 401 too."""
    token = credentials.credentials if credentials else None
    caller = await authenticate_async(request, context, token, deferred=True)
    return await agent_caller(caller)
