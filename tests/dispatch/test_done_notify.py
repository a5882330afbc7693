"""The `finish` query tells waiters of outcomes: NOTIFY toolrelay_done, in its transaction,
payloads within PostgreSQL's 8,000 bytes, terminal outcomes only (a retry is not one)."""

from __future__ import annotations

import psycopg

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.outcomes import DONE_CHANNEL
from toolrelay.dispatch.store import DispatchStore, open_pool
from toolrelay.registry import Registry

CALLS = 450  # more than two payloads' worth of ids
RETRIED = 10
NOTIFY_LIMIT = 8000  # bytes: PostgreSQL's payload limit


async def test_one_batch_of_outcomes_is_told_in_payloads_under_the_limit(
    registry: Registry, upstream: Upstream, database_url: str
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/x")
    ids = {str(registry.invoke(agent, tool["key"], {})) for _ in range(CALLS)}
    async with (
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as listener,
        open_pool(database_url) as pool,
    ):
        await listener.execute(f"LISTEN {DONE_CHANNEL}")
        store = DispatchStore(pool, "test-worker")
        claimed = await store.claim(CALLS + 100, 30.0)
        mine = [row for row in claimed if str(row["id"]) in ids]
        await store.release([row["id"] for row in claimed if str(row["id"]) not in ids])
        assert len(mine) == CALLS
        results = [
            {"id": str(row["id"]), "attempt": row["attempt"], "output": {},
             "status": "running" if n < RETRIED else "completed", "retry_in_ms": 60_000.0}
            for n, row in enumerate(mine)
        ]  # fmt: skip
        written = await store.finish(results, [])
        assert {str(i) for i in written} == ids
        payloads = [note.payload async for note in listener.notifies(timeout=2.0)]
    told = [i for payload in payloads for i in payload.split(",")]
    assert sorted(told) == sorted(r["id"] for r in results[RETRIED:])  # each once, no retry
    assert len(payloads) == -(-(CALLS - RETRIED) // 200)
    assert all(len(payload.encode()) < NOTIFY_LIMIT for payload in payloads)
