"""A query handed to a worker thread against the same query in the event loop (issue 14):
``python -m bench.threadhop`` (a few seconds).

What the doors paid per database trip before ``Database.trip`` (db/aio.py): ``anyio``'s
thread hand-off and a sync pooled connection, against an ``AsyncConnectionPool`` in the loop.
16 concurrent tasks (the agent path's 16 sessions), the one-trip string ``BEGIN; SELECT 1;
COMMIT``, 3 alternating rounds; client CPU is this process's (user + system) per query.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from toolrelay.db import resolve_database_url

QUERY = "BEGIN; SELECT 1; COMMIT"
CALLS = 4000
TASKS = 16


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _measure(one: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Queries per second and client CPU µs per query, TASKS at a time."""

    async def task() -> None:
        for _ in range(CALLS // TASKS):
            await one()

    started, cpu = time.perf_counter(), _cpu()
    async with anyio.create_task_group() as group:
        for _ in range(TASKS):
            group.start_soon(task)
    return CALLS / (time.perf_counter() - started), (_cpu() - cpu) / CALLS * 1e6


async def main() -> None:
    url = resolve_database_url()
    kwargs = {"autocommit": True}
    pool = ConnectionPool(url, min_size=TASKS, max_size=TASKS, kwargs=kwargs, open=True)
    apool = AsyncConnectionPool(url, min_size=TASKS, max_size=TASKS, kwargs=kwargs, open=False)
    await apool.open(wait=True)
    pool.wait()

    def sync_query() -> None:
        with pool.connection() as conn:
            conn.execute(QUERY)

    async def in_thread() -> None:
        await anyio.to_thread.run_sync(sync_query)

    async def in_loop() -> None:
        async with apool.connection() as conn:
            await conn.execute(QUERY)

    print(f"{'round':<6} {'way':<22} {'queries/s':>10} {'client CPU µs/query':>20}")
    try:
        for round_ in range(1, 4):
            for name, one in (("worker thread (sync)", in_thread), ("event loop (async)", in_loop)):
                rate, cpu = await _measure(one)
                print(f"{round_:<6} {name:<22} {rate:>10,.0f} {cpu:>20,.0f}")
    finally:
        pool.close()
        await apool.close()


if __name__ == "__main__":
    asyncio.run(main())
