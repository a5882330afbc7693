"""A large answer's outcome is written apart: other calls' outcomes do not wait behind it.

The worker records outcomes in batches, one statement at a time. PostgreSQL parses a 5 MiB
answer nested 99 deep in ~0.7 s, and an audit had one tenant's tool answer three of those
a second: every other tenant's outcome was batched behind them (p99 30 s for a bystander's
call, for minutes). Here the statement that records the large answer is held (its commit
done, its answer to the worker not yet delivered), and another call, made after it, must
still be recorded meanwhile.
"""

from __future__ import annotations

import asyncio
import uuid

from aiohttp import web

from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.heldpipe import held_pipe
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay.dispatch.worker import LARGE_ANSWER_BYTES, Worker, WorkerSettings
from toolrelay.registry import Registry

WAIT = 30.0  # seconds, an upper bound for what takes well under one


async def until_status(registry: Registry, invocation: str, status: str) -> bool:
    """Whether the call reaches ``status`` within WAIT (read from the database)."""
    async with asyncio.timeout(WAIT):
        while (await asyncio.to_thread(registry.get_invocation, invocation))["status"] != status:
            await asyncio.sleep(0.02)
    return True


async def test_a_small_outcome_is_recorded_while_a_large_one_is_being_written(
    registry: Registry, upstream: Upstream, database_url: str
) -> None:
    marker = f"LARGE-{uuid.uuid4().hex}"

    async def large(_: web.Request, _hit: int) -> web.Response:
        return web.json_response({"mark": marker, "rows": ["x" * 100] * (LARGE_ANSWER_BYTES // 90)})

    async def small(_: web.Request, _hit: int) -> web.Response:
        return web.json_response({"ok": True})

    upstream.routes["/large"] = large
    upstream.routes["/small"] = small
    agent, big = agent_with_tool(registry, key="big.get", endpoint_url=f"{upstream.base_url}/large")
    add_tool(registry, key="small.get", endpoint_url=f"{upstream.base_url}/small")
    registry.assign(agent, "small.get")
    async with held_pipe(database_url, marker.encode()) as (pipe, piped_url):
        settings = WorkerSettings(concurrency=4, lease_seconds=30, poll_interval=0.05)
        worker = Worker(piped_url, settings, None, LOOPBACK_ONLY)
        running = asyncio.create_task(worker.run())
        try:
            first = await asyncio.to_thread(registry.invoke, agent, big["key"], {})
            await asyncio.wait_for(pipe.held.wait(), WAIT)  # its outcome's statement is in
            second = await asyncio.to_thread(registry.invoke, agent, "small.get", {})
            assert await until_status(registry, second, "completed")
        finally:
            pipe.release()
            worker.stop()
            await asyncio.wait_for(running, WAIT)
    assert registry.get_invocation(first)["status"] == "completed"
