"""An access token the upstream refuses (401) is refreshed and the call sent again.

A provider may revoke an access token before the expiry it gave (a password change, an
admin's revocation, a token with no expiry at all). The dispatcher refreshed only by the
clock, so every call failed `http_error` 401 until a person rotated the credential, though
its refresh token would have got a new access token. Now a 401 to a call placing an oauth
credential that has a refresh token marks that access token expired and retries the call
(the upstream refused it unprocessed, as a 429): the next attempt refreshes once, however
many calls were refused together."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tests.credentials.conftest import make_keyring
from tests.credentials.helpers import oauth_secret
from tests.credentials.token_server import TokenServer
from tests.dispatch.test_worker import Drain, tool_at
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.credentials import CredentialStore
from toolrelay.db import Database
from toolrelay.registry import Registry

KEYRING = make_keyring("k-refused")
CALLS = 4


@pytest.fixture
async def tokens() -> AsyncIterator[TokenServer]:
    server = TokenServer()
    await server.start()
    yield server
    await server.close()


def oauth_tool(
    registry: Registry, db: Database, upstream: Upstream, tokens: TokenServer, *, refresh: bool
) -> str:
    async def me(request: web.Request, _hit: int) -> web.Response:
        if tokens.issued and request.headers.get("Authorization") == f"Bearer {tokens.issued[-1]}":
            return web.json_response({"ok": True})
        return web.json_response({"error": "invalid_token"}, status=401)

    upstream.routes["/me"] = me
    secret = oauth_secret(
        tokens.url, tokens.client_id, tokens.client_secret,
        tokens.new_refresh_token() if refresh else None, access_token="revoked-at-the-provider",
    )  # fmt: skip
    credential = CredentialStore(db, KEYRING).add(
        registry.owner, "oauth", f"idp-{uuid.uuid4().hex[:6]}", json.dumps(secret), ["127.0.0.1"]
    )
    _, tool = agent_with_tool(registry, **tool_at(
        upstream, "/me", http_method="POST", auth_method="oauth", credential_ref=str(credential),
        auth_param_prefix="Bearer ",
    ))  # fmt: skip
    return str(tool["key"])


async def test_a_refused_access_token_is_refreshed_once_and_the_calls_sent_again(
    registry: Registry, db: Database, upstream: Upstream, tokens: TokenServer, drain: Drain
) -> None:
    key = oauth_tool(registry, db, upstream, tokens, refresh=True)
    calls = [registry.invoke("bot", key, {}) for _ in range(CALLS)]
    await drain(keyring=KEYRING)
    assert {registry.get_invocation(c)["status"] for c in calls} == {"completed"}
    assert len(tokens.grants("refresh_token")) == 1  # refused together, refreshed once
    assert upstream.hits["/me"] <= 2 * CALLS  # each refused at most once, then sent again


async def test_without_a_refresh_token_a_refusal_fails_the_call_as_before(
    registry: Registry, db: Database, upstream: Upstream, tokens: TokenServer, drain: Drain
) -> None:
    key = oauth_tool(registry, db, upstream, tokens, refresh=False)
    call = registry.invoke("bot", key, {})
    await drain(keyring=KEYRING)
    row = registry.get_invocation(call)
    assert (row["status"], row["error_code"], row["http_status"]) == ("failed", "http_error", 401)
    assert upstream.hits["/me"] == 1 and tokens.requests == []
