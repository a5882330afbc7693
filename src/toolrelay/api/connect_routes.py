"""Connecting an account from the API and the approvals page (issue 17; docs/credentials.md).

``POST /v1/credentials/connect`` (an admin) starts a flow and answers with ``connect_url``:
the page where the same member, signed in, sees what will be connected and continues to the
provider. The flow is bound to that member's session (another person opening the link gets
nothing from it: the phishing that makes a victim connect their account into an attacker's
organization), its state is single use and also in a cookie of the browser that continued,
and ``GET /v1/oauth/callback`` stores the tokens sealed as an ``oauth`` credential, or says
why nothing was stored. ``/approvals/credentials`` lists credentials with Connect and, for
one that needs it, Reconnect.
"""

from __future__ import annotations

import hmac
import re
from datetime import datetime
from typing import Annotated, Final
from urllib.parse import urlsplit
from uuid import UUID

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from toolrelay.api.approvals import Ctx, _check_csrf, _csrf, _html, _session, _signin
from toolrelay.api.auth import owner_caller
from toolrelay.api.context import ApiContext
from toolrelay.api.errors import BODY, SPLIT, error_responses
from toolrelay.credentials import connect as flow
from toolrelay.credentials.connect_flows import FLOW_TTL_S, ConnectFlows, FlowRow
from toolrelay.dispatch.egress import EgressPolicy, make_connector
from toolrelay.dispatch.http import outbound_session
from toolrelay.errors import InvalidArgument, PermissionDenied, ToolrelayError
from toolrelay.notify import public_url
from toolrelay.tokens import Caller

router = APIRouter(prefix="/v1")
pages = APIRouter(include_in_schema=False)

CALLBACK_PATH: Final = "/v1/oauth/callback"
STATE_COOKIE: Final = "toolrelay_connect_state"
Owner = Annotated[Caller, Depends(owner_caller)]


class ConnectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: str | None = Field(
        None, description="A preset (github, google, slack, microsoft, oidc, …); a reconnect"
        " defaults to the one the credential was connected with.",
    )  # fmt: skip
    name: str | None = Field(None, max_length=200)
    client_id: str | None = Field(None, max_length=500)
    client_secret: str | None = Field(None, max_length=2000, description="Sealed at once.")
    scopes: list[str] = Field(default_factory=list)
    issuer: str | None = Field(None, max_length=2000, description="For the oidc preset.")
    parameters: dict[str, str] = Field(default_factory=dict)
    allowed_hosts: list[str] = Field(default_factory=list)
    credential: UUID | None = Field(
        None, description="Reconnect this oauth credential: same id, new tokens."
    )


class ConnectOut(BaseModel):
    id: UUID
    connect_url: str = Field(description="Open it signed in to the approvals page as yourself.")
    expires_at: datetime


def _flows(context: ApiContext) -> ConnectFlows:
    return ConnectFlows(context.db, context.settings.keyring)


def _base(request: Request) -> str:
    return public_url() or str(request.base_url).rstrip("/")


def _egress(context: ApiContext) -> EgressPolicy:
    return context.settings.egress or EgressPolicy.from_env()


def begin(context: ApiContext, caller: Caller, body: ConnectIn) -> tuple[UUID, datetime]:
    flows = _flows(context)
    provider, issuer, parameters = body.provider, body.issuer, body.parameters
    if body.credential is not None and provider is None:
        known = flows.connected_with(caller, body.credential)
        if known is None:
            raise InvalidArgument(
                f"credential {body.credential} was not connected here: give the provider"
            )
        provider, issuer = known["provider"], issuer or known["issuer"]
        parameters = parameters or dict(known["parameters"])
    if provider is None:
        raise InvalidArgument("give the provider (github, google, slack, microsoft, oidc…)")
    return flows.begin(
        caller, provider, body.name, body.client_id, body.client_secret,
        flow.scopes_of(body.scopes), issuer, parameters, tuple(body.allowed_hosts),
        body.credential,
    )  # fmt: skip


@router.post(
    "/credentials/connect",
    operation_id="connectCredential",
    status_code=201,
    responses=error_responses(*SPLIT, *BODY, 404),
    tags=["credentials"],
    summary="Start connecting an account (an admin): open connect_url, signed in as yourself",
)
def connect(body: ConnectIn, request: Request, context: Ctx, caller: Owner) -> ConnectOut:
    flow_id, expires = begin(context, caller, body)
    return ConnectOut(id=flow_id, connect_url=f"{_base(request)}/approvals/connect/{flow_id}",
                      expires_at=expires)  # fmt: skip


# --- the page: review and continue, in the browser of the member who started it -------------


def _mine(context: ApiContext, request: Request, flow_id: UUID) -> tuple[Caller, FlowRow]:
    caller = _session(request, context)
    if caller is None:
        raise PermissionDenied("sign in to the approvals page first, then open the link again")
    row = _flows(context).get(flow_id)
    if (row.owner, row.member_id) != (caller.owner, caller.member_id):
        raise PermissionDenied("this connect was started by someone else; start your own")
    return caller, row


@pages.get("/approvals/connect/{flow_id}")
async def review(flow_id: UUID, request: Request, context: Ctx) -> Response:
    try:
        _, row = await run_in_threadpool(_mine, context, request, flow_id)
        connection = await run_in_threadpool(_flows(context).connection, row)
        async with outbound_session(make_connector(_egress(context))) as http:
            found = await flow.endpoints(http, connection)
    except ToolrelayError as exc:
        return await run_in_threadpool(_problem, context, request, exc)
    return _html("connect.html", form_to=_origin(found.authorization), row=row,
                 preset=connection.preset, csrf=_csrf(context, request))  # fmt: skip


def _origin(url: str) -> str | None:
    """``url``'s origin for a CSP source (nothing else: no user info, no ';')."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not re.fullmatch(r"[A-Za-z0-9.-]+", host):
        return None
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


@pages.post("/approvals/connect/{flow_id}")
async def go(
    flow_id: UUID, request: Request, context: Ctx, csrf: Annotated[str, Form()] = ""
) -> Response:
    try:
        _check_csrf(context, request, csrf)
        _, row = await run_in_threadpool(_mine, context, request, flow_id)
        flows = _flows(context)
        connection = await run_in_threadpool(flows.connection, row)
        async with outbound_session(make_connector(_egress(context))) as http:
            started = await flow.start(http, connection, _base(request) + CALLBACK_PATH)
        await run_in_threadpool(flows.continued, row, started)
    except ToolrelayError as exc:
        return _problem(context, request, exc)
    response = RedirectResponse(started.url, status_code=303)
    response.set_cookie(
        STATE_COOKIE, started.state, max_age=FLOW_TTL_S, path=CALLBACK_PATH, httponly=True,
        samesite="lax", secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


@router.get("/oauth/callback", include_in_schema=False)
async def callback(
    request: Request,
    context: Ctx,
    state: str = "",
    code: str = "",
    error: str | None = None,
    error_description: str | None = None,
) -> Response:
    response: Response
    try:
        made, row = await _finish(request, context, state, code, error, error_description)
        response = _html("connected.html", made=made, row=row, preset=flow.preset(row.provider))
    except ToolrelayError as exc:
        response = _problem(context, request, exc, stored_nothing=True)
    response.delete_cookie(STATE_COOKIE, path=CALLBACK_PATH)
    return response


async def _finish(
    request: Request,
    context: ApiContext,
    state: str,
    code: str,
    error: str | None,
    error_description: str | None,
) -> tuple[UUID, FlowRow]:
    if not state:
        raise flow.ConnectError("the provider's answer carries no state")
    flows = _flows(context)
    row = await run_in_threadpool(flows.consume, state)  # used up first, whatever follows
    cookie = request.cookies.get(STATE_COOKIE, "")
    if not hmac.compare_digest(cookie.encode(), state.encode()):
        raise flow.ConnectError("this connect was continued in another browser")
    if error is not None:
        said = f"{error}: {error_description}" if error_description else error
        raise flow.ConnectError(f"the provider said {said[:300]}")
    if not code:
        raise flow.ConnectError("the provider's answer carries no code")
    connection = await run_in_threadpool(flows.connection, row)
    assert row.nonce and row.code_verifier and row.redirect_uri
    started = flow.Started("", state, row.nonce, row.code_verifier, row.redirect_uri)
    async with outbound_session(make_connector(_egress(context))) as http:
        secret = await flow.exchange(http, connection, started, code)
    return await run_in_threadpool(flows.store, row, secret), row


def _problem(
    context: ApiContext, request: Request, exc: ToolrelayError, stored_nothing: bool = False
) -> Response:
    message = exc.message + ("; nothing was stored" if stored_nothing else "")
    if _session(request, context) is None:
        return _signin(context, 403, f"Connect: {message}")
    return _html("connected.html", 400, made=None, error=message, csrf=_csrf(context, request))


# --- the credentials page ----------------------------------------------------------------------


@pages.get("/approvals/credentials")
def credentials_page(request: Request, context: Ctx) -> Response:
    caller = _session(request, context)
    if caller is None:
        return _signin(context, 401, "Sign in to see your credentials.")
    listed = context.credentials.list(caller)
    return _html("credentials.html", credentials=listed, presets=flow.presets(),
                 csrf=_csrf(context, request))  # fmt: skip


@pages.post("/approvals/credentials/connect")
def connect_from_page(
    request: Request,
    context: Ctx,
    csrf: Annotated[str, Form()] = "",
    provider: Annotated[str, Form()] = "",
    name: Annotated[str, Form()] = "",
    client_id: Annotated[str, Form()] = "",
    client_secret: Annotated[str, Form()] = "",
    scopes: Annotated[str, Form()] = "",
    issuer: Annotated[str, Form()] = "",
    credential: Annotated[str, Form()] = "",
) -> Response:
    try:
        _check_csrf(context, request, csrf)
        caller = _session(request, context)
        if caller is None:
            raise PermissionDenied("sign in first")
        body = ConnectIn(
            provider=provider or None, name=name or None, client_id=client_id or None,
            client_secret=client_secret or None, scopes=[scopes] if scopes else [],
            issuer=issuer or None, credential=UUID(credential) if credential else None,
        )  # fmt: skip
        flow_id, _ = begin(context, caller, body)
    except (ToolrelayError, ValueError) as exc:
        error = exc if isinstance(exc, ToolrelayError) else InvalidArgument(str(exc))
        return _problem(context, request, error)
    return RedirectResponse(f"/approvals/connect/{flow_id}", status_code=303)
