"""Issue 15, MCP: hints that follow the gate, "still running" as a status rather than an
error, tools/list in pages, listChanged, and rate limits on tool calls only; through the
official SDK client (raw HTTP where headers matter) against the real `serve` app."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from tests.api.conftest import settings
from tests.api.servers import serve_app
from tests.mcp.conftest import World, http_client
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.mcp.server import META_INVOCATION, STATUS_TOOL
from toolrelay.registry import ToolSpec

Make = Callable[..., Client]


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


async def test_still_running_is_a_status_not_an_error(inproc: Make) -> None:
    async with inproc(wait_seconds=0.2) as client:
        # the SDK client checks this non-error answer against the declared outputSchema
        running = await client.call_tool("weather.current", {"city": "Slowtown"})
        assert running.is_error is False
        status = running.structured_content
        assert status is not None
        assert status["status"] == "running"
        assert status["retry_after_seconds"] > 0
        assert status["next"]["tool"] == STATUS_TOOL
        assert status["invocation_id"] == status["next"]["arguments"]["invocation_id"]
        # what it says to call is accepted as it is
        done = await client.call_tool(STATUS_TOOL, status["next"]["arguments"])
    assert done.is_error is False
    assert done.structured_content is not None
    assert done.structured_content["status"] == "completed"
    assert done.structured_content["output"] == {"city": "Slowtown", "temperature_c": 21.5}


async def test_awaiting_approval_is_a_status_with_when_to_ask_again(inproc: Make) -> None:
    async with inproc() as client:
        pending = await client.call_tool("notes.create", {"text": "hello"})
        assert pending.is_error is False
        status = pending.structured_content
        assert status is not None
        assert (status["status"], status["retry_after_seconds"]) == ("pending", 30.0)
        again = await client.call_tool(STATUS_TOOL, status["next"]["arguments"])
    assert again.is_error is False
    assert again.structured_content is not None
    assert again.structured_content["status"] == "pending"
    assert again.structured_content["retry_after_seconds"] == 30.0


MANY = 1_200


def register_many(world: World) -> set[str]:
    """About a GitHub import's worth of tools (4 KB of description each, ~5 MB listed),
    registered in one transaction and assigned to ``bot``."""
    base = world.upstream.base_url
    specs = [
        ToolSpec(
            key=f"gh.op_{n:04d}",
            name=f"Operation {n}",
            description=f"Operation {n}. " + "x" * 4_000,
            endpoint_url=f"{base}/weather",
            http_method="GET",
            egress_class="read_only",
            schema_input={"type": "object", "properties": {"q": {"type": "string"}}},
        )
        for n in range(MANY)
    ]
    world.registry.register_tools(specs)
    for spec in specs:
        world.registry.assign("bot", spec.key)
    return {spec.key for spec in specs}


async def test_tools_list_pages_over_streamable_http(world: World, serve_url: str) -> None:
    keys = await asyncio.to_thread(register_many, world)
    names: list[str] = []
    pages = 0
    cursor: str | None = None
    async with http_client(serve_url, world.agent_token) as client:
        while True:
            # the SDK refuses any event over 1 MiB: each page arriving is the check
            result = await client.list_tools(cursor=cursor, cache_mode="bypass")
            assert len(result.model_dump_json(by_alias=True)) < 1024 * 1024
            names += [tool.name for tool in result.tools]
            pages += 1
            if result.next_cursor is None:
                break
            cursor = result.next_cursor
        with pytest.raises(MCPError) as refused:
            await client.list_tools(cursor="garbage", cache_mode="bypass")
    assert refused.value.error.code == INVALID_PARAMS
    assert len(names) == len(set(names))  # nothing twice
    assert set(names) == keys | {"weather.current", "notes.create", "local.echo", STATUS_TOOL}
    assert pages > MANY // 100


async def test_list_changed_is_declared_and_sent_when_assignments_change(
    world: World, serve_url: str
) -> None:
    changed = anyio.Event()
    methods: list[str] = []

    async def on_message(message: Any) -> None:
        method = getattr(message, "method", None) or getattr(
            getattr(message, "root", None), "method", None
        )
        if isinstance(method, str):
            methods.append(method)
        if method == "notifications/tools/list_changed":
            changed.set()

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {world.agent_token}"}, timeout=30.0
    )
    transport = streamable_http_client(f"{serve_url}/mcp", http_client=http)
    async with http, Client(transport, mode="legacy", message_handler=on_message) as client:
        tools = client.server_capabilities.tools
        assert tools is not None and tools.list_changed is True
        await client.list_tools()
        await client.call_tool("weather.current", {"city": "Oslo"})
        assert "notifications/tools/list_changed" not in methods  # nothing changed yet
        await asyncio.to_thread(world.registry.assign, "bot", "secret.unassigned")
        await client.call_tool("weather.current", {"city": "Oslo"})
        with anyio.fail_after(10):
            await changed.wait()
        listed = {tool.name for tool in (await client.list_tools(cache_mode="bypass")).tools}
        assert "secret.unassigned" in listed
        # a tool's own change (disabled) is announced too
        changed = anyio.Event()
        await asyncio.to_thread(world.registry.set_tool_status, "secret.unassigned", "disabled")
        await client.call_tool("weather.current", {"city": "Oslo"})
        with anyio.fail_after(10):
            await changed.wait()
    assert methods.count("notifications/tools/list_changed") == 2


@pytest.fixture(scope="module")
def strict_url(database_url: str, mcp_keyring: Keyring) -> Iterator[str]:
    """`serve` with a bucket of 3 and a slow refill, so a test can empty it."""
    app = create_app(settings(database_url, mcp_keyring, rate_per_second=0.2, rate_burst=3))
    with serve_app(app) as url:
        yield url


def rpc(n: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "method": method, "params": params or {}}


async def test_only_tool_calls_spend_the_rate_limit_and_hints_agree(
    world: World, strict_url: str
) -> None:
    headers = {
        "Authorization": f"Bearer {world.agent_token}",
        "Accept": "application/json, text/event-stream",
    }
    async with httpx2.AsyncClient(base_url=strict_url, headers=headers, timeout=30.0) as http:
        init = await http.post(
            "/mcp",
            json=rpc(0, "initialize", {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            }),
        )  # fmt: skip
        assert init.status_code == 200
        http.headers["Mcp-Session-Id"] = init.headers["mcp-session-id"]
        http.headers["Mcp-Protocol-Version"] = "2025-06-18"
        sent = await http.post(
            "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}
        )
        assert sent.status_code == 202
        for n in range(1, 11):  # more messages than the bucket holds: none limited
            listed = await http.post("/mcp", json=rpc(n, "tools/list"))
            assert listed.status_code == 200
        call = rpc(20, "tools/call", {"name": "weather.current", "arguments": {"city": "Oslo"}})
        statuses = [(await http.post("/mcp", json=call)).status_code for _ in range(3)]
        assert statuses == [200, 200, 200]
        refused = await http.post("/mcp", json=call)
    assert refused.status_code == 429
    hint = re.search(r"retry in (\d+) s", refused.text)
    assert hint is not None, refused.text
    assert hint.group(1) == refused.headers["retry-after"]
