"""The statements of the agent's round trip and of the worker call no function whose plan
PostgreSQL throws away after each call (migration 0037).

A LANGUAGE sql function that cannot be inlined (it has SET search_path, or is SECURITY
DEFINER) is parsed and planned again each time a new statement calls it: 18% of
PostgreSQL's CPU on the invoke path went there. Such a function shows in the function
statistics (inlined ones do not: they are part of their caller's plan), so the test runs
each path with track_functions on and reads which functions ran.
"""

from __future__ import annotations

import uuid

import psycopg

from tests.pgtest import own_database_url, own_db  # noqa: F401 (fixtures)
from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.dispatch.store import DispatchStore, open_pool
from toolrelay.registry import Registry
from toolrelay.tokens import Authenticator, TokenStore

CALLED = """
SELECT p.oid::regprocedure::text AS function, l.lanname AS language
  FROM pg_stat_user_functions s
  JOIN pg_proc p ON p.oid = s.funcid
  JOIN pg_language l ON l.oid = p.prolang
"""


def flush_stats(db: Database) -> None:
    """The pooled connection's function counts, into the shared statistics: its backend
    writes them once idle, right after this statement."""
    pool = db._get_pool()
    conn = pool.getconn()
    try:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.commit()
    finally:
        pool.putconn(conn)


async def test_the_round_trip_and_the_worker_call_only_plpgsql_or_inlined_functions(
    database_url: str,
) -> None:
    setup = Database(database_url)
    registry = Registry(setup, uuid.uuid4())
    agent, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/x")
    agent_id = str(registry.get_agent(agent)["id"])
    _, token = TokenStore(setup).create(registry.owner, agent_id=uuid.UUID(agent_id))
    setup.close()
    # Only sessions opened from here on count calls: what the setup ran is not counted.
    name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'all'")
        admin.execute("SELECT pg_stat_reset()")
    db = Database(database_url, pool_size=1)  # one connection: the one flushed below
    try:
        registry = Registry(db, registry.owner)
        made = [registry.invoke(agent, tool["key"], {}) for _ in range(2)]  # cold, warm
        as_agent = Registry(db, registry.owner, agent_id=agent_id)
        made += [as_agent.invoke(agent_id, str(tool["id"]), {}) for _ in range(2)]
        called = [as_agent.call(tool["key"], {}) for _ in range(2)]
        assert all(c.invocation_id is not None for c in called)
        assert Authenticator(db).authenticate(token).agent_id == uuid.UUID(agent_id)
        flush_stats(db)

        async with open_pool(database_url, max_size=1) as pool:
            store = DispatchStore(pool, "helpers-test")
            claimed = await store.claim(64, 30.0)
            assert len(claimed) >= len(made)
            await store.finish(
                [{"id": str(row["id"]), "attempt": row["attempt"], "status": "completed",
                  "output": {}, "http_status": 200} for row in claimed],
                [],
            )  # fmt: skip
            async with pool.connection() as aconn:
                await aconn.execute("SELECT pg_stat_force_next_flush()")
                await aconn.commit()

        with psycopg.connect(database_url, autocommit=True) as reader:
            rows = reader.execute(CALLED).fetchall()
    finally:
        db.close()
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" RESET track_functions')
    languages = {function: language for function, language in rows}
    # The counts are there: the paths ran through the functions that decide them.
    assert languages.get("fn_invoke_tool(uuid,uuid,jsonb,uuid)") == "plpgsql"
    assert languages.get("agents.authenticate_token(bytea)") == "plpgsql"
    assert {f: lang for f, lang in languages.items() if lang == "sql"} == {}
