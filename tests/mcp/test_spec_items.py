"""Issue 15, MCP: hints that follow the gate, "still running" as a status rather than an
error, through the official SDK client against the real `serve` app."""

from __future__ import annotations

from tests.mcp.conftest import World, http_client
from toolrelay.mcp.server import META_INVOCATION


async def test_hints_follow_whether_a_call_is_gated(world: World, serve_url: str) -> None:
    async with http_client(serve_url, world.agent_token) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        echo, weather = tools["local.echo"], tools["weather.current"]
        # egress none with an endpoint waits for approval: announced as a write
        assert echo.meta is not None and echo.meta["toolrelay/requiresApproval"] is True
        assert echo.annotations is not None
        assert echo.annotations.read_only_hint is False
        assert echo.annotations.destructive_hint is True
        # an ungated read_only tool is read-only
        assert weather.meta is not None and weather.meta["toolrelay/requiresApproval"] is False
        assert weather.annotations is not None
        assert weather.annotations.read_only_hint is True
        assert weather.annotations.destructive_hint is False
        pending = await client.call_tool("local.echo", {})
    assert pending.meta is not None
    assert pending.meta[META_INVOCATION]["status"] == "pending"  # the gate the hints state
