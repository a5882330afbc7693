"""Streamable HTTP at ``/mcp`` on ``toolrelay serve``, one agent per bearer token.

Every HTTP request is authenticated before the MCP SDK sees it, the same way as /v1 (the
same ``Authenticator`` and JSON errors): no or a bad token is 401, an owner token 403. An
access token from one of TOOLRELAY_MCP_AUTHORIZATION_SERVERS is validated by oauth.py (on
the event loop: its keys may need fetching) and acts as the agent bound to its subject.
The rate limit counts tool calls only (429 with Retry-After, the body saying the same). The caller is kept on the ASGI scope, where the MCP handlers read it from the
request that carried each message, so every message acts as the agent whose token came
with it. The SDK also binds a session to the agent that opened it: another agent's token
presenting that session id gets 404, as if it did not exist; and each agent, and each
owner (all its agents together), holds at most its share of the process's sessions
(sessions.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final
from uuid import UUID

from fastapi import APIRouter, FastAPI
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.authentication import AuthCredentials
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from yarl import URL

from toolrelay.api.auth import failures_limited, limit, presented
from toolrelay.api.errors import RateLimited, error_response, toolrelay_error_response
from toolrelay.api.limits import retry_after_seconds
from toolrelay.errors import ConfigurationError, PermissionDenied, ToolrelayError
from toolrelay.mcp.limits import MAX_SESSIONS, SESSIONS_PER_AGENT_ENV, SESSIONS_PER_OWNER_ENV
from toolrelay.mcp.oauth import (
    AUTHORIZATION_SERVERS_ENV,
    OAuthBindings,
    ResourceServer,
    authorization_servers,
)
from toolrelay.mcp.server import STATUS_TOOL, McpSettings, agent_only, build_server
from toolrelay.mcp.sessions import SessionShare, Victim
from toolrelay.notify.payloads import PUBLIC_URL_ENV, public_url
from toolrelay.tokens import Caller, Unauthenticated

if TYPE_CHECKING:
    from toolrelay.api.context import ApiContext

__all__ = [
    "AUTHORIZATION_SERVERS_ENV",
    "MCP_PATH",
    "McpEndpoint",
    "McpShortcut",
    "authorization_servers",
    "mcp_router",
    "mount_mcp",
]

log = logging.getLogger("toolrelay.mcp")

MCP_PATH: Final = "/mcp"
# RFC 9728: where an MCP client finds how to get a token for /mcp (the path-suffixed form,
# and the bare one for clients that look there).
METADATA_PATHS: Final = ("/.well-known/oauth-protected-resource/mcp",
                         "/.well-known/oauth-protected-resource")  # fmt: skip
SCOPE_KEY: Final = "toolrelay.caller"
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SESSION_IDLE_TIMEOUT: Final = 30 * 60.0  # seconds; a client then opens a new session
SESSION_HEADER: Final = "mcp-session-id"
VERSION_HEADER: Final = "mcp-protocol-version"


async def caller_from_request(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """The agent authenticated for the HTTP request that carried this message."""
    request = ctx.request
    caller = request.scope.get(SCOPE_KEY) if isinstance(request, Request) else None
    if not isinstance(caller, Caller):
        raise MCPError(INVALID_REQUEST, "unauthenticated")
    return caller


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _foreign_origin(request: Request) -> bool:
    """A browser page from another origin (DNS rebinding, CSRF): MCP asks servers to refuse.

    Tokens are never ambient (no cookies), so this is defence in depth.
    """
    origin = request.headers.get("origin")
    if origin is None:
        return False
    try:
        parsed = URL(origin)
        host = request.headers.get("host", "")
        return parsed.host is None or f"{parsed.host}:{parsed.port}" != _authority(
            host, parsed.scheme
        )
    except ValueError:
        return True


def _authority(host: str, scheme: str) -> str:
    """``host[:port]`` of the Host header with the scheme's default port made explicit."""
    url = URL(f"{scheme}://{host}")
    return f"{url.host}:{url.port}"


class McpEndpoint:
    """The ASGI app at /mcp: authenticate, then hand over to the SDK's session manager."""

    def __init__(self, context: ApiContext, settings: McpSettings | None = None) -> None:
        self.context = context
        # Read when the app is built, as the rest of MCP's settings are.
        self.issuers = authorization_servers()
        self.public_url = public_url()
        self.oauth = ResourceServer(self.issuers) if self.issuers else None
        self.bindings = OAuthBindings(context.db)
        self.server = build_server(
            context.db, caller_from_request, settings, context.outcomes, context.handoff,
            context.authenticator.forget,
        )  # fmt: skip
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            # Host/Origin checks are done here (any Host may be legitimate behind a proxy).
            security_settings=None,
            session_idle_timeout=SESSION_IDLE_TIMEOUT,
            max_sessions=MAX_SESSIONS,
        )
        settings = settings or McpSettings()
        self.sessions = SessionShare(
            settings.sessions_per_agent, SESSION_IDLE_TIMEOUT,
            per_owner=settings.sessions_per_owner,
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if _foreign_origin(request):
            response = error_response(
                403, "permission_denied", "cross-origin requests to /mcp are refused"
            )
            await response(scope, receive, send)
            return
        token = _bearer(request)
        calls, body = (False, False), b""
        try:
            if scope.get("method") == "POST":
                body, receive = await _buffered(receive)
                calls = _tool_calls(body)
            if self.oauth is not None and token is not None and self.oauth.handles(token):
                caller = await self._oauth_caller(request, self.oauth, token)
            else:  # toolrelay's own tokens: a lone call checks a remembered one itself
                caller = agent_only(await self._authenticate(request, deferred=calls[1]))
            if calls[0]:
                self._limit(caller)
            opening = scope.get("method") == "POST" and _opens_session(request, body)
            victim = self._admit(caller) if opening else None
        except ToolrelayError as exc:
            response = toolrelay_error_response(exc)
            if isinstance(exc, Unauthenticated):  # MCP's authorization: say where to look
                metadata = f"{self.base_url(request)}{METADATA_PATHS[0]}"
                error = ' error="invalid_token",' if token is not None else ""  # RFC 6750 3.1
                response.headers["WWW-Authenticate"] = (
                    f'Bearer realm="toolrelay",{error} resource_metadata="{metadata}"'
                )
            await response(scope, receive, send)
            return
        scope[SCOPE_KEY] = caller
        scope["user"] = _principal(caller.agent_id)
        scope["auth"] = AuthCredentials([])
        if opening:
            await self._open(caller, victim, scope, receive, send)
        else:
            await self._on_session(caller, request, scope, receive, send)

    def _admit(self, caller: Caller) -> tuple[Victim, str] | None:
        """Room for one more session of this agent (and of its owner): the session to end
        first, if any, and which share was full ("agent" or "owner")."""
        admission = self.sessions.admit(caller.owner, _agent(caller))
        if not admission.admitted:
            if admission.full == "owner":
                held = f"this agent's owner has {self.sessions.per_owner} MCP sessions open"
                env = SESSIONS_PER_OWNER_ENV
            else:
                held = f"this agent has {self.sessions.per_agent} MCP sessions open"
                env = SESSIONS_PER_AGENT_ENV
            raise RateLimited(
                f"{held}, each with a request in flight ({env}); end one (DELETE /mcp with"
                " its Mcp-Session-Id) or retry once one is idle",
                1.0,
            )
        if admission.victim is None:
            return None
        return admission.victim, f"sessions_per_{admission.full}"

    async def _open(
        self,
        caller: Caller,
        victim: tuple[Victim, str] | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """An admitted opening request: end the session it takes the place of, then let the
        SDK open the new one, and count it when its answer says it was opened."""
        answer = _Answer(send)
        try:
            if victim is not None:
                await self._end_session(caller, *victim, scope)
            await self.manager.handle_request(scope, receive, answer.send)
        finally:
            if answer.session is not None and answer.status < 400:
                self.sessions.opened(caller.owner, _agent(caller), answer.session)
            self.sessions.settled(caller.owner, _agent(caller))

    async def _on_session(
        self, caller: Caller, request: Request, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Any other request: counted in flight on its session while it is served."""
        session = request.headers.get(SESSION_HEADER)
        if session is None or not self.sessions.begin(caller.owner, _agent(caller), session):
            await self.manager.handle_request(scope, receive, send)
            return
        answer = _Answer(send)
        try:
            await self.manager.handle_request(scope, receive, answer.send)
        finally:
            closed = scope.get("method") == "DELETE" and answer.status < 300
            ended = closed or answer.status == 404
            self.sessions.end(caller.owner, _agent(caller), session, ended=ended)

    async def _end_session(self, caller: Caller, victim: Victim, reason: str, scope: Scope) -> None:
        """End one of the caller's own sessions, or of its owner's other agents, to make
        room, as its client's DELETE would (as the agent holding it: the SDK checks that);
        its client's next request gets 404."""
        kept = ("type", "http_version", "scheme", "server", "client", "auth")
        ending: dict[str, Any] = {key: scope[key] for key in kept if key in scope}
        session = victim.session
        ending |= {
            "user": _principal(victim.agent),
            "method": "DELETE", "path": MCP_PATH, "raw_path": MCP_PATH.encode(),
            "root_path": "", "query_string": b"",
            "headers": [(SESSION_HEADER.encode("ascii"), session.encode("latin-1"))],
        }  # fmt: skip
        asked = False

        async def receive() -> Message:
            nonlocal asked
            if asked:
                return {"type": "http.disconnect"}
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(_: Message) -> None:
            return None

        await self.manager.handle_request(ending, receive, discard)
        log.info(
            "an MCP session was ended to make room for a newer one of the same "
            + ("agent" if reason == "sessions_per_agent" else "owner"),
            extra={"action": "mcp_session_ended", "agent_id": str(victim.agent),
                   "opening_agent_id": str(caller.agent_id), "owner": str(caller.owner),
                   "reason": reason, "per_agent": self.sessions.per_agent,
                   "per_owner": self.sessions.per_owner},
        )  # fmt: skip

    async def _authenticate(self, request: Request, deferred: bool) -> Caller:
        """As /v1 does, but a valid token spends no rate token here: only tool calls do
        (``_limit``), not initialize, tools/list, notifications or the SSE stream. Failed
        attempts are still limited per client address. ``deferred``: a remembered token
        is left to the call's transaction to check (migration 0039)."""
        with failures_limited(request, self.context):
            return await self.context.authenticator.authenticate_async(
                presented(_bearer(request)), deferred=deferred
            )

    async def _oauth_caller(self, request: Request, oauth: ResourceServer, token: str) -> Caller:
        """The agent bound to the identity a validated access token names. A token that does
        not validate is 401 (limited per client address, as every failed attempt); a valid
        one that no active agent is bound to is 403: signing in again cannot change that."""
        try:
            granted = await oauth.validate(token, self.resource(request))
        except Unauthenticated:
            client = request.client.host if request.client else "unknown"
            limit(self.context, f"ip:{client}")
            raise
        bound = await run_in_threadpool(self.bindings.lookup, granted.issuer, granted.subject)
        if bound is None:
            raise PermissionDenied(
                f"{granted.subject!r} at {granted.issuer} is bound to no agent here: an admin"
                " binds it with `toolrelay agent oauth AGENT --issuer ISSUER --subject SUBJECT`"
            )
        if not bound.active:
            raise PermissionDenied(
                f"the agent bound to {granted.subject!r} at {granted.issuer} is disabled"
            )
        return Caller(owner=bound.owner, agent_id=bound.agent_id)

    def base_url(self, request: Request) -> str:
        """TOOLRELAY_PUBLIC_URL, else this request's own scheme and Host."""
        return self.public_url or _base_url(request)

    def resource(self, request: Request) -> str:
        """What an access token's aud must name: ``<TOOLRELAY_PUBLIC_URL>/mcp``. Without it,
        the request's own address only when that is a loopback one: taken from a Host
        header anyone can send, the audience would be whatever the caller says, and a token
        issued to another resource (the confused deputy RFC 8707 prevents) would pass."""
        if self.public_url is not None:
            return f"{self.public_url}{MCP_PATH}"
        if URL(_base_url(request)).host not in LOOPBACK_HOSTS:
            raise ConfigurationError(
                f"set {PUBLIC_URL_ENV} (this server's public base URL): access tokens name the"
                " resource they are for, and it cannot be taken from the request's Host header"
            )
        return f"{_base_url(request)}{MCP_PATH}"

    def _limit(self, caller: Caller) -> None:
        wait = self.context.limiter.take(caller.rate_key)
        if wait > 0:  # the body's hint is the Retry-After header's whole seconds
            seconds = retry_after_seconds(wait)
            raise RateLimited(f"too many tool calls; retry in {seconds} s", wait)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request body (BodySizeLimit bounds it), and a receive that replays it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay


class _Answer:
    """A request's ``send``, noting its answer's status and session id on the way out (500
    until an answer starts: a request that ends without one counts as failed)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 500
        self.session: str | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            raw = dict(message.get("headers", [])).get(SESSION_HEADER.encode("ascii"))
            self.session = raw.decode("latin-1") if raw is not None else None
        await self._send(message)


def _principal(agent: UUID | None) -> AuthenticatedUser:
    """What the SDK compares to bind a session to the agent that opened it."""
    return AuthenticatedUser(
        AccessToken(
            token=f"agent:{agent}",  # the SDK never needs the token itself
            client_id=f"agent:{agent}",
            subject=str(agent),
            scopes=[],
        )
    )


def _agent(caller: Caller) -> UUID:
    """The agent a /mcp caller is (``agent_only`` and the OAuth binding made sure of it)."""
    if caller.agent_id is None:
        raise PermissionDenied("/mcp serves agents only")
    return caller.agent_id


def _opens_session(request: Request, body: bytes) -> bool:
    """A POST without a session id holding ``initialize``, in a protocol version that has
    sessions: what makes the SDK open one."""
    if SESSION_HEADER in request.headers:
        return False
    version = request.headers.get(VERSION_HEADER)
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return False
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):  # too deep: the SDK answers the parse error
        return False
    return isinstance(message, dict) and message.get("method") == "initialize"


def _tool_calls(body: bytes) -> tuple[bool, bool]:
    """Whether a POSTed JSON-RPC message (or batch) holds a tools/call, and whether it is
    one tools/call alone that makes a call (not the status tool's read): the only request
    whose token may be checked by its call."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested too deep (not a 500)
        return False, False  # the SDK answers a parse error
    messages = message if isinstance(message, list) else [message]
    holds = any(isinstance(m, dict) and m.get("method") == "tools/call" for m in messages)
    params = message.get("params") if isinstance(message, dict) else None
    name = params.get("name") if isinstance(params, dict) else None
    alone = holds and isinstance(message, dict) and isinstance(name, str) and name != STATUS_TOOL
    return holds, alone


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def resource_metadata(
    request: Request, issuers: list[str], base_url: str | None = None
) -> dict[str, Any]:
    """RFC 9728 protected resource metadata for /mcp, under ``base_url`` (TOOLRELAY_PUBLIC_URL)
    or the request's own. Authorization servers are listed when configured; toolrelay's own
    tokens are the way in otherwise (docs/mcp.md)."""
    metadata: dict[str, Any] = {
        "resource": f"{base_url or _base_url(request)}{MCP_PATH}",
        "bearer_methods_supported": ["header"],
        "resource_name": "toolrelay MCP",
    }
    if issuers:
        metadata["authorization_servers"] = issuers
    return metadata


def mcp_router(endpoint: McpEndpoint) -> APIRouter:
    """A router with the /mcp endpoint whose lifespan runs the SDK's session manager, and the
    protected resource metadata (RFC 9728) MCP clients discover it by."""

    async def metadata(request: Request) -> JSONResponse:
        return JSONResponse(resource_metadata(request, endpoint.issuers, endpoint.public_url))

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with endpoint.manager.run():
            yield

    router = APIRouter(lifespan=lifespan)
    router.routes.append(Route(MCP_PATH, endpoint, include_in_schema=False))
    for path in METADATA_PATHS:
        router.routes.append(Route(path, metadata, methods=["GET"], include_in_schema=False))
    return router


class McpShortcut:
    """Middleware sending /mcp straight to its endpoint. FastAPI's router would first try
    the pattern of every /v1 route: ~8% of the serve process's CPU per tools/call (py-spy).
    Added inside the body-size limit and the access log, which still apply."""

    def __init__(self, app: ASGIApp, endpoint: McpEndpoint) -> None:
        self.app, self.endpoint = app, endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == MCP_PATH:
            await self.endpoint(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def mount_mcp(app: FastAPI, settings: McpSettings | None = None) -> None:
    """Serve MCP at /mcp on the toolrelay API app (``create_app`` calls this before adding
    its outer middleware)."""
    endpoint = McpEndpoint(app.state.toolrelay, settings or McpSettings.from_env())
    app.include_router(mcp_router(endpoint))
    app.add_middleware(McpShortcut, endpoint=endpoint)
