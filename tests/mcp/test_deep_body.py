"""A body nested too deep for Python's JSON parser is the client's error at /mcp, answered as
any other: 401 without a valid token, the SDK's parse error (400) with one.

The door reads a POST's JSON before the SDK does (which messages are tool calls, whether it
opens a session), and ``json.loads`` raises RecursionError, not ValueError, on deep nesting:
the request failed as a 500 with a traceback in the server log, before its token was looked
at, for anyone who could reach /mcp.
"""

from __future__ import annotations

import base64

import httpx
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from tests.mcp.conftest import World, http_client

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
DEPTH = 200_000  # far past the parser's recursion limit, well inside the 1 MiB body limit
DEEP_CALL = (
    '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "weather.get",'
    ' "arguments": {"city": ' + "[" * DEPTH + "]" * DEPTH + "}}}"
)
DEEP_INITIALIZE = '{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": ' + (
    "[" * DEPTH + "]" * DEPTH + "}"
)


def post(serve_url: str, token: str | None, body: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{serve_url}/mcp", content=body, headers=MCP_HEADERS | auth, timeout=30)


def test_a_body_too_deep_to_parse_is_a_401_or_a_parse_error_never_a_500(
    world: World, serve_url: str
) -> None:
    for body in (DEEP_CALL, DEEP_INITIALIZE):
        for token in (None, "trk_not-a-real-token"):
            refused = post(serve_url, token, body)
            assert refused.status_code == 401, refused.text[:300]
            assert refused.json()["error"]["code"] == "unauthenticated"
        answer = post(serve_url, world.agent_token, body)
        assert answer.status_code == 400, answer.text[:300]
        assert "Parse error" in answer.json()["error"]["message"]


async def test_a_cursor_too_deep_to_parse_is_an_invalid_cursor(
    world: World, serve_url: str
) -> None:
    """tools/list's cursor is base64 of JSON: one nested too deep was an internal error."""
    raw = ("[" * DEPTH + "]" * DEPTH).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    async with http_client(serve_url, world.agent_token) as client:
        with pytest.raises(MCPError) as refused:
            await client.list_tools(cursor=cursor, cache_mode="bypass")
        assert (await client.list_tools(cache_mode="bypass")).tools  # the session goes on
    assert refused.value.error.code == INVALID_PARAMS
    assert "invalid cursor" in refused.value.error.message
