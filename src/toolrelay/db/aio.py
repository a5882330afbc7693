"""One-round-trip transactions from the event loop (issue 14): the strings ``Trips`` sends,
on an ``AsyncConnectionPool``, so a door's hot path needs no worker thread.

Handing a query to a worker thread and back cost ~390 µs of client CPU per query at 16
concurrent requests here, the same query in the event loop ~100 µs (bench/RESULTS.md,
"The token check in the event loop"). Each event loop gets its own pool: a pool's
connections and tasks belong to the loop that opened it (tests run one app after another,
each on a loop of its own); ``Database.aclose`` closes the running loop's.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from toolrelay.db.connect import Identity, Query, Row, quiet, trip_string

__all__ = ["AsyncTrips"]

Pool = AsyncConnectionPool[psycopg.AsyncConnection[Row]]


class AsyncTrips:
    """A pool per event loop, and transactions of one round trip each on it."""

    def __init__(self, url: str, size: int, timeout: float, max_idle: float) -> None:
        self._url, self._size, self._timeout, self._max_idle = url, size, timeout, max_idle
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool] = (
            weakref.WeakKeyDictionary()
        )

    async def run(
        self, identity: Identity, queries: Sequence[Query], *, retry: bool = True
    ) -> list[list[Row]]:
        """The rows of each query, in order, in one transaction as ``identity``: as
        ``Trips.run`` (a connection the server closed while idle is replaced before
        sending; one failing its trip is tried once more on a fresh one when ``retry``)."""
        pool = await self._pool()
        for attempt in range(2):
            conn = await self._checkout(pool)
            try:
                return await _one_trip(conn, identity, queries)
            except psycopg.OperationalError:
                if attempt or not retry or not conn.closed:
                    raise
            finally:
                await pool.putconn(conn)  # a closed one is discarded, not reused
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Close the running loop's pool (the others went with their loops)."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    async def _pool(self) -> Pool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = AsyncConnectionPool(
                self._url,
                min_size=0,
                max_size=self._size,
                max_idle=self._max_idle,
                timeout=self._timeout,
                # The string holds its own BEGIN and COMMIT.
                kwargs={"row_factory": dict_row, "prepare_threshold": None, "autocommit": True},
                open=False,
                name="toolrelay-async",
            )
            self._pools[loop] = pool
            await pool.open()
        return pool

    async def _checkout(self, pool: Pool) -> psycopg.AsyncConnection[Row]:
        while True:
            try:
                conn = await pool.getconn()
            except PoolTimeout:
                # The database is gone: a fresh pool connects on the next request rather
                # than this one answering late, after the pool's growing backoff.
                self._pools.pop(asyncio.get_running_loop(), None)
                await pool.close()
                raise
            if quiet(conn):
                return conn
            await conn.close()  # closed by the server while idle (a restart): another
            await pool.putconn(conn)


async def _one_trip(
    conn: psycopg.AsyncConnection[Row], identity: Identity, queries: Sequence[Query]
) -> list[list[Row]]:
    cur = psycopg.AsyncClientCursor(conn, row_factory=dict_row)
    try:
        await cur.execute(trip_string(cur, identity, queries))
    except psycopg.Error:
        if conn.info.transaction_status == TransactionStatus.INERROR:
            await conn.execute("ROLLBACK")
        raise
    results: list[list[Row]] = []
    while True:
        if cur.description is not None:  # BEGIN, SET and COMMIT return no rows
            results.append(await cur.fetchall())
        if not cur.nextset():
            break
    return results
