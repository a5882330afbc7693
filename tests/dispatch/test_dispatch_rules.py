"""Smaller dispatch rules: per-tool concurrency, query auth, idempotency keys, late checks."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web
from psycopg.types.json import Jsonb

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]


async def test_per_tool_concurrency_limit_is_respected(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    active = 0
    peak = 0

    async def counted(_: web.Request, _hit: int) -> web.Response:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        return web.json_response({})

    upstream.routes["/limited"] = counted
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/limited")
    registry.update_tool(tool["key"], {"max_concurrency": 2})
    for _ in range(12):
        registry.invoke(agent, tool["key"], {})
    await drain(concurrency=16)
    assert upstream.hits["/limited"] == 12
    assert peak == 2


async def test_query_placement_puts_the_key_in_the_query_string(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    keyring = Keyring.parse(generate_master_key())
    cred = CredentialStore(db, keyring).add(registry.owner, "api_key", "q", "qkey-12345")
    agent, tool = agent_with_tool(
        registry,
        endpoint_url=f"{upstream.base_url}/search?lang=en",
        auth_method="api_key",
        credential_ref=cred,
        auth_placement="query",
        auth_param_name="api_key",
    )
    inv = registry.invoke(agent, tool["key"], {"text": "cats"})
    await drain(keyring=keyring)
    seen = upstream.seen[-1]
    assert seen.query == {"lang": "en", "api_key": "qkey-12345", "text": "cats"}
    got = registry.get_invocation(inv)
    assert got["status"] == "completed"
    assert "qkey-12345" not in str(got["output"])  # the echoed query is scrubbed


async def test_recovered_write_with_idempotency_header_is_resent_with_the_same_key(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    agent, tool = agent_with_tool(
        registry,
        endpoint_url=f"{upstream.base_url}/idem",
        http_method="POST",
        egress_class="read_only",
    )
    registry.update_tool(tool["key"], {"idempotency_header": "Idempotency-Key"})
    inv = registry.invoke(agent, tool["key"], {})
    with db.connect(autocommit=True) as conn:  # a dead worker's claim, already marked sent
        conn.execute(
            "UPDATE agents.tool_invocations SET attempt = 1, lease_owner = 'dead',"
            " lease_expires_at = now() - interval '1 s', sent_at = now() WHERE id = %s",
            (inv,),
        )
    await drain()
    got = registry.get_invocation(inv)
    assert got["status"] == "completed"
    assert upstream.seen[-1].headers["Idempotency-Key"] == f"toolrelay-{inv}"


async def test_approval_that_expired_before_dispatch_sends_nothing(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/late",
                                  requires_approval=True)  # fmt: skip
    inv = registry.invoke(agent, tool["key"], {})
    registry.approve(inv)
    with db.connect(autocommit=True) as conn:
        conn.execute(
            "UPDATE agents.tool_invocations SET approval_expires_at = now() - interval '1 s'"
            " WHERE id = %s",
            (inv,),
        )
    await drain()
    got = registry.get_invocation(inv)
    assert (got["status"], got["approval_status"], got["error_code"]) == (
        "expired",
        "expired",
        "approval_expired",
    )
    assert upstream.seen == []


async def test_input_that_skipped_application_validation_fails_before_sending(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = agent_with_tool(
        registry,
        endpoint_url=f"{upstream.base_url}/strict",
        schema_input={
            "type": "object",
            "required": ["n"],
            "properties": {"n": {"type": "integer"}},
        },
    )
    agent_id = registry.get_agent(agent)["id"]
    with registry.db.as_owner(registry.owner) as conn:  # straight to SQL, as psql would
        row = conn.execute(
            "SELECT fn_invoke_tool(%s, %s, %s) AS id", (agent_id, tool["id"], Jsonb({"n": "x"}))
        ).fetchone()
    assert row is not None
    await drain()
    got = registry.get_invocation(row["id"])
    assert (got["status"], got["error_code"]) == ("failed", "invalid_input")
    assert "input.n" in got["error"]
    assert upstream.seen == []


async def test_reset_on_a_reused_connection_is_one_recorded_attempt(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def reset_after_first(request: web.Request, hit: int) -> web.Response:
        if hit > 1 and request.transport is not None:
            request.transport.close()  # drop the kept-alive connection without answering
        return web.json_response({"hit": hit})

    upstream.routes["/reset"] = reset_after_first
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/reset")
    registry.update_tool(tool["key"], {"max_attempts": 1})
    first = registry.invoke(agent, tool["key"], {})
    second = registry.invoke(agent, tool["key"], {})
    await drain(concurrency=1)
    assert registry.get_invocation(first)["status"] == "completed"
    got = registry.get_invocation(second)
    assert (got["status"], got["error_code"]) == ("failed", "network_error")
    assert len(got["attempts"]) == 1
    assert upstream.by_invocation[str(second)] == 1  # aiohttp did not quietly send it again


async def test_a_changed_concurrency_limit_applies_to_the_next_calls_claimed(
    database_url: str,
) -> None:
    """An owner lowers a tool's max_concurrency because its upstream is melting: the running
    worker must not keep the limit it first saw (it did, until restarted). Calls claimed
    after the change share a limiter of the new size; those already sending keep theirs."""
    worker = Worker(database_url, WorkerSettings(concurrency=16), None)
    tool = uuid.uuid4()
    first = worker._tool_limit({"tool_id": tool, "max_concurrency": 3})
    assert first is worker._tool_limit({"tool_id": tool, "max_concurrency": 3})  # shared
    lowered = worker._tool_limit({"tool_id": tool, "max_concurrency": 1})
    assert lowered is not None and lowered is not first
    async with lowered:
        assert lowered.locked()  # one call at a time from now on
    assert worker._tool_limit({"tool_id": tool, "max_concurrency": None}) is None
