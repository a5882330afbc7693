"""MCP authorization (issue 17, item 4): /mcp as an OAuth 2.1 protected resource.

End to end: the official MCP SDK's OAuth client against a real authorization server
(oidc-provider from npm, tests/oidc): discovery from the 401, dynamic registration, the code
flow with PKCE and RFC 8707's resource (the person signs in and consents in Chromium), a JWT
access token whose audience is our /mcp; then initialize, tools/list and tools/call as the
agent an admin bound to that person's subject.

And what an attacker tries, with tokens signed by authorization servers this test controls
(their own metadata and JWKS on loopback): a token for another resource (the confused
deputy), from an issuer not configured, expired, not yet valid, `alg: none`, HMAC-signed
(with the server's public key as the secret, too), signed by a key the JWKS does not list,
of another type; a subject bound to no agent or to a disabled one; a second tenant binding
the same identity; a Host header naming another resource. A trk_ agent token still works.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import shutil
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import psycopg
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mcp.client.auth import OAuthClientProvider
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from playwright.sync_api import sync_playwright
from typer.testing import CliRunner

from tests.api.conftest import client as api_client
from tests.api.conftest import settings
from tests.api.servers import LoopThread, serve_app
from tests.api.test_oidc_signin import at_provider
from tests.browser import CHROMIUM_ARGS, chromium
from tests.mcp.conftest import World, http_client
from tests.oidc import Provider, installed, require, start_provider
from toolrelay.api import create_app
from toolrelay.cli import context as cli_context
from toolrelay.cli.main import app as cli_app
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.errors import Conflict, InvalidArgument, NotFound, PermissionDenied
from toolrelay.mcp.oauth import (
    AUTHORIZATION_SERVERS_ENV,
    AuthorizationServerUnavailable,
    OAuthBindings,
    ResourceServer,
    metadata_urls,
)
from toolrelay.registry import Registry
from toolrelay.registry.members import Members
from toolrelay.tokens import Caller, Unauthenticated

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "probe", "version": "1"}},
}  # fmt: skip
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
BOT_TOOLS = {"weather.current", "notes.create", "local.echo", "toolrelay_invocation_status"}
ARTIFACTS = Path(__file__).parents[2] / "artifacts"
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # listed nowhere


# --- authorization servers this test controls ----------------------------------------------


@dataclass
class OwnServer:
    """RFC 8414 metadata and a JWKS on loopback, and the private keys to sign tokens with."""

    issuer: str = ""
    path: str = ""  # the issuer's path ("" or "/realms/x")
    rsa_key: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    ec_key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    extra_keys: dict[str, Any] = field(default_factory=dict)  # kid -> public key, listed too
    documents: tuple[str, ...] = ("oauth-authorization-server", "openid-configuration")
    names_issuer: str | None = None  # the issuer its metadata names (None: its own)
    hits: dict[str, int] = field(default_factory=dict)
    down: bool = False  # every document answers 503

    def jwks(self) -> dict[str, Any]:
        keys = [jwk(self.rsa_key.public_key(), "rsa-1", "RS256"),
                jwk(self.ec_key.public_key(), "ec-1", "ES256")]  # fmt: skip
        return {"keys": keys + [jwk(key, kid, None) for kid, key in self.extra_keys.items()]}

    def token(
        self,
        claims: dict[str, Any],
        *,
        key: Any = None,
        alg: str = "RS256",
        kid: str | None = "rsa-1",
        typ: str | None = "at+jwt",
    ) -> str:
        headers: dict[str, Any] = {"typ": typ} if typ is not None else {}
        if kid is not None:
            headers["kid"] = kid
        signing = (
            key if key is not None else (self.ec_key if alg.startswith("ES") else self.rsa_key)
        )
        return jwt.encode(claims, signing, algorithm=alg, headers=headers)


def jwk(public_key: Any, kid: str, alg: str | None) -> dict[str, Any]:
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        entry: dict[str, Any] = jwt.algorithms.ECAlgorithm.to_jwk(public_key, as_dict=True)
    else:
        entry = jwt.algorithms.RSAAlgorithm.to_jwk(public_key, as_dict=True)
    entry.update(kid=kid, use="sig")
    if alg is not None:
        entry["alg"] = alg
    return entry


async def start_own_server(own: OwnServer) -> web.AppRunner:
    async def metadata(request: web.Request) -> web.Response:
        own.hits["metadata"] = own.hits.get("metadata", 0) + 1
        if own.down:
            return web.json_response({"error": "temporarily_unavailable"}, status=503)
        name = request.match_info["name"]
        suffix = request.match_info.get("rest", "")
        if name not in own.documents or f"/{suffix}".rstrip("/") != own.path:
            return web.json_response({"error": "not_found"}, status=404)
        return web.json_response({"issuer": own.names_issuer or own.issuer,
                                  "jwks_uri": f"{own.issuer}/jwks"})  # fmt: skip

    async def jwks(_: web.Request) -> web.Response:
        own.hits["jwks"] = own.hits.get("jwks", 0) + 1
        if own.down:
            return web.json_response({"error": "temporarily_unavailable"}, status=503)
        return web.json_response(own.jwks())

    app = web.Application()
    app.router.add_get("/.well-known/{name}", metadata)
    app.router.add_get("/.well-known/{name}/{rest:.*}", metadata)
    app.router.add_get(f"{own.path}/jwks", jwks)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    own.issuer = f"http://127.0.0.1:{runner.addresses[0][1]}{own.path}"
    return runner


@dataclass
class OwnServers:
    """Servers of ours started on one loop thread, all stopped at the module's end."""

    loop: LoopThread = field(default_factory=LoopThread)
    runners: list[web.AppRunner] = field(default_factory=list)

    def start(self, server: OwnServer | None = None) -> OwnServer:
        server = server or OwnServer()
        self.runners.append(self.loop.run(start_own_server(server)))
        return server

    def close(self) -> None:
        for runner in self.runners:
            self.loop.run(runner.cleanup())
        self.loop.close()


@pytest.fixture(scope="module")
def own_servers() -> Iterator[OwnServers]:
    servers = OwnServers()
    yield servers
    servers.close()


@dataclass
class Deployment:
    """`toolrelay serve` trusting oidc-provider (when installed) and ``own``, not ``stranger``."""

    url: str
    own: OwnServer
    stranger: OwnServer
    provider: Provider | None
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @property
    def resource(self) -> str:
        return f"{self.url}/mcp"

    def claims(self, subject: str | None, **changes: Any) -> dict[str, Any]:
        now = int(time.time())
        values: dict[str, Any] = {
            "iss": self.own.issuer, "sub": subject, "aud": self.resource, "exp": now + 300,
            "iat": now, "client_id": "an-mcp-client", "scope": "mcp",
        } | changes  # fmt: skip
        return {name: value for name, value in values.items() if value is not None}

    def post(self, token: str, **headers: str) -> httpx.Response:
        """An MCP initialize with ``token``, as any HTTP client would send it."""
        sent = MCP_HEADERS | {"Authorization": f"Bearer {token}"} | headers
        return self.http.post(self.resource, json=INITIALIZE, headers=sent)


@pytest.fixture(scope="module")
def deployment(
    database_url: str, mcp_keyring: Keyring, own_servers: OwnServers
) -> Iterator[Deployment]:
    own, stranger = own_servers.start(), own_servers.start()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the address first: the provider's resource server is it
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with provider_if_installed(f"{base}/mcp") as provider:
        # the provider first: MCP clients go to the first server the metadata lists
        issuers = ([provider.issuer] if provider else []) + [own.issuer]
        with pytest.MonkeyPatch.context() as env:
            env.setenv(AUTHORIZATION_SERVERS_ENV, ",".join(issuers))
            env.delenv("TOOLRELAY_PUBLIC_URL", raising=False)
            app = create_app(settings(database_url, mcp_keyring))
        with serve_app(app, sock) as url:
            assert url == base
            deployment = Deployment(url, own, stranger, provider)
            yield deployment
            deployment.http.close()


@contextmanager
def provider_if_installed(resource: str) -> Iterator[Provider | None]:
    """oidc-provider with dynamic registration and ``resource`` as an RFC 8707 resource
    server (JWT access tokens); None without node or the package (the end-to-end test then
    skips, saying so; the rest runs)."""
    if shutil.which("node") is None or not installed():
        yield None
        return
    servers = {resource: {"scope": "mcp", "accessTokenFormat": "jwt"}}
    with start_provider([], registration=True, resource_servers=servers) as provider:
        yield provider


def bind(db: Database, world: World, issuer: str, subject: str | None = None) -> str:
    subject = subject or f"person-{uuid.uuid4().hex[:10]}"
    OAuthBindings(db).bind(world.owner, world.agent_id, issuer, subject)
    return subject


def refused(response: httpx.Response, status: int, says: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert says in error["message"], error
    return error


def challenged(response: httpx.Response, deployment: Deployment, says: str) -> None:
    """401, saying ``says``, with RFC 6750's invalid_token and RFC 9728's metadata URL."""
    error = refused(response, 401, says)
    assert error["code"] == "unauthenticated"
    challenge = response.headers["WWW-Authenticate"]
    assert challenge == (
        'Bearer realm="toolrelay", error="invalid_token", resource_metadata='
        f'"{deployment.url}/.well-known/oauth-protected-resource/mcp"'
    )


# --- end to end: the MCP SDK's OAuth client against oidc-provider ---------------------------


class MemoryStorage:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


@asynccontextmanager
async def loopback_callback() -> AsyncIterator[tuple[str, asyncio.Future[dict[str, str]]]]:
    """The native client's redirect URI (RFC 8252 loopback): the first query it gets."""
    got: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

    async def callback(request: web.Request) -> web.Response:
        if not got.done():
            got.set_result(dict(request.query))
        return web.Response(text="Signed in; you can close this window.")

    app = web.Application()
    app.router.add_get("/callback", callback)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/callback", got
    finally:
        await runner.cleanup()


def sign_in_in_chromium(url: str, login: str, redirect_uri: str) -> None:
    """The person: opens the authorization URL, signs in and consents (in a thread of its
    own: Playwright's sync API cannot run inside the test's event loop)."""
    executable = chromium()
    assert executable is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(url)
            at_provider(page, login)
            page.wait_for_url(lambda now: now.startswith(redirect_uri))
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "mcp-oauth-callback.png"))
        finally:
            browser.close()


async def test_the_sdk_oauth_client_signs_in_lists_and_calls_tools(
    deployment: Deployment, world: World, db: Database
) -> None:
    require()
    if chromium() is None:
        pytest.skip("Chromium is not installed: the MCP OAuth flow was NOT tested end to end")
    provider = deployment.provider
    assert provider is not None
    login = f"agent-operator-{uuid.uuid4().hex[:8]}"  # oidc-provider: sub = the login
    bind(db, world, provider.issuer, login)
    storage = MemoryStorage()
    async with loopback_callback() as (redirect_uri, got):
        opened: list[str] = []

        async def redirect_handler(url: str) -> None:
            opened.append(url)
            await asyncio.to_thread(sign_in_in_chromium, url, login, redirect_uri)

        async def callback_handler() -> AuthorizationCodeResult:
            query = await asyncio.wait_for(got, 60)
            return AuthorizationCodeResult(
                code=query["code"], state=query.get("state"), iss=query.get("iss")
            )

        auth = OAuthClientProvider(
            server_url=deployment.resource,
            client_metadata=OAuthClientMetadata(
                client_name="toolrelay OAuth test",
                redirect_uris=[redirect_uri],  # type: ignore[list-item]
                grant_types=["authorization_code", "refresh_token"],
            ),
            storage=storage,
            redirect_handler=redirect_handler,
            callback_handler=callback_handler,
        )
        http = httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(60.0, read=120.0))
        async with (
            http,
            Client(
                streamable_http_client(deployment.resource, http_client=http), mode="legacy"
            ) as client,
        ):
            # initialize went through: the SDK got a token on the 401 and retried with it
            assert client.server_info is not None
            listed = {tool.name for tool in (await client.list_tools()).tools}
            assert listed == BOT_TOOLS
            city = f"Oslo-{uuid.uuid4().hex[:6]}"
            result = await client.call_tool("weather.current", {"city": city})
            assert result.is_error is False, result.content
            assert result.structured_content == {"city": city, "temperature_c": 21.5}

    # What the SDK did: registered itself, asked for our resource, got a JWT for it alone.
    assert storage.client_info is not None and storage.client_info.client_id
    (authorize,) = opened
    assert authorize.startswith(f"{provider.issuer}/")
    assert httpx.URL(authorize).params["resource"] == deployment.resource  # RFC 8707
    assert storage.tokens is not None
    token = storage.tokens.access_token
    assert jwt.get_unverified_header(token)["typ"] == "at+jwt"
    claims = jwt.decode(token, options={"verify_signature": False})
    assert (claims["iss"], claims["sub"], claims["aud"]) == (
        provider.issuer, login, deployment.resource)  # fmt: skip
    # The call was the bound agent's, recorded as it.
    (call,) = [i for i in world.registry.list_invocations() if i["input"] == {"city": city}]
    assert call["agent_id"] == world.agent_id
    # Any HTTP client presenting it acts as the bot too (the token is the credential).
    response = deployment.post(token)
    assert response.status_code == 200, response.text


# --- tokens from a server we control: what is accepted ------------------------------------


VALID = {
    "at+jwt, RS256": {},
    "plain JWT": {"typ": "JWT"},
    "no typ": {"typ": None},
    "application/at+jwt": {"typ": "application/at+jwt"},
    "ES256": {"alg": "ES256", "kid": "ec-1"},
}


@pytest.mark.parametrize("variant", sorted(VALID))
def test_a_valid_access_token_acts_as_the_bound_agent(
    deployment: Deployment, world: World, db: Database, variant: str
) -> None:
    subject = bind(db, world, deployment.own.issuer)
    token = deployment.own.token(deployment.claims(subject), **VALID[variant])
    response = deployment.post(token)
    assert response.status_code == 200, response.text
    assert "toolrelay" in response.text  # serverInfo


def test_an_audience_list_naming_us_is_accepted(
    deployment: Deployment, world: World, db: Database
) -> None:
    subject = bind(db, world, deployment.own.issuer)
    claims = deployment.claims(subject, aud=["https://other.example/api", deployment.resource])
    assert deployment.post(deployment.own.token(claims)).status_code == 200


async def test_the_sdk_client_with_a_bearer_access_token_lists_and_calls(
    deployment: Deployment, world: World, db: Database
) -> None:
    subject = bind(db, world, deployment.own.issuer)
    token = deployment.own.token(deployment.claims(subject))
    async with http_client(deployment.url, token, mode="legacy") as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == BOT_TOOLS
        city = f"Rome-{uuid.uuid4().hex[:6]}"
        result = await client.call_tool("weather.current", {"city": city})
        assert result.structured_content == {"city": city, "temperature_c": 21.5}


async def test_a_trk_agent_token_still_works_beside_them(
    deployment: Deployment, world: World
) -> None:
    async with http_client(deployment.url, world.agent_token) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == BOT_TOOLS


# --- what is refused ----------------------------------------------------------------------


def _segment(value: dict[str, Any]) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unsigned(claims: dict[str, Any]) -> str:
    """alg none: no signature at all."""
    return f"{_segment({'alg': 'none', 'typ': 'at+jwt'})}.{_segment(claims)}."


def hmac_signed(claims: dict[str, Any], secret: bytes, kid: str | None = "rsa-1") -> str:
    """HS256 with ``secret`` (made by hand: PyJWT refuses a public key as an HMAC secret)."""
    header = {"alg": "HS256", "typ": "at+jwt"} | ({"kid": kid} if kid else {})
    signing_input = f"{_segment(header)}.{_segment(claims)}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def public_pem(own: OwnServer) -> bytes:
    return own.rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def attacks(d: Deployment, subject: str) -> dict[str, tuple[str, str]]:
    """name -> (token, what the refusal says)."""
    own, stranger = d.own, d.stranger
    now = int(time.time())
    return {
        "a token for another resource (confused deputy)": (
            own.token(d.claims(subject, aud="https://other-mcp.example/mcp")),
            "not for this resource"),
        "a token for our origin but another path": (
            own.token(d.claims(subject, aud=d.url)), "not for this resource"),
        "no audience": (own.token(d.claims(subject, aud=None)), '"aud"'),
        "an issuer not configured": (
            stranger.token(d.claims(subject, iss=stranger.issuer)),
            "is not an authorization server of this toolrelay"),
        "no issuer": (own.token(d.claims(subject, iss=None)), "None is not an authorization"),
        "our issuer, signed by another server's key": (
            stranger.token(d.claims(subject)), "Signature verification failed"),
        "a key the JWKS does not list": (
            own.token(d.claims(subject), key=OTHER_KEY, kid="rotated-away"), "does not list"),
        "no kid, the JWKS holding two keys": (
            own.token(d.claims(subject), kid=None), "does not list"),
        "expired": (own.token(d.claims(subject, exp=now - 120)), "has expired"),
        "no expiry": (own.token(d.claims(subject, exp=None)), '"exp"'),
        "not valid yet": (own.token(d.claims(subject, nbf=now + 600)), "not yet valid"),
        "issued in the future": (own.token(d.claims(subject, iat=now + 600)), "iat"),
        "alg none": (unsigned(d.claims(subject)), "'none'"),
        "HS256 with the public key as the secret": (
            hmac_signed(d.claims(subject), public_pem(own)), "'HS256'"),
        "HS256 with a made-up secret": (
            hmac_signed(d.claims(subject), b"s" * 32, kid=None), "'HS256'"),
        "the RSA key's kid on an EC signature": (
            own.token(d.claims(subject), alg="ES256", kid="rsa-1"), "key is for RS256"),
        "an ID token's type": (
            own.token(d.claims(subject), typ="id_token+jwt"), "not an access token"),
        "no subject": (own.token(d.claims(None)), '"sub"'),
        "a signature changed": (
            own.token(d.claims(subject))[:-4] + "AAAA", "Signature verification failed"),
    }  # fmt: skip


ATTACKS = [
    "a token for another resource (confused deputy)", "a token for our origin but another path",
    "no audience", "an issuer not configured", "no issuer",
    "our issuer, signed by another server's key", "a key the JWKS does not list",
    "no kid, the JWKS holding two keys", "expired", "no expiry", "not valid yet",
    "issued in the future", "alg none", "HS256 with the public key as the secret",
    "HS256 with a made-up secret", "the RSA key's kid on an EC signature", "an ID token's type",
    "no subject", "a signature changed",
]  # fmt: skip


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attack_is_a_401_with_the_challenge(
    deployment: Deployment, world: World, db: Database, attack: str
) -> None:
    subject = bind(db, world, deployment.own.issuer)
    made = attacks(deployment, subject)
    assert sorted(made) == sorted(ATTACKS)
    token, says = made[attack]
    challenged(deployment.post(token), deployment, says)
    # The same subject with a good token is let in: the refusal was about the token.
    assert deployment.post(deployment.own.token(deployment.claims(subject))).status_code == 200


def test_a_subject_bound_to_no_agent_is_403(deployment: Deployment) -> None:
    token = deployment.own.token(deployment.claims(f"nobody-{uuid.uuid4().hex[:8]}"))
    response = deployment.post(token)
    error = refused(response, 403, "is bound to no agent here")
    assert error["code"] == "permission_denied"
    assert "toolrelay agent oauth" in error["message"]
    assert "WWW-Authenticate" not in response.headers  # signing in again would not help


def test_a_disabled_agents_identity_is_refused_until_enabled(
    deployment: Deployment, world: World, db: Database
) -> None:
    subject = bind(db, world, deployment.own.issuer)
    token = deployment.own.token(deployment.claims(subject))
    with db.as_owner(world.owner) as conn:
        conn.execute(
            "UPDATE agents.agents SET status = 'disabled' WHERE id = %s", (world.agent_id,)
        )
    refused(deployment.post(token), 403, "is disabled")
    assert deployment.post(world.agent_token).status_code == 401  # its trk_ token: as before
    with db.as_owner(world.owner) as conn:
        conn.execute("UPDATE agents.agents SET status = 'active' WHERE id = %s", (world.agent_id,))
    assert deployment.post(token).status_code == 200


def test_an_unbound_agents_token_no_longer_acts(
    deployment: Deployment, world: World, db: Database
) -> None:
    subject = bind(db, world, deployment.own.issuer)
    token = deployment.own.token(deployment.claims(subject))
    assert deployment.post(token).status_code == 200
    assert OAuthBindings(db).unbind(world.owner, world.agent_id) is True
    refused(deployment.post(token), 403, "is bound to no agent here")


def test_one_identity_one_agent_in_all_tenants(
    deployment: Deployment, world: World, db: Database
) -> None:
    """The rule: (issuer, subject) maps to exactly one agent. A second binding, in this
    tenant or another, is refused without saying whose the first is, and the token keeps
    acting as the first agent."""
    subject = bind(db, world, deployment.own.issuer)
    bindings = OAuthBindings(db)
    with pytest.raises(Conflict, match="already bound to another agent") as same_tenant:
        bindings.bind(world.owner, world.other_agent_id, deployment.own.issuer, subject)
    other_tenant = Registry(db, uuid.uuid4())
    twin = other_tenant.create_agent("twin")
    with pytest.raises(Conflict, match="already bound to another agent") as across:
        bindings.bind(other_tenant.owner, twin, deployment.own.issuer, subject)
    for refusal in (same_tenant, across):  # whose it is stays unsaid
        assert str(world.owner) not in refusal.value.message
        assert "bot" not in refusal.value.message
    token = deployment.own.token(deployment.claims(subject))
    assert deployment.post(token).status_code == 200
    with world.db.as_owner(world.owner) as conn:  # ...as the first agent, the bot
        row = conn.execute("SELECT id FROM agents.agents WHERE oauth_subject = %s", (subject,))
        assert [r["id"] for r in row.fetchall()] == [world.agent_id]
    # Another issuer's identically named subject is another identity: bindable.
    bindings.bind(other_tenant.owner, twin, deployment.stranger.issuer, subject)
    assert bindings.get(other_tenant.owner, twin) == (deployment.stranger.issuer, subject)


def test_a_host_header_cannot_choose_the_audience(
    deployment: Deployment, world: World, db: Database
) -> None:
    """Without TOOLRELAY_PUBLIC_URL the audience comes from the request's address only when
    that is loopback: a Host naming another resource would otherwise make its tokens ours."""
    subject = bind(db, world, deployment.own.issuer)
    evil = "https://evil.example"
    token = deployment.own.token(deployment.claims(subject, aud=f"{evil}/mcp"))
    response = deployment.post(token, Host="evil.example")
    error = refused(response, 503, "TOOLRELAY_PUBLIC_URL")
    assert error["code"] == "configuration_error"
    # toolrelay's own tokens are not affected by it
    assert deployment.post(world.agent_token, Host="evil.example").status_code == 200


# --- the validator itself: caching, rotation, discovery -----------------------------------


async def test_an_unknown_kid_refetches_the_keys_once(own_servers: OwnServers) -> None:
    own = own_servers.start()
    resource = "http://127.0.0.1:9/mcp"
    now = int(time.time())
    claims = {"iss": own.issuer, "sub": "s", "aud": resource, "exp": now + 60}
    server = ResourceServer([own.issuer], jwks_refetch_s=0.0)
    assert (await server.validate(own.token(claims), resource)).subject == "s"
    assert own.hits == {"metadata": 1, "jwks": 1}
    await server.validate(own.token(claims), resource)  # cached: nothing fetched
    assert own.hits == {"metadata": 1, "jwks": 1}
    rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    own.extra_keys["rsa-2"] = rotated.public_key()  # the server rotates in a new key
    granted = await server.validate(own.token(claims, key=rotated, kid="rsa-2"), resource)
    assert granted.issuer == own.issuer and own.hits == {"metadata": 1, "jwks": 2}


async def test_tokens_naming_random_kids_do_not_make_us_hammer_the_server(
    own_servers: OwnServers,
) -> None:
    own = own_servers.start()
    resource = "http://127.0.0.1:9/mcp"
    claims = {"iss": own.issuer, "sub": "s", "aud": resource, "exp": int(time.time()) + 60}
    server = ResourceServer([own.issuer])  # at most one refetch per 10 s
    await server.validate(own.token(claims), resource)
    for _ in range(25):
        with pytest.raises(Unauthenticated, match="does not list"):
            await server.validate(own.token(claims, kid=uuid.uuid4().hex), resource)
    assert own.hits["jwks"] == 1


async def test_keys_held_still_verify_while_the_server_is_down(
    own_servers: OwnServers,
) -> None:
    own = own_servers.start()
    resource = "http://127.0.0.1:9/mcp"
    claims = {"iss": own.issuer, "sub": "s", "aud": resource, "exp": int(time.time()) + 60}
    server = ResourceServer([own.issuer], metadata_ttl_s=0.0)  # keys stale at once
    await server.validate(own.token(claims), resource)
    own.down = True
    assert (await server.validate(own.token(claims), resource)).subject == "s"
    assert (await server.validate(own.token(claims), resource)).subject == "s"
    # asked once more (both metadata locations), then left alone for jwks_refetch_s
    assert own.hits["metadata"] == 1 + 2
    with pytest.raises(Unauthenticated, match="does not list"):  # not asked again yet
        await server.validate(own.token(claims, kid="new"), resource)


async def test_discovery_rfc8414_then_openid_configuration(own_servers: OwnServers) -> None:
    resource = "http://127.0.0.1:9/mcp"
    for documents in [("oauth-authorization-server",), ("openid-configuration",)]:
        for path in ("", "/realms/agents"):
            own = own_servers.start(OwnServer(path=path, documents=documents))
            claims = {"iss": own.issuer, "sub": "s", "aud": resource,
                      "exp": int(time.time()) + 60}  # fmt: skip
            granted = await ResourceServer([own.issuer]).validate(own.token(claims), resource)
            assert granted.issuer == own.issuer


def test_metadata_urls_follow_rfc8414_and_oidc() -> None:
    assert metadata_urls("https://as.example") == [
        "https://as.example/.well-known/oauth-authorization-server",
        "https://as.example/.well-known/openid-configuration",
    ]
    assert metadata_urls("https://as.example/realms/x/") == [
        "https://as.example/.well-known/oauth-authorization-server/realms/x",
        "https://as.example/.well-known/openid-configuration/realms/x",
        "https://as.example/realms/x/.well-known/openid-configuration",
    ]


async def test_metadata_naming_another_issuer_is_not_used(own_servers: OwnServers) -> None:
    own = own_servers.start(OwnServer(names_issuer="https://mix-up.example"))
    resource = "http://127.0.0.1:9/mcp"
    claims = {"iss": own.issuer, "sub": "s", "aud": resource, "exp": int(time.time()) + 60}
    with pytest.raises(AuthorizationServerUnavailable, match="mix-up.example"):
        await ResourceServer([own.issuer]).validate(own.token(claims), resource)


async def test_an_unreachable_server_is_unavailable_not_the_clients_fault() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        issuer = f"http://127.0.0.1:{probe.getsockname()[1]}"  # nobody listens there
    own = OwnServer(issuer=issuer)
    claims = {"iss": issuer, "sub": "s", "aud": "r", "exp": int(time.time()) + 60}
    with pytest.raises(AuthorizationServerUnavailable, match="could not be reached"):
        await ResourceServer([issuer]).validate(own.token(claims), "r")


def test_which_tokens_take_this_door() -> None:
    issuer = "https://as.example"
    server = ResourceServer([issuer])
    own = OwnServer(issuer=issuer)
    rs256 = own.token({"iss": "https://elsewhere.example", "sub": "s"})
    supabase = jwt.encode({"sub": str(uuid.uuid4())}, "x" * 32, algorithm="HS256")
    ours_hmac = hmac_signed({"iss": issuer, "sub": "s"}, b"x" * 32)
    assert server.handles(rs256)  # any asymmetric JWT: refused here if not our issuers'
    assert server.handles(unsigned({"iss": "https://elsewhere.example"}))
    assert server.handles(ours_hmac)  # HMAC naming our issuer: refused here
    assert not server.handles(supabase)  # TOOLRELAY_JWT_SECRET's, as before
    assert not server.handles("trk_" + "a.b.c")
    assert not server.handles("not a token")


# --- binding: the store, the API, the CLI ------------------------------------------------


def test_binding_is_an_admins_and_audited(db: Database, world: World) -> None:
    bindings = OAuthBindings(db)
    issuer, subject = "https://auth.example.com/realms/agents", f"user-{uuid.uuid4().hex[:6]}"
    assert bindings.bind(world.owner, world.agent_id, issuer, subject) is True
    assert bindings.bind(world.owner, world.agent_id, issuer, subject) is False  # as it was
    assert bindings.get(world.owner, world.agent_id) == (issuer, subject)
    assert bindings.lookup(issuer, subject) is not None
    viewer = Members(db).add(world.owner, "Vic", "viewer")
    as_viewer = Caller(owner=world.owner, member_id=viewer.id)
    with pytest.raises(PermissionDenied, match="needs the admin role"):
        bindings.unbind(as_viewer, world.agent_id)
    with (  # the agent itself (Acting carries no agent: the database is asked directly)
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent identity"),
        db.as_owner(world.owner, agent_id=world.agent_id) as conn,
    ):
        conn.execute("SELECT fn_set_agent_oauth(%s, NULL, NULL)", (world.agent_id,))
    with pytest.raises(NotFound):  # another tenant's agent is not found
        bindings.unbind(uuid.uuid4(), world.agent_id)
    assert bindings.unbind(world.owner, world.agent_id) is True
    assert bindings.unbind(world.owner, world.agent_id) is False
    assert bindings.lookup(issuer, subject) is None
    with db.as_owner(world.owner) as conn:
        rows = conn.execute(
            "SELECT changes FROM agents.config_audit WHERE kind = 'agent' AND action = 'update'"
            " AND object_id = %s ORDER BY id", (world.agent_id,)).fetchall()  # fmt: skip
    assert [row["changes"] for row in rows] == [
        {"oauth_issuer": {"old": None, "new": issuer},
         "oauth_subject": {"old": None, "new": subject}},
        {"oauth_issuer": {"old": issuer, "new": None},
         "oauth_subject": {"old": subject, "new": None}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("issuer", "subject", "says"),
    [
        ("auth.example.com", "s", "is not an issuer URL"),
        ("https://auth.example.com/?tenant=1", "s", "is not an issuer URL"),
        ("https://auth.example.com/#x", "s", "is not an issuer URL"),
        ("https://auth example.com", "s", "is not an issuer URL"),
        ("https://auth.example.com\n", "s", "is not an issuer URL"),
        ("https://" + "a" * 2000, "s", "is not an issuer URL"),
        ("https://auth.example.com", "", "is not a subject"),
        ("https://auth.example.com", "a\x00b", "is not a subject"),
        ("https://auth.example.com", "a\u2028b", "is not a subject"),
        ("https://auth.example.com", "x" * 1001, "is not a subject"),
    ],
)
def test_bad_bindings_are_refused_naming_the_value(
    db: Database, world: World, issuer: str, subject: str, says: str
) -> None:
    with pytest.raises(InvalidArgument, match=says):
        OAuthBindings(db).bind(world.owner, world.agent_id, issuer, subject)


def test_the_database_refuses_what_python_would(db: Database, world: World) -> None:
    """A plain UPDATE as the owner (psql, PostgREST) meets the same rules."""
    for sql in (
        "UPDATE agents.agents SET oauth_issuer = 'https://a.example' WHERE id = %s",
        "UPDATE agents.agents SET oauth_issuer = 'ftp://a', oauth_subject = 's' WHERE id = %s",
        "UPDATE agents.agents SET oauth_issuer = 'https://a', oauth_subject = '' WHERE id = %s",
    ):
        with pytest.raises(psycopg.errors.CheckViolation), db.as_owner(world.owner) as conn:
            conn.execute(sql, (world.agent_id,))


def test_the_api_binds_shows_and_unbinds(
    deployment: Deployment, world: World, db: Database
) -> None:
    owner = api_client(deployment.url, world.owner_token, world.owner)
    path = "/v1/agents/bot/oauth"
    assert owner.get(path).json() == {"agent_id": str(world.agent_id), "agent": "bot",
                                      "issuer": None, "subject": None}  # fmt: skip
    subject = f"api-{uuid.uuid4().hex[:8]}"
    body = {"issuer": deployment.own.issuer, "subject": subject}
    bound = owner.put(path, json=body)
    assert bound.status_code == 200, bound.text
    assert bound.json() | {} == {"agent_id": str(world.agent_id), "agent": "bot", **body}
    assert owner.get(f"/v1/agents/{world.agent_id}/oauth").json()["subject"] == subject
    token = deployment.own.token(deployment.claims(subject))
    assert deployment.post(token).status_code == 200
    # the same identity for the other agent: 409; a bad issuer: 422; an agent token: 403
    clash = owner.put("/v1/agents/other-bot/oauth", json=body)
    assert (clash.status_code, clash.json()["error"]["code"]) == (409, "conflict")
    bad = owner.put(path, json={"issuer": "nope", "subject": "s"})
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_argument")
    extra = owner.put(path, json=body | {"tenant": "x"})
    assert extra.status_code == 422
    agent = api_client(deployment.url, world.agent_token, world.owner, world.agent_id)
    assert agent.put(path, json=body).status_code == 403
    assert owner.get("/v1/agents/nobody/oauth").status_code == 404
    unbound = owner.delete(path)
    assert unbound.status_code == 200 and unbound.json()["issuer"] is None
    assert deployment.post(token).status_code == 403
    owner.http.close()
    agent.http.close()


def test_the_cli_binds_shows_and_unbinds(
    database_url: str, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    env = {"DATABASE_URL": database_url, "TOOLRELAY_OWNER": str(world.owner),
           "TOOLRELAY_HOME": str(tmp_path), "COLUMNS": "200",
           AUTHORIZATION_SERVERS_ENV: "https://auth.example.com"}  # fmt: skip
    monkeypatch.delenv("TOOLRELAY_OIDC_ISSUER", raising=False)
    cli_context.database.cache_clear()

    def run(*args: str) -> Any:
        return runner.invoke(cli_app, ["agent", "oauth", *args], env=env)

    subject = f"cli-{uuid.uuid4().hex[:8]}"
    done = run("bot", "--issuer", "https://auth.example.com", "--subject", subject)
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == f"bound bot to {subject} at https://auth.example.com"
    assert "note:" not in done.stderr  # a configured issuer
    shown = run("bot")
    assert shown.stdout.strip() == f"bot: {subject} at https://auth.example.com"
    other = run("other-bot", "--issuer", "https://auth.example.com", "--subject", subject)
    assert other.exit_code == 1
    assert other.stderr.strip().startswith("error: ") and "already bound" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
    elsewhere = run("other-bot", "--issuer", "https://elsewhere.example", "--subject", subject)
    assert elsewhere.exit_code == 0 and "not in TOOLRELAY_MCP_AUTHORIZATION_SERVERS" in (
        elsewhere.stderr)  # fmt: skip
    half = run("bot", "--issuer", "https://auth.example.com")
    assert half.exit_code == 1 and "both --issuer and --subject" in half.stderr
    assert run("bot", "--unbind").stdout.strip() == "unbound bot"
    assert run("bot", "--unbind").stdout.strip() == "bot was not bound"
    assert run("bot").stdout.strip() == "bot is not bound to an OAuth identity"
    cli_context.database.cache_clear()


def test_failed_attempts_are_rate_limited_per_address(deployment: Deployment) -> None:
    """As with every failed attempt (/v1's bucket per client address: a burst of 60). Last in
    the module: the address is every test's; it is given the time to refill."""
    token = deployment.own.token(deployment.claims("x", aud="https://other.example/mcp"))
    with ThreadPoolExecutor(16) as pool:
        statuses = set(pool.map(lambda _: deployment.post(token).status_code, range(120)))
    assert statuses == {401, 429}
    time.sleep(3.5)
