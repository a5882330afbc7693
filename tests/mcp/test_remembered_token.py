"""MCP's tools/call with a token serve remembers: checked by the call's own transaction
(migration 0039), so a token revoked between two calls of one session makes no call; the
session's next request is then refused with a 401 by the lookup."""

from __future__ import annotations

import asyncio

import httpx
import psycopg
import pytest
from mcp.shared.exceptions import MCPError

from tests.mcp.conftest import World, http_client
from tests.registry.helpers import count_invocations
from toolrelay.tokens import TokenStore

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_token_revoked_mid_session_makes_no_call(
    world: World, serve_url: str, mode: str
) -> None:
    async with http_client(serve_url, world.agent_token, mode) as client:
        done = await client.call_tool("weather.current", {"city": "Oslo"})
        assert not done.is_error, done.content
        made = await asyncio.to_thread(count_invocations, world.db, world.owner)
        await asyncio.to_thread(TokenStore(world.db).revoke, world.owner, world.agent_token_id)
        with pytest.raises(MCPError, match="unknown, revoked or expired"):
            await client.call_tool("weather.current", {"city": "Oslo"})
        assert await asyncio.to_thread(count_invocations, world.db, world.owner) == made
    # forgotten: the next request is the lookup's 401, with MCP's challenge
    call = {"name": "weather.current", "arguments": {"city": "Oslo"}}
    refused = await asyncio.to_thread(_post, serve_url, world.agent_token, call)
    assert refused.status_code == 401
    assert "invalid_token" in refused.headers["WWW-Authenticate"]
    assert await asyncio.to_thread(count_invocations, world.db, world.owner) == made


async def test_the_status_tool_is_never_answered_unchecked(world: World, serve_url: str) -> None:
    """toolrelay_invocation_status reads a call's outcome: it is not a call, so its
    request looks the token up (a revoked one reads nothing), remembered or not."""
    async with http_client(serve_url, world.agent_token, "legacy") as client:
        done = await client.call_tool("weather.current", {"city": "Oslo"})
        assert not done.is_error, done.content
    await asyncio.to_thread(TokenStore(world.db).revoke, world.owner, world.agent_token_id)
    status = {"name": "toolrelay_invocation_status", "arguments": {"invocation_id": "x"}}
    refused = await asyncio.to_thread(_post, serve_url, world.agent_token, status)
    assert refused.status_code == 401


def _post(serve_url: str, token: str, params: dict[str, object]) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}
    headers = MCP_HEADERS | {"Authorization": f"Bearer {token}"}
    return httpx.post(f"{serve_url}/mcp", json=body, headers=headers, timeout=30)


async def test_a_disabled_agent_makes_no_call(world: World, serve_url: str) -> None:
    async with http_client(serve_url, world.agent_token, "legacy") as client:
        assert not (await client.call_tool("weather.current", {"city": "Oslo"})).is_error
        made = await asyncio.to_thread(count_invocations, world.db, world.owner)
        with psycopg.connect(world.db.url, autocommit=True) as conn:
            conn.execute(
                "UPDATE agents.agents SET status = 'disabled' WHERE id = %s", (world.agent_id,)
            )
        with pytest.raises(MCPError, match="unknown, revoked or expired"):
            await client.call_tool("weather.current", {"city": "Oslo"})
        assert await asyncio.to_thread(count_invocations, world.db, world.owner) == made
