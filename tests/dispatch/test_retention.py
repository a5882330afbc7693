"""Retention and the claim's hot path: finished history stays out of the claim's way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay import errors
from toolrelay.db import Database
from toolrelay.db.queries import load
from toolrelay.dispatch.retention import prune
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]
FINISHED_ROWS = 20_000


async def test_prune_deletes_old_finished_invocations_only(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/p")
    old = [registry.invoke(agent, tool["key"], {}) for _ in range(3)]
    await drain()
    fresh = registry.invoke(agent, tool["key"], {})  # running: never pruned
    with db.connect(autocommit=True) as conn:
        conn.execute(
            "UPDATE agents.tool_invocations SET finished_at = now() - interval '40 days'"
            " WHERE id = ANY(%s)",
            (old,),
        )
    assert prune(db, "30d") == 3
    remaining = {r["id"] for r in registry.list_invocations()}
    assert remaining == {fresh}
    with db.connect() as conn:
        left = conn.execute(
            "SELECT count(*) AS n FROM agents.tool_invocation_attempts WHERE invocation_id = ANY(%s)",
            (old,),
        ).fetchone()
    assert left is not None and left["n"] == 0


def test_prune_rejects_a_bad_duration(db: Database) -> None:
    with pytest.raises(errors.InvalidArgument, match="--older-than"):
        prune(db, "forever")


def test_claim_scans_only_the_runnable_index(registry: Registry, db: Database) -> None:
    agent, tool = agent_with_tool(registry)
    agent_id = registry.get_agent(agent)["id"]
    with db.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agents.tool_invocations (owner, tool_id, agent_id, status,"
            " approval_status, finished_at) SELECT %s, %s, %s, 'completed', 'not_required', now()"
            " FROM generate_series(1, %s)",
            (registry.owner, tool["id"], agent_id, FINISHED_ROWS),
        )
        conn.execute("ANALYZE agents.tool_invocations")
        claim = load("dispatch")["claim"]
        plan = conn.execute(
            "EXPLAIN " + claim,
            {"limit": 64, "worker": "explain", "lease": 30, "busy": "{}", "full": []},
        ).fetchall()
    text = "\n".join(str(next(iter(r.values()))) for r in plan)
    assert "tool_invocations_runnable_idx" in text
    assert "Seq Scan on tool_invocations" not in text
