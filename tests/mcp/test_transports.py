"""MCP end to end with the official SDK's client, over stdio (`python -m toolrelay.cli mcp`)
and over streamable HTTP (/mcp on a real `serve` app whose in-process worker dispatches to a
loopback upstream), in both the handshake era ("legacy") and the SDK's default ("auto")."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError

from tests.mcp.conftest import (
    NOTE_INPUT,
    NOTE_OUTPUT,
    WEATHER_INPUT,
    WEATHER_OUTPUT,
    World,
    http_client,
    stdio_client,
    stdio_parameters,
    structured_text,
)
from toolrelay.mcp.server import (
    META_INVOCATION,
    META_OUTPUT_SCHEMA,
    META_REQUIRES_APPROVAL,
    declared_output_schema,
)
from toolrelay.tokens import TokenStore

TRANSPORTS = [
    pytest.param(("stdio", "legacy"), id="stdio-legacy"),
    pytest.param(("stdio", "auto"), id="stdio-auto"),
    pytest.param(("http", "legacy"), id="http-legacy"),
    pytest.param(("http", "auto"), id="http-auto"),
]


def connect(
    kind: str, mode: str, world: World, database_url: str, serve_url: str, token: str | None = None
) -> AbstractAsyncContextManager[Client]:
    token = token or world.agent_token
    if kind == "stdio":
        return stdio_client(database_url, token, mode)
    return http_client(serve_url, token, mode)


async def approve(world: World, invocation_id: str) -> None:
    await asyncio.to_thread(world.registry.approve, invocation_id)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_list_call_read_then_write_awaiting_approval_then_status(
    transport: tuple[str, str], world: World, database_url: str, serve_url: str
) -> None:
    kind, mode = transport
    async with connect(kind, mode, world, database_url, serve_url) as client:
        # tools/list: assigned, allowed, active tools (keys as they are) plus the status tool
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == {
            "weather.current", "notes.create", "local.echo", "toolrelay_invocation_status",
        }  # fmt: skip

        weather = listed["weather.current"]
        assert weather.title == "Current weather"
        assert weather.description == "The weather in a city now."
        assert weather.input_schema == WEATHER_INPUT
        # the output, or the "not finished yet" status a slow call answers (issue 15)
        assert weather.output_schema == declared_output_schema(WEATHER_OUTPUT)
        assert weather.annotations is not None
        assert weather.annotations.read_only_hint is True
        assert weather.annotations.destructive_hint is False
        assert weather.annotations.open_world_hint is True

        note = listed["notes.create"]
        assert note.input_schema == NOTE_INPUT | {"type": "object"}
        # A call first answers "awaiting approval", which cannot match an outputSchema: the
        # schema travels in _meta instead.
        assert note.output_schema is None
        assert note.meta == {META_REQUIRES_APPROVAL: True, META_OUTPUT_SCHEMA: NOTE_OUTPUT}
        assert note.annotations is not None
        assert note.annotations.read_only_hint is False
        assert note.annotations.destructive_hint is True

        echo = listed["local.echo"]
        assert echo.input_schema == {"type": "object"}
        assert echo.output_schema is None
        assert echo.annotations is not None
        # egress none with an endpoint is gated: announced as a write (issue 15)
        assert echo.annotations.read_only_hint is False
        assert echo.annotations.open_world_hint is False

        status_tool = listed["toolrelay_invocation_status"]
        assert status_tool.input_schema["required"] == ["invocation_id"]

        # a read: dispatched by the worker, answered with its structured output
        city = f"Paris-{uuid.uuid4().hex[:6]}"
        result = await client.call_tool("weather.current", {"city": city})
        assert result.is_error is False, result.content
        assert result.structured_content == {"city": city, "temperature_c": 21.5}
        assert structured_text(result) == result.structured_content
        assert result.meta is not None
        assert result.meta[META_INVOCATION]["status"] == "completed"
        (seen,) = [s for s in world.requests_to("/weather") if s.query.get("city") == city]
        assert seen.method == "GET"

        # a write: not sent, answered (not as an error) with the invocation id
        text = f"hello {uuid.uuid4().hex[:6]}"
        pending = await client.call_tool("notes.create", {"text": text})
        assert pending.is_error is False
        assert pending.structured_content is not None  # a status, not an output (issue 15)
        assert pending.structured_content["status"] == "pending"
        assert pending.meta is not None
        invocation = pending.meta[META_INVOCATION]
        assert invocation["status"] == "pending"
        assert invocation["approval_status"] == "pending"
        (block,) = pending.content
        assert "awaits a human's approval" in block.text
        assert invocation["invocation_id"] in block.text
        assert not [s for s in world.requests_to("/notes") if s.body == {"text": text}]

        still = await client.call_tool(
            "toolrelay_invocation_status", {"invocation_id": invocation["invocation_id"]}
        )
        assert still.is_error is False
        assert still.structured_content is not None
        assert still.structured_content["status"] == "pending"

        # the owner approves; the status tool waits for the dispatcher's outcome
        await approve(world, invocation["invocation_id"])
        done = await client.call_tool(
            "toolrelay_invocation_status",
            {"invocation_id": invocation["invocation_id"], "wait_seconds": 20},
        )
        assert done.is_error is False, done.content
        assert done.structured_content is not None
        assert done.structured_content["status"] == "completed"
        assert done.structured_content["output"]["text"] == text
        assert done.structured_content["output"]["id"].startswith("note-")
        sent = [s for s in world.requests_to("/notes") if s.body == {"text": text}]
        assert len(sent) == 1 and sent[0].method == "POST"


# --- who may connect ---------------------------------------------------------------------------


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


def post_mcp(serve_url: str, token: str | None, body: Any, **headers: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(
        f"{serve_url}/mcp", json=body, headers=MCP_HEADERS | auth | headers, timeout=30
    )


def test_http_refuses_owner_tokens_bad_tokens_and_no_token(world: World, serve_url: str) -> None:
    owner = post_mcp(serve_url, world.owner_token, INITIALIZE)
    assert owner.status_code == 403
    assert owner.json()["error"]["code"] == "permission_denied"
    assert "agent token" in owner.json()["error"]["message"]
    for token in ("trk_not-a-real-token", "garbage", None):
        refused = post_mcp(serve_url, token, INITIALIZE)
        assert refused.status_code == 401, token
        assert refused.json()["error"]["code"] == "unauthenticated"
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    accepted = post_mcp(serve_url, world.agent_token, INITIALIZE)
    assert accepted.status_code == 200, accepted.text


def test_http_session_belongs_to_the_agent_that_opened_it(world: World, serve_url: str) -> None:
    opened = post_mcp(serve_url, world.agent_token, INITIALIZE)
    assert opened.status_code == 200
    session = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    headers = {"mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
    hijack = post_mcp(serve_url, world.other_agent_token, listing, **headers)
    assert hijack.status_code == 404
    revoked_owner = post_mcp(serve_url, world.owner_token, listing, **headers)
    assert revoked_owner.status_code == 403


def test_http_refuses_cross_origin_browser_requests(world: World, serve_url: str) -> None:
    foreign = post_mcp(serve_url, world.agent_token, INITIALIZE, Origin="https://evil.example")
    assert foreign.status_code == 403
    same = post_mcp(serve_url, world.agent_token, INITIALIZE, Origin=serve_url)
    assert same.status_code == 200


def test_mcp_is_not_in_the_openapi_schema(serve_url: str) -> None:
    paths = httpx.get(f"{serve_url}/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/mcp")]


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("owner", "not an owner token"),
        ("trk_unknown", "unknown, revoked or expired"),
        ("", "TOOLRELAY_AGENT_TOKEN is not set"),
    ],
)
def test_stdio_refuses_anything_but_an_agent_token(
    token: str, message: str, world: World, database_url: str
) -> None:
    token = world.owner_token if token == "owner" else token
    params = stdio_parameters(database_url, token)
    env = {"PATH": "/usr/bin:/bin"} | (params.env or {})
    done = subprocess.run(
        [sys.executable, *params.args], env=env, cwd=params.cwd, input="",
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == ""  # stdout is the protocol's: nothing else ever goes there
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert "Traceback" not in done.stderr


async def test_stdio_revoking_the_token_ends_access_at_once(
    world: World, database_url: str
) -> None:
    async with stdio_client(database_url, world.agent_token, "legacy") as client:
        assert (await client.list_tools()).tools
        await asyncio.to_thread(TokenStore(world.db).revoke, world.owner, world.agent_token_id)
        with pytest.raises(MCPError, match="unknown, revoked or expired"):
            await client.list_tools()


async def test_each_agent_sees_its_own_tools_over_http(world: World, serve_url: str) -> None:
    async with http_client(serve_url, world.other_agent_token) as other:
        names = {tool.name for tool in (await other.list_tools()).tools}
        assert names == {"weather.current", "toolrelay_invocation_status"}
        with pytest.raises(MCPError, match="Unknown tool: notes.create"):
            await other.call_tool("notes.create", {"text": "x"})
