"""The heartbeat never waits for a row another transaction holds.

It used to: extending the leases of every call in flight in one UPDATE, it locked them in
its own order while the same worker's finish of a batch locked some of the same rows in
another. Each waited for the other; PostgreSQL aborted one, and when that was the finish,
its results were lost and its calls ran again once their leases ran out (found with two
serve processes at 16 sessions: bench/agent_ab.py, 2026-12-03). A heartbeat that skips
locked rows cannot be part of such a cycle: here a row is held by another transaction, and
the heartbeat must answer at once for the others.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import psycopg

from tests.pgtest import own_database_url, own_db  # noqa: F401 (fixtures)
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.store import DispatchStore, open_pool
from toolrelay.registry import Registry

WORKER = "heartbeat-test"
BOUND_S = 10.0  # far above an answer; the old heartbeat waited for as long as the lock


def _leases(url: str, ids: list[UUID]) -> dict[UUID, float]:
    """Seconds left on each lease."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, extract(epoch FROM lease_expires_at - now())::float"
            " FROM agents.tool_invocations WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
    return {row[0]: row[1] for row in rows}


async def test_a_row_held_elsewhere_does_not_hold_the_heartbeat(
    registry: Registry, database_url: str
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/x")
    ids = [registry.invoke(agent, tool["key"], {}) for _ in range(3)]
    async with open_pool(database_url, max_size=2) as pool:
        store = DispatchStore(pool, WORKER)
        claimed = await store.claim(64, 20.0)
        assert sorted(row["id"] for row in claimed) == sorted(ids)
        held, others = ids[0], ids[1:]
        async with await psycopg.AsyncConnection.connect(database_url) as holder:
            await holder.execute(  # as a finish in flight holds its rows until it commits
                "SELECT 1 FROM agents.tool_invocations WHERE id = %s FOR UPDATE", (held,)
            )
            extended = await asyncio.wait_for(store.heartbeat(ids, 600.0), BOUND_S)
            assert extended == set(others)  # the held row is left for the next beat
            await holder.rollback()
        leases = await asyncio.to_thread(_leases, database_url, ids)
        assert all(leases[i] > 500 for i in others), leases
        assert leases[held] < 30, leases  # not extended while held
        assert await asyncio.wait_for(store.heartbeat(ids, 600.0), BOUND_S) == set(ids)
