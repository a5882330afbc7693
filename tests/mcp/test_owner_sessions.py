"""One tenant cannot take the process's MCP sessions from every other tenant.

Each agent held at most its share of the process's sessions, but a tenant was not capped:
an owner with 33 agents (agents are not capped either) opened 32 sessions with each, 999
of the process's 1000, and every other tenant's ``initialize`` was then 503 "Too many
open sessions" for as long as those stayed idle (30 minutes), again and again. Each owner
now holds at most its share too: opening one more ends that owner's least recently used
idle session (whichever of its agents holds it), as the agent's share does, and when every
one of them has a request in flight the new one is refused (429), never another tenant's.

Small caps here, so the flood is short: a process of PROCESS sessions (the SDK's cap,
patched where /mcp reads it), PER_AGENT per agent and PER_OWNER per owner.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import aiohttp
import pytest

from tests.api.conftest import settings
from tests.api.servers import serve_app
from tests.mcp.conftest import World, http_client, register_tools
from tests.mcp.test_session_share import auth, open_session, ping
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.errors import ConfigurationError
from toolrelay.mcp import http as mcp_http
from toolrelay.mcp.limits import (
    DEFAULT_SESSIONS_PER_OWNER,
    MAX_SESSIONS,
    SESSIONS_PER_AGENT_ENV,
    SESSIONS_PER_OWNER_ENV,
)
from toolrelay.mcp.server import McpSettings
from toolrelay.mcp.sessions import Admission, SessionShare, Victim
from toolrelay.registry import Registry
from toolrelay.tokens import TokenStore

PROCESS = 8  # the SDK's cap on the sessions open in the process
PER_AGENT = 3
PER_OWNER = 4  # so PER_OWNER + PER_AGENT + 1 fit in PROCESS: room for two other tenants


@pytest.fixture
def small_caps_url(database_url: str, mcp_keyring: Keyring) -> Iterator[str]:
    """`serve` whose process holds PROCESS sessions, PER_AGENT an agent, PER_OWNER an owner
    (all read when the app is built); one per test, so no test's sessions fill another's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mcp_http, "MAX_SESSIONS", PROCESS)
        patch.setenv(SESSIONS_PER_AGENT_ENV, str(PER_AGENT))
        patch.setenv(SESSIONS_PER_OWNER_ENV, str(PER_OWNER))
        app = create_app(settings(database_url, mcp_keyring))
    with serve_app(app) as url:
        yield url


def other_tenant(db: Database, world: World) -> tuple[uuid.UUID, str]:
    """Another owner with an agent that may call weather.current: (owner, agent token)."""
    owner = uuid.uuid4()
    registry = Registry(db, owner)
    register_tools(registry, world.upstream)
    agent = registry.create_agent("tenant-b-bot")
    registry.assign("tenant-b-bot", "weather.current")
    _, token = TokenStore(db).create(owner, agent, name="tenant-b-bot")
    return owner, token


def test_one_owners_many_agents_cannot_fill_the_process_and_lock_another_tenant_out(
    db: Database, world: World, small_caps_url: str
) -> None:
    url = small_caps_url
    # tenant A: three agents, whose shares together (9) exceed the process's 8 sessions
    third = world.registry.create_agent("third-bot")
    _, third_token = TokenStore(db).create(world.owner, third, name="third-bot")
    tokens_a = [world.agent_token, world.other_agent_token, third_token]
    _, token_b = other_tenant(db, world)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            flood: list[tuple[str, str]] = []  # (token, session), oldest first
            for token in tokens_a:
                for _ in range(PER_AGENT):
                    status, session = await open_session(http, url, token)
                    assert status == 200, (len(flood), session)
                    flood.append((token, session))
            # tenant A holds PER_OWNER sessions, its newest: each open past that ended A's
            # least recently used one (whichever of its agents held it)
            for token, session in flood[: len(flood) - PER_OWNER]:
                assert await ping(http, url, token, session) == 404
            for token, session in flood[len(flood) - PER_OWNER :]:
                assert await ping(http, url, token, session) == 200

            # tenant B's agent opens a session and calls a tool
            status, session_b = await open_session(http, url, token_b)
            assert status == 200, session_b
            assert await ping(http, url, token_b, session_b) == 200
            async with http_client(url, token_b) as client:
                city = f"Bergen-{uuid.uuid4().hex[:6]}"
                result = await client.call_tool("weather.current", {"city": city})
                assert result.is_error is False, result.content
                assert result.structured_content == {"city": city, "temperature_c": 21.5}

            # A's next sessions (of two of its agents, neither at its own share) end A's
            # older ones, whichever agent held them, never B's
            survivors = flood[len(flood) - PER_OWNER :]
            newer = []
            for token in tokens_a[:2] * (PER_OWNER // 2):
                status, newest = await open_session(http, url, token)
                assert status == 200, newest
                newer.append((token, newest))
            for token, session in survivors:
                assert await ping(http, url, token, session) == 404
            for token, session in newer:
                assert await ping(http, url, token, session) == 200
            assert await ping(http, url, token_b, session_b) == 200

    asyncio.run(scenario())


def test_an_owners_busy_sessions_refuse_its_next_one_not_another_tenants(
    db: Database, world: World, small_caps_url: str
) -> None:
    """Every one of tenant A's sessions holds its SSE stream open: A's next is 429 naming
    the owner's share; B still opens one."""
    url = small_caps_url
    third = world.registry.create_agent("third-bot")
    _, third_token = TokenStore(db).create(world.owner, third, name="third-bot")
    _, token_b = other_tenant(db, world)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            plan = [world.agent_token] * PER_AGENT + [world.other_agent_token]
            opened = [(token, (await open_session(http, url, token))[1]) for token in plan]
            streams = []
            for token, session in opened:
                headers = auth(token) | {
                    "Accept": "text/event-stream",
                    "mcp-session-id": session,
                    "mcp-protocol-version": "2025-06-18",
                }
                stream = await http.get(f"{url}/mcp", headers=headers)
                assert stream.status == 200
                streams.append(stream)
            try:
                status, body = await open_session(http, url, third_token)
                assert status == 429, body
                assert f"{PER_OWNER} MCP sessions" in body
                assert SESSIONS_PER_OWNER_ENV in body
                status, session_b = await open_session(http, url, token_b)
                assert status == 200, session_b
                for token, session in opened:
                    assert await ping(http, url, token, session) == 200
            finally:
                for stream in streams:
                    stream.close()

    asyncio.run(scenario())


def test_the_owners_share_is_configurable_and_checked() -> None:
    assert DEFAULT_SESSIONS_PER_OWNER == MAX_SESSIONS // 4
    assert McpSettings.from_env({}).sessions_per_owner == DEFAULT_SESSIONS_PER_OWNER
    assert McpSettings.from_env({SESSIONS_PER_OWNER_ENV: " 40 "}).sessions_per_owner == 40
    with pytest.raises(ConfigurationError, match="not a whole number: 'lots'"):
        McpSettings.from_env({SESSIONS_PER_OWNER_ENV: "lots"})
    # never as many as the whole process: one tenant would again lock the others out
    for bad in ("0", str(MAX_SESSIONS // 2 + 1), str(MAX_SESSIONS)):
        with pytest.raises(ConfigurationError, match=f"between 1 and {MAX_SESSIONS // 2}"):
            McpSettings.from_env({SESSIONS_PER_OWNER_ENV: bad})


def test_the_owners_share_ends_its_least_recently_used_idle_session_whichever_agents() -> None:
    owner, other_owner = uuid.uuid4(), uuid.uuid4()
    bot, helper, stranger = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    share = SessionShare(per_agent=3, per_owner=4, idle_timeout=60.0)

    def open_one(who: uuid.UUID, agent: uuid.UUID, sid: str) -> Admission:
        admission = share.admit(who, agent)
        if admission.admitted:
            share.opened(who, agent, sid)
        share.settled(who, agent)
        return admission

    for sid in ("b1", "b2", "b3"):
        assert open_one(owner, bot, sid) == Admission(True)
    assert open_one(owner, helper, "h1") == Admission(True)
    assert open_one(other_owner, stranger, "s1") == Admission(True)
    assert share.begin(owner, bot, "b1")  # b1 busy from now on: b2 is the LRU idle one
    # the owner's share is full: its LRU idle session goes, though another agent holds it
    assert open_one(owner, helper, "h2") == Admission(True, Victim(bot, "b2"), "owner")
    assert open_one(owner, helper, "h3") == Admission(True, Victim(bot, "b3"), "owner")
    # the agent's own share full first: its own LRU idle one goes
    assert open_one(owner, helper, "h4") == Admission(True, Victim(helper, "h1"), "agent")
    assert (share.count(owner), share.count(owner, bot), share.count(owner, helper)) == (4, 1, 3)
    for sid in ("h2", "h3", "h4"):
        assert share.begin(owner, helper, sid)
    # every one busy: refused, naming the share that is full
    assert open_one(owner, helper, "h6") == Admission(False, None, "agent")
    assert open_one(owner, uuid.uuid4(), "x") == Admission(False, None, "owner")
    assert open_one(other_owner, stranger, "s2") == Admission(True)  # never another tenant's
    assert share.count(other_owner) == 2
    # a session id is only ever the agent's that opened it
    assert not share.begin(owner, bot, "h3")
    assert not share.begin(other_owner, stranger, "b1")
