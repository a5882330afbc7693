"""notifications/tools/list_changed follows the agent's tools version (migration 0035):
each kind of change, made by the registry or by an owner's plain SQL, reaches an MCP
session on its next request; an invocation, another agent's change and another tenant's
do not."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import anyio
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.mcp.conftest import World
from toolrelay.registry import Registry, ToolSpec


def _sql(world: World, statement: str, *params: Any) -> None:
    with world.db.as_owner(world.owner) as conn:
        conn.execute(statement, params)


async def test_list_changed_follows_every_kind_of_change_and_nothing_else(
    world: World, serve_url: str
) -> None:
    notified = 0
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        nonlocal notified
        method = getattr(message, "method", None) or getattr(
            getattr(message, "root", None), "method", None
        )
        if method == "notifications/tools/list_changed":
            notified += 1
            changed.set()

    registry = world.registry
    echo = registry.get_tool("local.echo")["id"]
    stranger = Registry(world.db, uuid.uuid4())
    stranger.register_tool(
        ToolSpec(key="local.echo", name="Echo", endpoint_url="http://127.0.0.1:9/e")
    )
    stranger.create_agent("bot")
    stranger.assign("bot", "local.echo")

    changes: dict[str, Any] = {
        "assigned": lambda: registry.assign("bot", "secret.unassigned"),
        "allowed off (sql)": lambda: _sql(
            world,
            "UPDATE agents.tool_assignments SET allowed = false WHERE tool_id = %s"
            " AND agent_id = %s",
            echo,
            world.agent_id,
        ),
        "allowed on": lambda: registry.assign("bot", "local.echo", allowed=True),
        "description (sql)": lambda: _sql(
            world, "UPDATE agents.tools_registry SET description = 'new' WHERE id = %s", echo
        ),
        "gated (sql)": lambda: _sql(
            world,
            "UPDATE agents.tools_registry SET is_dangerous = true WHERE key = 'secret.unassigned'",
        ),
        "disabled": lambda: registry.set_tool_status("secret.unassigned", "disabled"),
        "revoked": lambda: registry.revoke("bot", "notes.create"),
        "tool deleted (sql)": lambda: _sql(
            world, "DELETE FROM agents.tools_registry WHERE key = 'local.echo'"
        ),
    }
    unrelated = [
        lambda: registry.assign("other-bot", "local.echo"),
        lambda: registry.update_tool("notes.denied", {"description": "denied to bot"}),
        lambda: stranger.update_tool("local.echo", {"description": "elsewhere"}),
        lambda: stranger.revoke("bot", "local.echo"),
    ]

    async def call() -> None:
        result = await client.call_tool("weather.current", {"city": "Oslo"})
        assert not result.is_error

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {world.agent_token}"}, timeout=30.0
    )
    transport = streamable_http_client(f"{serve_url}/mcp", http_client=http)
    async with http, Client(transport, mode="legacy", message_handler=on_message) as client:
        await client.list_tools()
        await call()
        for change in unrelated:
            await asyncio.to_thread(change)
            await call()  # an invocation, and a change of no tool of bot's
        assert notified == 0
        for n, (kind, change) in enumerate(changes.items(), start=1):
            changed = anyio.Event()
            await asyncio.to_thread(change)
            await call()
            with anyio.move_on_after(10):
                await changed.wait()
            assert notified == n, f"no list_changed after: {kind}"
        await call()  # no change since: nothing more
        await client.list_tools(cache_mode="bypass")
        await call()
    assert notified == len(changes)
