"""A worker stops even when a cancellation is lost.

On Python 3.11, a task cancelled in the same step as psycopg_pool hands it the connection it
was waiting for carries on with the connection (the pool waits with ``asyncio.wait_for``,
which then returns the result instead of raising). The worker stopped its background loops
by cancelling them and waiting: a loop that lost its cancellation went on forever, and the
worker never stopped (seen in the test suite: a run hung in Worker._shutdown, its
registration loop renewing every lease/3). Its loops now also end on the worker's own flags.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.dispatch.conftest import LOOPBACK_ONLY
from toolrelay.dispatch.store import DispatchStore, open_pool
from toolrelay.dispatch.worker import Worker, WorkerSettings

WITHIN = 10.0  # seconds; the loop renews every 0.1 s, so a hang fails here instead


async def until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.005)


async def test_the_pool_race_loses_a_cancellation(database_url: str) -> None:
    """The premise, shown on the pool alone: if this starts failing, the library or Python
    no longer loses the cancellation (the worker's flags stay harmless)."""
    pool = open_pool(database_url, max_size=1)
    await pool.open(wait=True)
    try:
        held = await pool.getconn()

        async def wants_one() -> str:
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
            return "carried on"

        task = asyncio.create_task(wants_one())
        await until(lambda: pool.get_stats().get("requests_waiting", 0) == 1)
        await pool.putconn(held)  # handed to the waiting task...
        task.cancel()  # ...and cancelled in the same step
        assert await task == "carried on"
    finally:
        await pool.close()


async def test_shutdown_ends_a_registration_loop_that_lost_its_cancellation(
    database_url: str,
) -> None:
    settings = WorkerSettings(concurrency=1, lease_seconds=0.3, poll_interval=30.0)
    worker = Worker(database_url, settings, None, LOOPBACK_ONLY)
    pool = open_pool(database_url, max_size=1)
    await pool.open(wait=True)
    worker.store = DispatchStore(pool, settings.worker_id)
    worker.listening = True  # as the listener says once LISTEN is on
    worker._registering = asyncio.create_task(worker._registration())
    try:
        await asyncio.wait_for(until(lambda: worker.registered), WITHIN)
        held = await pool.getconn()  # the loop's next renewal waits for the connection
        await until(lambda: pool.get_stats().get("requests_waiting", 0) == 1)
        worker.stopping.set()  # as Worker.stop does
        await pool.putconn(held)  # handed to the renewal as shutdown cancels it
        await asyncio.wait_for(worker._shutdown(), WITHIN)
        assert worker._registering.done()
        assert not worker.registered
    finally:
        if not worker._registering.done():
            worker.listening = False
            worker.stopping.set()
        await pool.close()
