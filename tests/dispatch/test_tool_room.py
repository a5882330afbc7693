"""A tool at its max_concurrency holds no more of a worker's slots than its limit.

An owner sets ``max_concurrency`` to protect a slow upstream. The worker claimed calls in
order and let those over the limit wait for it inside their slots: with 8 calls queued for
a tool limited to 1, a worker of 4 slots held 4 of them, 3 waiting, and nothing else ran,
any owner's, for as long as the one call sending took (30 s at the default timeout, times
the queue's length over the limit). Now a claim takes no more calls of a tool than its room
in this worker, skips a tool that has none, and a call handed over by ``serve`` for a full
tool is given back to the queue instead of waiting in a slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]
SENT_WITHIN = 10.0  # seconds; a call stuck behind the full tool fails the test instead


async def test_a_full_tool_does_not_keep_other_owners_calls_waiting(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str, drain: Drain
) -> None:
    release, fast_sent = asyncio.Event(), asyncio.Event()
    active = peak = 0

    async def slow(_: web.Request, _hit: int) -> web.Response:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await release.wait()
        active -= 1
        return web.json_response({"slow": True})

    async def fast(_: web.Request, _hit: int) -> web.Response:
        fast_sent.set()
        return web.json_response({"fast": True})

    upstream.routes["/slow"] = slow
    upstream.routes["/fast"] = fast
    limited, other = make_registry(), make_registry()
    agent, tool = agent_with_tool(limited, endpoint_url=f"{upstream.base_url}/slow")
    limited.update_tool(tool["key"], {"max_concurrency": 1})
    slow_calls = [limited.invoke(agent, tool["key"], {}) for _ in range(8)]
    other_agent, other_tool = agent_with_tool(other, endpoint_url=f"{upstream.base_url}/fast")
    fast_call = other.invoke(other_agent, other_tool["key"], {})  # queued behind all 8

    worker = Worker(
        database_url, WorkerSettings(concurrency=4, lease_seconds=5.0), None, LOOPBACK_ONLY
    )
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(fast_sent.wait(), SENT_WITHIN)
        assert upstream.hits["/slow"] == 1  # the slow tool's one call is still being sent
        # and the calls of it not started wait in the queue, not in the worker's slots
        assert worker.sending <= 1 + 1  # the slow call, and the fast one until recorded
    finally:
        release.set()
        worker.stop()
        await running
    await drain()  # what the stopped worker handed back
    assert peak == 1
    assert upstream.hits["/slow"] == 8  # each sent once
    for call in slow_calls:
        got = limited.get_invocation(call)
        assert got["status"] == "completed", got
        assert len(got["attempts"]) == 1  # given back unsent: no attempt recorded for it
    assert other.get_invocation(fast_call)["status"] == "completed"
