"""Database.trip: the one-round-trip transactions the doors run in the event loop."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from toolrelay.db import Database
from toolrelay.db.connect import DISPATCHER, owner_identity


def test_a_trip_is_one_transaction_as_its_identity(database_url: str) -> None:
    db = Database(database_url)
    identity = owner_identity("00000000-0000-0000-0000-000000000001")

    async def go() -> list[list[dict[str, object]]]:
        try:
            return await db.trip(
                identity,
                [("SELECT current_user AS who, auth.uid()::text AS uid", {}),
                 ("SELECT %(n)s::int + 1 AS n", {"n": 41})],
            )  # fmt: skip
        finally:
            await db.aclose()

    [[first], [second]] = asyncio.run(go())
    assert first == {"who": "authenticated", "uid": "00000000-0000-0000-0000-000000000001"}
    assert second == {"n": 42}


def test_a_failing_trip_leaves_nothing_and_the_connection_serves_the_next(
    database_url: str,
) -> None:
    db = Database(database_url, pool_size=1)  # the next trip gets the same connection
    with db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.aio_probe (n int)")
        conn.execute("GRANT INSERT, SELECT ON public.aio_probe TO service_role")
        conn.execute("TRUNCATE public.aio_probe")

    async def go() -> list[list[dict[str, object]]]:
        try:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await db.trip(
                    DISPATCHER,
                    [("INSERT INTO public.aio_probe VALUES (1)", {}), ("SELECT 1 / 0", {})],
                )
            return await db.trip(DISPATCHER, [("SELECT count(*) AS n FROM public.aio_probe", {})])
        finally:
            await db.aclose()

    try:
        assert asyncio.run(go()) == [[{"n": 0}]]
    finally:
        with db.connect(autocommit=True) as conn:
            conn.execute("DROP TABLE public.aio_probe")


def test_a_connection_the_server_closed_is_replaced_before_sending(database_url: str) -> None:
    db = Database(database_url, pool_size=1)
    pid: tuple[str, dict[str, object]] = ("SELECT pg_backend_pid() AS pid", {})

    async def go() -> tuple[int, int]:
        try:
            [[before]] = await db.trip(DISPATCHER, [pid])
            with db.connect(autocommit=True) as admin:  # a restart, as the pool sees it
                admin.execute("SELECT pg_terminate_backend(%s)", (before["pid"],))
                while admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (before["pid"],)
                ).fetchone():
                    await asyncio.sleep(0.01)  # poll: the backend's exit is asynchronous
            [[after]] = await db.trip(DISPATCHER, [pid], retry=False)  # not even a retry
            return before["pid"], after["pid"]
        finally:
            await db.aclose()

    before, after = asyncio.run(go())
    assert before != after


def test_each_event_loop_gets_its_own_pool(database_url: str) -> None:
    db = Database(database_url)  # one Database, used by two loops one after the other

    async def go() -> int:
        [[row]] = await db.trip(DISPATCHER, [("SELECT 7 AS n", {})])
        return int(row["n"])

    assert asyncio.run(go()) == 7  # this loop's pool is left unclosed, as a test might
    assert asyncio.run(go()) == 7
