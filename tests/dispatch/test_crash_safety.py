"""A worker killed with SIGKILL mid-request: writes are never re-sent, reads are retried."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]
ARRIVAL_TIMEOUT = 30.0  # seconds for the killed worker to reach the upstream


async def start_worker_process(database_url: str) -> asyncio.subprocess.Process:
    env = os.environ | {
        "DATABASE_URL": database_url,
        "TOOLRELAY_EGRESS_ALLOW": "127.0.0.1",
        "TOOLRELAY_MASTER_KEY": "",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "toolrelay.cli", "worker", "--lease-seconds", "2",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def kill_when_request_arrives(upstream: Upstream, proc: asyncio.subprocess.Process) -> None:
    try:
        await asyncio.wait_for(upstream.arrived.wait(), ARRIVAL_TIMEOUT)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


@pytest.mark.parametrize(
    ("method", "status", "hits"), [("POST", "failed", 1), ("GET", "completed", 2)]
)
async def test_worker_killed_mid_request(
    registry: Registry,
    upstream: Upstream,
    drain: Drain,
    database_url: str,
    method: str,
    status: str,
    hits: int,
) -> None:
    async def slow_first(_: web.Request, hit: int) -> web.Response:
        if hit == 1:
            await asyncio.sleep(10)
        return web.json_response({"hit": hit})

    upstream.routes["/slow"] = slow_first
    agent, tool = agent_with_tool(
        registry,
        endpoint_url=f"{upstream.base_url}/slow",
        http_method=method,
        egress_class="read_only",
    )
    inv_id = registry.invoke(agent, tool["key"], {})
    proc = await start_worker_process(database_url)
    await kill_when_request_arrives(upstream, proc)
    await drain(lease_seconds=2.0)  # recovers the dead worker's lease once it expires
    inv = registry.get_invocation(inv_id)
    assert inv["status"] == status, inv["error"]
    assert upstream.by_invocation[str(inv_id)] == hits
    if method == "POST":
        assert inv["error_code"] == "outcome_unknown"
    else:
        assert inv["output"] == {"hit": 2}
