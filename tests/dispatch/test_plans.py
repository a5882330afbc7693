"""The worker's statements reach rows by index, whatever the size of the table they were
first planned on.

psycopg prepares a statement at its fifth run on a connection, and PostgreSQL then keeps one
generic plan for it until the table is next analyzed. A worker that starts on a small queue
table (a new database, or one just purged) had its claim, mark, finish and `serve`'s
hand-off read planned as sequential scans, and kept them while the table grew: in the latency benchmark each finish
took 30-500 ms at 60,000 rows, and the worker fell behind 1,000 calls/s for good.
"""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from tests.pgtest import own_database_url, own_db  # noqa: F401 (fixtures)
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.store import DispatchStore, open_pool
from toolrelay.registry import Registry

GROWN = 3000  # calls added after the plans were made
RUNS = 14  # psycopg prepares after 5 runs; PostgreSQL weighs a generic plan after 5 more
STATEMENTS = {  # how each of the worker's statements starts (db/sql/dispatch.sql)
    "claim": "-- Claim up to",
    "mark_sent": "-- Before a write leaves",
    "finish": "-- Record outcomes",
    "adopt": "WITH claimed AS (-- The calls this process made",  # serve's hand-off
    "heartbeat": "-- Extend the leases of the calls in flight",
}
# A value of each parameter type these statements take: a generic plan does not depend on it.
LITERALS = {
    "smallint": "64", "integer": "64", "bigint": "64", "numeric": "64",
    "double precision": "30", "text": "'plan-test'", "jsonb": "'[]'", "uuid[]": "'{}'",
    "uuid": "'00000000-0000-0000-0000-000000000000'",
}  # fmt: skip


def invoke_many(registry: Registry, agent: str, tool_key: str, n: int) -> list[str]:
    """``n`` calls of the tool, made in one statement as the owner; their ids in order."""
    with registry.db.as_owner(registry.owner) as conn:
        rows = conn.execute(
            "SELECT fn_invoke_tool(a.id, t.id, %s || jsonb_build_object('n', g)) AS id"
            " FROM agents.agents a, agents.tools_registry t, generate_series(1, %s) g"
            " WHERE a.name = %s AND t.key = %s ORDER BY g",
            (Jsonb({}), n, agent, tool_key),
        ).fetchall()
    return [str(row["id"]) for row in rows]


def scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """How a plan (EXPLAIN's JSON) reads the calls table: (node type, index) for each read."""
    found = []
    if plan.get("Relation Name") == "tool_invocations" or "tool_invocations" in plan.get(
        "Index Name", ""
    ):
        found.append((plan["Node Type"], plan.get("Index Name", "")))
    for child in plan.get("Plans", ()):
        found += scans(child)
    return found


def seq_scans(plan: dict[str, Any]) -> list[str]:
    """The relations a plan (EXPLAIN's JSON) reads by sequential scan."""
    found = [plan["Relation Name"]] if plan["Node Type"] == "Seq Scan" else []
    for child in plan.get("Plans", ()):
        found += seq_scans(child)
    return found


async def run_each(
    store: DispatchStore, ids: list[Any], claimed: list[Any], results: list[dict[str, Any]]
) -> None:
    """Each of the worker's statements, RUNS times on the store's connection."""
    for _ in range(RUNS):
        await store.claim(64, 30.0)
        await store.adopt(ids)
        await store.heartbeat(ids, 30.0)
        await store.mark_sent(claimed)
        await store.finish(results, [])


async def test_plans_made_on_a_small_queue_still_use_indexes_once_it_grew(
    registry: Registry, database_url: str
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/x")
    ids = [registry.invoke(agent, tool["key"], {}) for _ in range(3)]
    with registry.db.connect(autocommit=True) as admin:  # nothing re-plans behind the test
        admin.execute("ALTER TABLE agents.tool_invocations SET (autovacuum_enabled = off)")
    async with open_pool(database_url, max_size=1) as pool:  # one connection: its plans
        store = DispatchStore(pool, "plan-test")
        claimed = await store.claim(64, 30.0)
        assert sorted(str(row["id"]) for row in claimed) == sorted(map(str, ids))
        results = [
            {"id": str(row["id"]), "attempt": row["attempt"], "status": "completed",
             "output": {}, "http_status": 200}
            for row in claimed
        ]  # fmt: skip
        await run_each(store, ids, claimed, results)  # as a worker starting on a small queue
        invoke_many(registry, agent, tool["key"], GROWN)
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT name, statement, generic_plans, parameter_types::text[] AS types"
                " FROM pg_prepared_statements"
            )
            prepared = await cur.fetchall()
            plans: dict[str, list[str]] = {}
            for label, head in STATEMENTS.items():
                [row] = [p for p in prepared if p["statement"].startswith(head)]
                assert row["generic_plans"] > 0, f"{label}: not on a generic plan yet"
                args = ", ".join(LITERALS[t] for t in row["types"])
                cur = await conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {row['name']}({args})")
                explained = await cur.fetchone()
                assert explained is not None
                plans[label] = seq_scans(next(iter(explained.values()))[0]["Plan"])
    assert {label: found for label, found in plans.items() if "tool_invocations" in found} == {}


async def test_the_workers_statements_are_not_planned_again_at_each_run(
    registry: Registry, database_url: str
) -> None:
    # PostgreSQL weighs a prepared statement's generic plan against planning anew with each
    # run's values, and for the hand-off's read it chose the latter more than half of the
    # time in the agent-path benchmark: ~0.5 ms of planning a run, more than the run itself.
    agent, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/x")
    ids = [registry.invoke(agent, tool["key"], {}) for _ in range(3)]
    async with open_pool(database_url, max_size=1) as pool:
        store = DispatchStore(pool, "plan-test")
        claimed = await store.claim(64, 30.0)
        results = [
            {"id": str(row["id"]), "attempt": row["attempt"], "status": "running",
             "output": None, "http_status": None, "retry_in_ms": 60_000}
            for row in claimed
        ]  # fmt: skip
        await run_each(store, ids, claimed, results)
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            )
            prepared = await cur.fetchall()
    planned = {}
    for label, head in STATEMENTS.items():
        [row] = [p for p in prepared if p["statement"].startswith(head)]
        planned[label] = (row["generic_plans"], row["custom_plans"])
    assert {label: plans for label, plans in planned.items() if plans[1]} == {}
    assert all(generic >= RUNS - 5 for generic, _ in planned.values()), planned


async def test_the_workers_statements_are_never_compiled(
    registry: Registry, database_url: str
) -> None:
    # The claim's generic plan is costed for many owners with calls (it visits each): past
    # jit_above_cost, PostgreSQL JIT-compiled it at every run, ~60 ms each on this machine
    # for a statement of ~1 ms. Here every statement's estimate passes the threshold (this
    # module's database of its own; a plan is compiled or not as it is made).
    agent, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/x")
    ids = [registry.invoke(agent, tool["key"], {}) for _ in range(3)]
    with registry.db.connect(autocommit=True) as admin:
        row = admin.execute("SELECT current_database() AS name").fetchone()
        assert row is not None
        name = row["name"]
        admin.execute(f'ALTER DATABASE "{name}" SET jit_above_cost = 0')
    try:
        async with open_pool(database_url, max_size=1) as pool:
            store = DispatchStore(pool, "plan-test")
            for _ in range(RUNS):
                await store.claim(64, 30.0)
                await store.adopt(ids)
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT name, statement, parameter_types::text[] AS types"
                    " FROM pg_prepared_statements"
                )
                compiled = {}
                for statement in await cur.fetchall():
                    args = ", ".join(LITERALS[t] for t in statement["types"])
                    cur = await conn.execute(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {statement['name']}({args})"
                    )
                    explained = await cur.fetchone()
                    assert explained is not None
                    plan = next(iter(explained.values()))[0]
                    compiled[statement["statement"][:40]] = "JIT" in plan
    finally:
        with registry.db.connect(autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" RESET jit_above_cost')
    assert len(compiled) == 2 and not any(compiled.values()), compiled
