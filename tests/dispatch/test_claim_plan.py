"""The claim walks an owner's runnable calls in order, whatever the statistics say.

A claim visits each owner with calls (migration 0051) and reads each one's oldest runnable
calls through the runnable index, `(owner, run_after) WHERE status = 'running'`. Its generic
plan is made once per worker connection; with one tool in the table, the filter of tools
with no room ("tool_id <> ALL($n)") was estimated to leave no row, and the plan read every
call the owner ever made through its (owner, created_at) index (or every runnable one, by a
bitmap scan of the runnable index) and sorted them: ~10 ms a claim at 20,000 calls (the drain fell from ~1,900 to ~1,400 calls/s). This module has a
database of its own, so that its one tool is the only one the statistics see.
"""

from __future__ import annotations

from tests.dispatch.test_plans import GROWN, LITERALS, RUNS, STATEMENTS, invoke_many, scans
from tests.pgtest import own_database_url, own_db  # noqa: F401 (fixtures)
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.store import DispatchStore, open_pool
from toolrelay.registry import Registry


async def test_the_claim_walks_the_runnable_calls_of_an_owner_with_one_tool(
    registry: Registry, database_url: str
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/x")
    invoke_many(registry, agent, tool["key"], GROWN)
    with registry.db.connect(autocommit=True) as admin:
        admin.execute(
            "UPDATE agents.tool_invocations SET status = 'completed', finished_at = now()"
            " WHERE id IN (SELECT id FROM agents.tool_invocations WHERE owner = %s"
            " ORDER BY run_after LIMIT %s)",
            (registry.owner, GROWN // 2),
        )
        admin.execute("ANALYZE agents.tool_invocations")
    async with open_pool(database_url, max_size=1) as pool:
        store = DispatchStore(pool, "plan-test")
        for _ in range(RUNS):
            await store.claim(1, 30.0)
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT name, parameter_types::text[] AS types FROM pg_prepared_statements"
                " WHERE statement LIKE %s",
                (STATEMENTS["claim"] + "%",),
            )
            prepared = await cur.fetchone()
            assert prepared is not None
            args = ", ".join(LITERALS[t] for t in prepared["types"])
            cur = await conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {prepared['name']}({args})")
            explained = await cur.fetchone()
            assert explained is not None
            reads = scans(next(iter(explained.values()))[0]["Plan"])
    # one ordered walk of the runnable index (an Index Scan stops after the first few); a
    # bitmap scan reads all of them, then sorts
    assert ("Index Scan", "tool_invocations_runnable_owner_idx") in reads, reads
    bitmaps = {index for node, index in reads if node == "Bitmap Index Scan"}
    assert bitmaps <= {"tool_invocations_pkey"}, reads
