"""Fixtures for MCP: a real `serve` app (in-process worker, loopback egress) on uvicorn, an
upstream it calls, one owner's world of tools and agents, and MCP clients from the official
SDK over stdio (a spawned `python -m toolrelay.cli mcp`), streamable HTTP, or in process."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from aiohttp import web
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import ServerRequestContext

from tests.api.conftest import settings
from tests.api.servers import serve_app, threaded_upstream
from tests.dispatch.upstream import Upstream
from toolrelay.api import create_app
from toolrelay.credentials import Keyring, MasterKey
from toolrelay.db import Database
from toolrelay.mcp.server import McpSettings, build_server
from toolrelay.registry import Registry, ToolSpec
from toolrelay.tokens import Caller, TokenStore

REPO = Path(__file__).resolve().parents[2]

WEATHER_INPUT = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_OUTPUT = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature_c": {"type": "number"}},
    "required": ["city", "temperature_c"],
}
NOTE_INPUT = {
    "type": "object",
    "properties": {"text": {"type": "string", "minLength": 1}},
    "required": ["text"],
}
NOTE_OUTPUT = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "text": {"type": "string"}},
    "required": ["id"],
}


@pytest.fixture(scope="session")
def mcp_keyring() -> Keyring:
    return Keyring([MasterKey("mcp-test", secrets.token_bytes(32))])


async def weather(request: web.Request, _hit: int) -> web.StreamResponse:
    city = request.query.get("city", "")
    if city == "Atlantis":
        return web.json_response({"error": "no such city"}, status=500)
    if city == "Nowhere":  # an answer that does not match the output schema
        return web.json_response({"city": city, "temperature_c": "warm"})
    if city == "Slowtown":
        await asyncio.sleep(2.0)
    return web.json_response({"city": city, "temperature_c": 21.5})


async def notes(request: web.Request, hit: int) -> web.StreamResponse:
    body = await request.json()
    return web.json_response({"id": f"note-{hit}", "text": body.get("text")}, status=201)


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    with threaded_upstream() as server:
        server.routes["/weather"] = weather
        server.routes["/notes"] = notes
        yield server


@pytest.fixture(scope="module")
def serve_url(database_url: str, mcp_keyring: Keyring) -> Iterator[str]:
    """`toolrelay serve` as the CLI builds it: the API, /mcp, and the in-process worker.

    Per module: a worker left running would claim other test modules' invocations."""
    with serve_app(create_app(settings(database_url, mcp_keyring))) as url:
        yield url


@dataclass
class World:
    """One owner with tools, an agent (``bot``) with some of them, and tokens."""

    db: Database
    owner: uuid.UUID
    registry: Registry
    agent_id: uuid.UUID
    agent_token: str
    agent_token_id: uuid.UUID
    owner_token: str
    other_agent_id: uuid.UUID
    other_agent_token: str
    upstream: Upstream
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def caller(self) -> Caller:
        return Caller(owner=self.owner, agent_id=self.agent_id)

    def requests_to(self, path: str) -> list[Any]:
        return [seen for seen in self.upstream.seen if seen.path == path]


def register_tools(registry: Registry, upstream: Upstream) -> None:
    base = upstream.base_url
    registry.register_tool(
        ToolSpec(
            key="weather.current",
            name="Current weather",
            description="The weather in a city now.",
            endpoint_url=f"{base}/weather",
            http_method="GET",
            egress_class="read_only",
            schema_input=WEATHER_INPUT,
            schema_output=WEATHER_OUTPUT,
            request_template={"query": {"city": "{{input.city}}"}},
        )
    )
    registry.register_tool(
        ToolSpec(
            key="notes.create",
            name="Create a note",
            description="Writes a note.",
            endpoint_url=f"{base}/notes",
            http_method="POST",
            egress_class="write",
            schema_input=NOTE_INPUT,
            schema_output=NOTE_OUTPUT,
            request_template={"body": {"text": "{{input.text}}"}},
        )
    )
    registry.register_tool(  # egress 'none': no outside world (and no schemas at all)
        ToolSpec(
            key="local.echo",
            name="Echo",
            endpoint_url=f"{base}/echo",
            http_method="POST",
            egress_class="none",
        )
    )
    for key in ("secret.unassigned", "notes.denied", "notes.disabled"):
        registry.register_tool(
            ToolSpec(
                key=key,
                name=key,
                endpoint_url=f"{base}/notes",
                http_method="GET",
                egress_class="read_only",
            )
        )


@pytest.fixture
def world(db: Database, upstream: Upstream) -> World:
    owner = uuid.uuid4()
    registry = Registry(db, owner)
    register_tools(registry, upstream)
    agent_id = registry.create_agent("bot")
    other_id = registry.create_agent("other-bot")
    for key in ("weather.current", "notes.create", "local.echo", "notes.disabled"):
        registry.assign("bot", key)
    registry.assign("bot", "notes.denied", allowed=False)
    registry.assign("other-bot", "weather.current")
    registry.set_tool_status("notes.disabled", "disabled")
    tokens = TokenStore(db)
    info, agent_token = tokens.create(owner, agent_id, name="bot")
    _, owner_token = tokens.create(owner, name="owner")
    _, other_token = tokens.create(owner, other_id, name="other-bot")
    return World(
        db, owner, registry, agent_id, agent_token, info.id, owner_token, other_id,
        other_token, upstream,
    )  # fmt: skip


# --- clients ----------------------------------------------------------------------------------


def stdio_parameters(database_url: str, token: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "toolrelay.cli", "mcp"],
        env={
            "DATABASE_URL": database_url,
            "TOOLRELAY_AGENT_TOKEN": token,
            "TOOLRELAY_HOME": os.environ.get("TMPDIR", "/tmp"),
            "PYTHONPATH": str(REPO / "src"),
        }
        | env,
        cwd=str(REPO),
    )


@asynccontextmanager
async def http_client(url: str, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's streamable HTTP client, sending ``Authorization: Bearer <token>``."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30.0, read=120.0),
    )
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as c:
        yield c


@asynccontextmanager
async def stdio_client(
    database_url: str, token: str, mode: str = "auto", **env: str
) -> AsyncIterator[Client]:
    async with Client(stdio_parameters(database_url, token, **env), mode=mode) as client:
        yield client


@pytest.fixture
def inproc(world: World, serve_url: str) -> Callable[..., Client]:
    """An in-process client of ``build_server`` acting as ``bot`` (no transport at all); the
    `serve` app's worker dispatches its calls."""

    def make(**options: Any) -> Client:
        async def caller_for(_: ServerRequestContext[Any, Any]) -> Caller:
            return world.caller

        server = build_server(world.db, caller_for, McpSettings(**options))
        return Client(server, mode="legacy")

    return make


def structured_text(result: Any) -> Any:
    """The JSON in a result's (single) text block."""
    (block,) = result.content
    return json.loads(block.text)
