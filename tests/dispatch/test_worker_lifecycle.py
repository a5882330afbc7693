"""SIGTERM, metrics, and destinations the guard refuses, through the whole dispatcher."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.heldpipe import held_pipe
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]
WAIT = 30.0  # seconds, an upper bound for things that take well under one
STOP_GRACE = 2.0  # seconds a worker with nothing to wait for takes to stop, with margin


async def test_sigterm_finishes_in_flight_calls_and_claims_no_more(
    registry: Registry, upstream: Upstream, database_url: str
) -> None:
    release = asyncio.Event()

    async def held(_: web.Request, hit: int) -> web.Response:
        await release.wait()
        return web.json_response({"hit": hit})

    upstream.routes["/held"] = held
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/held")
    ids = [registry.invoke(agent, tool["key"], {}) for _ in range(6)]
    env = os.environ | {"DATABASE_URL": database_url, "TOOLRELAY_EGRESS_ALLOW": "127.0.0.1",
                        "TOOLRELAY_MASTER_KEY": ""}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "toolrelay.cli", "worker", "--concurrency", "2",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    async with asyncio.timeout(WAIT):
        while sum(upstream.hits.values()) < 2:
            await asyncio.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.3)  # give a misbehaving worker the chance to claim more
    release.set()
    assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    statuses = [registry.get_invocation(i) for i in ids]
    done = [s for s in statuses if s["status"] == "completed"]
    waiting = [s for s in statuses if s["status"] == "running"]
    assert len(done) == 2 and len(waiting) == 4
    assert all(s["lease_owner"] is None and s["attempt"] == 0 for s in waiting)
    assert sum(upstream.hits.values()) == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_metrics_are_served_in_prometheus_format(
    registry: Registry, upstream: Upstream, database_url: str
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/m")
    inv = registry.invoke(agent, tool["key"], {})
    port = free_port()
    worker = Worker(database_url, WorkerSettings(concurrency=4, metrics_port=port), None,
                    LOOPBACK_ONLY)  # fmt: skip
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(WAIT):
            while registry.get_invocation(inv)["status"] != "completed":
                await asyncio.sleep(0.05)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as r,
        ):
            text = await r.text()
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT)
    assert 'toolrelay_invocations_total{status="completed",error_code=""}' in text
    assert "toolrelay_attempt_seconds_bucket" in text
    assert "# TYPE toolrelay_attempt_seconds histogram" in text


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0x7f.0.0.1/x",
        "http://localhost/x",
    ],
)
async def test_dispatcher_refuses_blocked_destinations(
    registry: Registry, upstream: Upstream, drain: Drain, url: str
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=url)
    inv = registry.invoke(agent, tool["key"], {})
    await drain(egress=EgressPolicy.from_env({}))  # the default: nothing private allowed
    got = registry.get_invocation(inv)
    assert (got["status"], got["error_code"]) == ("failed", "egress_blocked")
    assert got["attempts"][0]["error_code"] == "egress_blocked"


async def test_redirect_from_allowed_host_to_blocked_one_is_refused(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def bounce(_: web.Request, _hit: int) -> web.Response:
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data")

    upstream.routes["/bounce"] = bounce
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/bounce")
    inv = registry.invoke(agent, tool["key"], {})
    await drain()
    got = registry.get_invocation(inv)
    assert (got["status"], got["error_code"]) == ("failed", "egress_blocked")
    assert upstream.hits["/bounce"] == 1


async def test_a_call_handed_over_as_the_worker_stops_is_not_left_claimed(
    registry: Registry, upstream: Upstream, database_url: str
) -> None:
    """A call made in `serve` is claimed for its worker as it is inserted, then handed over
    (dispatch/handoff.py). Here the worker's read of it is answered late (held on the wire,
    tests/dispatch/heldpipe.py) while it is told to stop. It waits for that read: the call
    is given back to any worker, not left claimed by a stopped one until its lease runs
    out."""
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/handed")
    async with held_pipe(database_url, b"AND i.attempt = 1") as (pipe, piped_url):
        settings = WorkerSettings(lease_seconds=300, poll_interval=300)
        worker = Worker(piped_url, settings, None, LOOPBACK_ONLY)
        task = asyncio.create_task(worker.run())
        async with asyncio.timeout(WAIT):
            while (claim := worker.reserve()) is None:  # until it takes hand-offs
                await asyncio.sleep(0.01)
        invocation = await asyncio.to_thread(registry.invoke, agent, tool["key"], {}, claim=claim)
        worker.adopt(invocation)
        await asyncio.wait_for(pipe.held.wait(), WAIT)  # its read is in, the answer held
        worker.stop()
        # A worker that does not wait is gone long before this; one that waits is not.
        await asyncio.wait({task}, timeout=STOP_GRACE)
        pipe.release()
        await asyncio.wait_for(task, WAIT)
    row = registry.get_invocation(invocation)
    left = (row["status"], row["lease_owner"], row["attempt"])
    assert left == ("running", None, 0), left  # given back: any worker claims it now
    assert worker.reserved == 0


async def test_a_handed_over_call_whose_read_lost_the_database_is_read_again(
    registry: Registry, upstream: Upstream, database_url: str
) -> None:
    """The connection of the worker's read of a handed-over call is cut (a database restart,
    a lost link) before the read arrives: the worker reads it again once it can and sends
    it, instead of leaving it claimed for itself until its lease (300 s here) runs out."""
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/handed")
    async with held_pipe(database_url, b"AND i.attempt = 1", drop=True) as (pipe, piped_url):
        settings = WorkerSettings(lease_seconds=300, poll_interval=300)
        worker = Worker(piped_url, settings, None, LOOPBACK_ONLY)
        task = asyncio.create_task(worker.run())
        try:
            async with asyncio.timeout(WAIT):
                while (claim := worker.reserve()) is None:  # until it takes hand-offs
                    await asyncio.sleep(0.01)
            call = await asyncio.to_thread(registry.invoke, agent, tool["key"], {}, claim=claim)
            worker.adopt(call)
            await asyncio.wait_for(pipe.held.wait(), WAIT)  # that read's connection was cut
            async with asyncio.timeout(WAIT):
                while (await asyncio.to_thread(registry.get_invocation, call))["status"] == (
                    "running"
                ):
                    await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await asyncio.wait_for(task, WAIT)
    row = registry.get_invocation(call)
    assert (row["status"], row["attempt"]) == ("completed", 1)  # this worker's, at once
    assert worker.reserved == 0
