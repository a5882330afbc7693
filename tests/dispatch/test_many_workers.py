"""Several worker processes on one database: every invocation terminal, each sent once."""

from __future__ import annotations

import asyncio
import os
import sys

from psycopg.types.json import Jsonb

from tests.dispatch.upstream import Upstream
from tests.pgtest import own_database_url, own_db  # noqa: F401 (fixtures)
from tests.registry.helpers import agent_with_tool
from toolrelay.registry import Registry

# A database of its own (own_database_url, imported above): the workers drain everything
# runnable, and other tests leave calls behind (to hosts that never answer, with retries)
# that took them 60 s instead of 6.
INVOCATIONS = 2000
WORKERS = 3
RUN_TIMEOUT = 180.0  # seconds


def invoke_many(registry: Registry, agent: str, tool_key: str, count: int) -> None:
    with registry.db.as_owner(registry.owner) as conn:
        ids = conn.execute(
            "SELECT a.id AS agent_id, t.id AS tool_id FROM agents.agents a, agents.tools_registry t"
            " WHERE a.name = %s AND t.key = %s",
            (agent, tool_key),
        ).fetchone()
        assert ids is not None
        conn.execute(
            "SELECT fn_invoke_tool(%s, %s, %s || jsonb_build_object('n', g))"
            " FROM generate_series(1, %s) g",
            (ids["agent_id"], ids["tool_id"], Jsonb({}), count),
        )


async def run_workers(database_url: str, count: int) -> list[int]:
    env = os.environ | {
        "DATABASE_URL": database_url,
        "TOOLRELAY_EGRESS_ALLOW": "127.0.0.1",
        "TOOLRELAY_MASTER_KEY": "",
    }
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolrelay.cli",
            "worker",
            "--drain",
            "--concurrency",
            "32",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    return list(await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), RUN_TIMEOUT))


async def test_three_workers_send_each_of_2000_writes_exactly_once(
    registry: Registry, upstream: Upstream, database_url: str
) -> None:
    agent, tool = agent_with_tool(
        registry,
        endpoint_url=f"{upstream.base_url}/items",
        http_method="POST",
        egress_class="read_only",
    )
    invoke_many(registry, agent, tool["key"], INVOCATIONS)
    assert await run_workers(database_url, WORKERS) == [0] * WORKERS
    with registry.db.as_owner(registry.owner) as conn:
        rows = conn.execute(
            "SELECT status, count(*) AS n FROM agents.tool_invocations GROUP BY status"
        ).fetchall()
        workers = conn.execute(
            "SELECT count(DISTINCT worker) AS n FROM agents.tool_invocation_attempts"
        ).fetchone()
    assert {r["status"]: r["n"] for r in rows} == {"completed": INVOCATIONS}
    assert len(upstream.by_invocation) == INVOCATIONS
    assert set(upstream.by_invocation.values()) == {1}
    assert workers is not None and workers["n"] >= 2  # the work really was shared
