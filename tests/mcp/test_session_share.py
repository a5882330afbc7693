"""One agent cannot take the process's MCP sessions from every other agent.

The SDK caps open sessions per process (1000 here) and, at the cap, refuses every new
session with 503, whoever asks; sessions live 30 minutes idle. Without a share per agent,
one agent token (any tenant's, a leaked one included) could open them all in a second and
keep every other agent out for half an hour. Each agent now holds at most its share:
opening one more ends that agent's least recently used idle session (its client gets 404
next time and opens another, as MCP clients do), and when every one of them has a request
in flight the new one is refused (429), not another agent's.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.api.conftest import settings
from tests.api.servers import serve_app
from tests.mcp.conftest import World
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.errors import ConfigurationError
from toolrelay.mcp.limits import MAX_SESSIONS, SESSIONS_PER_AGENT_ENV
from toolrelay.mcp.server import McpSettings
from toolrelay.mcp.sessions import Admission, SessionShare

VERSION = "2025-06-18"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": VERSION,
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
SHARE = 3  # the small share of the app below


@pytest.fixture(scope="module")
def small_share_url(database_url: str, mcp_keyring: Keyring) -> Iterator[str]:
    """`serve` with a share of SHARE sessions per agent (read when the app is built)."""
    os.environ[SESSIONS_PER_AGENT_ENV] = str(SHARE)
    try:
        app = create_app(settings(database_url, mcp_keyring))
    finally:
        del os.environ[SESSIONS_PER_AGENT_ENV]
    with serve_app(app) as url:
        yield url


def auth(token: str) -> dict[str, str]:
    return ACCEPT | {"Authorization": f"Bearer {token}"}


async def open_session(http: aiohttp.ClientSession, url: str, token: str) -> tuple[int, str]:
    """POST initialize: (status, the session id, or the body when refused)."""
    async with http.post(f"{url}/mcp", json=INITIALIZE, headers=auth(token)) as answer:
        body = await answer.text()
        return answer.status, answer.headers.get("mcp-session-id", body)


async def ping(http: aiohttp.ClientSession, url: str, token: str, session: str) -> int:
    headers = auth(token) | {"mcp-session-id": session, "mcp-protocol-version": VERSION}
    async with http.post(f"{url}/mcp", json=PING, headers=headers) as answer:
        await answer.read()
        return answer.status


async def open_many(url: str, token: str, count: int, at_once: int = 8) -> list[tuple[int, str]]:
    gate = asyncio.Semaphore(at_once)
    async with aiohttp.ClientSession() as http:

        async def one() -> tuple[int, str]:
            async with gate:
                return await open_session(http, url, token)

        return await asyncio.gather(*(one() for _ in range(count)))


def test_one_agent_opening_more_sessions_than_the_process_holds_leaves_room_for_others(
    world: World, serve_url: str
) -> None:
    """The process's whole session count (the default settings) opened by one agent: every
    one of its opens succeeds, and another agent still opens a session and uses it."""

    async def scenario() -> None:
        flood = await open_many(serve_url, world.agent_token, MAX_SESSIONS + 20)
        refused = [s for s in flood if s[0] != 200]
        assert not refused, refused[:3]
        async with aiohttp.ClientSession() as http:
            status, session = await open_session(http, serve_url, world.other_agent_token)
            assert status == 200, session
            assert await ping(http, serve_url, world.other_agent_token, session) == 200
            # the flooding agent's oldest sessions were ended to make room for its newer ones
            assert await ping(http, serve_url, world.agent_token, flood[0][1]) == 404

    asyncio.run(scenario())


def test_a_new_session_ends_the_agents_least_recently_used_idle_one(
    world: World, small_share_url: str
) -> None:
    url = small_share_url

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            opened = [await open_session(http, url, world.agent_token) for _ in range(SHARE)]
            assert [s for s, _ in opened] == [200] * SHARE
            first, second, third = (sid for _, sid in opened)
            assert await ping(http, url, world.agent_token, first) == 200  # now the newest use
            status, fourth = await open_session(http, url, world.agent_token)
            assert status == 200, fourth
            assert await ping(http, url, world.agent_token, second) == 404  # the LRU one ended
            for alive in (first, third, fourth):
                assert await ping(http, url, world.agent_token, alive) == 200
            # another agent of the same owner has a share of its own
            others = [await open_session(http, url, world.other_agent_token) for _ in range(SHARE)]
            assert [s for s, _ in others] == [200] * SHARE
            for alive in (first, third, fourth):
                assert await ping(http, url, world.agent_token, alive) == 200

    asyncio.run(scenario())


def test_a_closed_session_frees_its_place(world: World, small_share_url: str) -> None:
    url = small_share_url

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            opened = [(await open_session(http, url, world.agent_token))[1] for _ in range(SHARE)]
            headers = auth(world.agent_token) | {"mcp-session-id": opened[0]}
            async with http.delete(f"{url}/mcp", headers=headers) as closed:
                assert closed.status == 200
            status, newest = await open_session(http, url, world.agent_token)
            assert status == 200, newest
            for alive in (*opened[1:], newest):  # nothing else was ended
                assert await ping(http, url, world.agent_token, alive) == 200

    asyncio.run(scenario())


def test_sessions_with_a_request_in_flight_are_not_ended_a_new_one_is_refused(
    world: World, small_share_url: str
) -> None:
    """Each of the agent's sessions holds its SSE stream open (a request in flight): one
    more session is 429, naming the share, and all of them keep working; once a stream is
    closed, that session is the one ended for the next."""
    url = small_share_url

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            opened = [(await open_session(http, url, world.agent_token))[1] for _ in range(SHARE)]
            streams: list[Any] = []
            for session in opened:
                headers = auth(world.agent_token) | {
                    "Accept": "text/event-stream",
                    "mcp-session-id": session,
                    "mcp-protocol-version": VERSION,
                }
                stream = await http.get(f"{url}/mcp", headers=headers)
                assert stream.status == 200
                streams.append(stream)
            async with http.post(
                f"{url}/mcp", json=INITIALIZE, headers=auth(world.agent_token)
            ) as refused:
                assert refused.status == 429
                assert "Retry-After" in refused.headers
                error = (await refused.json())["error"]
                assert error["code"] == "rate_limited"
                assert f"{SHARE} MCP sessions" in error["message"]
            for session in opened:
                assert await ping(http, url, world.agent_token, session) == 200
            streams[1].close()
            status, newest = await open_session(http, url, world.agent_token)
            waited = 0
            while status == 429 and waited < 100:  # until the server has seen the close
                await asyncio.sleep(0.05)
                waited += 1
                status, newest = await open_session(http, url, world.agent_token)
            assert status == 200, newest
            assert await ping(http, url, world.agent_token, opened[1]) == 404
            for alive in (opened[0], opened[2], newest):
                assert await ping(http, url, world.agent_token, alive) == 200
            for stream in streams:
                stream.close()

    asyncio.run(scenario())


def test_the_share_is_configurable_and_checked() -> None:
    assert McpSettings.from_env({}).sessions_per_agent == 32
    assert McpSettings.from_env({SESSIONS_PER_AGENT_ENV: " 4 "}).sessions_per_agent == 4
    with pytest.raises(ConfigurationError, match="not a whole number: 'many'"):
        McpSettings.from_env({SESSIONS_PER_AGENT_ENV: "many"})
    for bad in ("0", "-1", str(MAX_SESSIONS + 1)):
        with pytest.raises(ConfigurationError, match=f"between 1 and {MAX_SESSIONS}"):
            McpSettings.from_env({SESSIONS_PER_AGENT_ENV: bad})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_session_idle_for_the_sdks_timeout_holds_no_place() -> None:
    """The SDK ends a session idle for its timeout, counted from when its last request in
    flight ended; so does the share (an open stream holds the session, however old)."""
    clock, owner, agent = Clock(), uuid.uuid4(), uuid.uuid4()
    share = SessionShare(per_agent=2, idle_timeout=60.0, clock=clock)
    for sid in ("a", "b"):
        assert share.admit(owner, agent) == Admission(True)
        share.opened(owner, agent, sid)
        share.settled(owner, agent)
    assert share.begin(owner, agent, "a")  # a stream held open on "a" from t=0
    clock.now = 59.0
    share.begin(owner, agent, "b")
    share.end(owner, agent, "b", ended=False)  # "b" idle from t=59
    clock.now = 118.0
    assert share.count(owner, agent) == 2  # "a" busy, "b" idle 59 s: neither has timed out
    clock.now = 119.0
    assert share.count(owner, agent) == 1  # "b" timed out; "a" still holds its stream
    assert share.admit(owner, agent) == Admission(True)
    share.settled(owner, agent)  # that opening failed: nothing counted
    assert share.count(owner, agent) == 1
    share.end(owner, agent, "a", ended=True)  # the stream's session answered 404 / was deleted
    assert share.count(owner, agent) == 0
    assert not share.begin(owner, agent, "a")  # a session it no longer has is not counted again
