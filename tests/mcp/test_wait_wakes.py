"""MCP tools/call and toolrelay_invocation_status wake on the outcome, not on a poll.

The official SDK client over streamable HTTP against the real app, whose waits poll only
every 30 s while nobody listens: an answer within a second comes from the outcome's
NOTIFY."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from fastapi import FastAPI

from tests.api.conftest import settings
from tests.api.gates import Gate, until_async
from tests.api.servers import serve_app
from tests.mcp.conftest import World, http_client
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.dispatch.outcomes import Outcomes
from toolrelay.mcp.server import META_INVOCATION, STATUS_TOOL
from toolrelay.registry import ToolSpec

SLOW_POLL = 30.0  # seconds: far above every bound below
WAKE_LIMIT = 1.0  # seconds from the outcome to the answer


@pytest.fixture(scope="module")
def app(database_url: str, mcp_keyring: Keyring) -> FastAPI:
    return create_app(settings(database_url, mcp_keyring, wait_poll_seconds=SLOW_POLL))


@pytest.fixture(scope="module")
def serve_url(app: FastAPI) -> Iterator[str]:
    with serve_app(app) as url:
        yield url


@pytest.fixture
def gate(world: World) -> Iterator[Gate]:
    """`held.read` and `held.write`, assigned to bot, answering once the gate opens."""
    gate = Gate()
    path = f"/held/{uuid.uuid4().hex}"
    world.upstream.routes[path] = gate.handler
    for key, method, egress in (("held.read", "GET", "read_only"), ("held.write", "POST", "write")):
        world.registry.register_tool(
            ToolSpec(key=key, name=key, endpoint_url=f"{world.upstream.base_url}{path}",
                     http_method=method, egress_class=egress)
        )  # fmt: skip
        world.registry.assign("bot", key)
    yield gate
    gate.open()  # never leave a request held


def outcomes_of(app: FastAPI) -> Outcomes:
    outcomes: Outcomes = app.state.toolrelay.outcomes
    return outcomes


async def test_a_read_call_answers_within_a_second_of_the_upstream(
    world: World, gate: Gate, app: FastAPI, serve_url: str
) -> None:
    outcomes = outcomes_of(app)
    async with http_client(serve_url, world.agent_token) as client:
        call = asyncio.create_task(client.call_tool("held.read", {}))
        assert await until_async(outcomes.waiting)
        gate.open()
        result = await call
    assert gate.answered_at is not None
    assert time.monotonic() - gate.answered_at < WAKE_LIMIT
    assert result.is_error is False, result.content
    assert result.meta is not None and result.meta[META_INVOCATION]["status"] == "completed"


async def test_a_read_call_goes_to_the_in_process_worker_as_it_is_inserted(
    world: World, gate: Gate, app: FastAPI, serve_url: str, database_url: str
) -> None:
    """tools/call through `serve`: the call is claimed for its worker by the insert
    (migration 0036), never by a claim UPDATE (tests/api/test_claim_at_invoke.py)."""
    worker = app.state.toolrelay.handoff.worker
    assert await until_async(lambda: worker.taking_hand_offs)  # else made unclaimed
    async with http_client(serve_url, world.agent_token) as client:
        call = asyncio.create_task(client.call_tool("held.read", {}))
        assert await until_async(outcomes_of(app).waiting)  # held at the upstream
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT lease_owner, attempt, updated_at = created_at FROM agents.tool_invocations"
                " WHERE agent_id = %s ORDER BY created_at DESC LIMIT 1",
                (world.agent_id,),
            ).fetchone()
        gate.open()
        result = await call
    assert row == (worker.settings.worker_id, 1, True)
    assert result.is_error is False, result.content


async def test_awaiting_approval_at_once_then_status_wakes_on_the_outcome(
    world: World, gate: Gate, app: FastAPI, serve_url: str
) -> None:
    outcomes = outcomes_of(app)
    async with http_client(serve_url, world.agent_token) as client:
        started = time.monotonic()
        pending = await client.call_tool("held.write", {})
        assert time.monotonic() - started < WAKE_LIMIT  # "awaiting approval" does not wait
        assert pending.meta is not None
        invocation_id = pending.meta[META_INVOCATION]["invocation_id"]
        assert pending.meta[META_INVOCATION]["status"] == "pending"

        await asyncio.to_thread(world.registry.approve, invocation_id)
        status = asyncio.create_task(
            client.call_tool(STATUS_TOOL, {"invocation_id": invocation_id, "wait_seconds": 10})
        )
        assert await until_async(lambda: outcomes.waiting(uuid.UUID(invocation_id)))
        gate.open()
        done = await status
    assert gate.answered_at is not None
    assert time.monotonic() - gate.answered_at < WAKE_LIMIT
    assert done.structured_content is not None
    assert done.structured_content["status"] == "completed", done.structured_content
