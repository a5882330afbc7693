"""Retention and the claim's hot path: finished history stays out of the claim's way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay import errors
from toolrelay.db import Database
from toolrelay.db.queries import load
from toolrelay.dispatch.retention import prune, retention_interval
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
    assert prune(db, "30d").count == 3
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


# A tired operator's retention: PostgreSQL reads '90' as 90 seconds, '6m' as six minutes and
# '-30d' or '3 days ago' as a moment in the future, so each deleted (nearly) every tenant's
# finished history. Each is refused now, saying why, and deletes nothing.
REFUSED = {
    "90": "has no unit",
    "6m": "ambiguous",
    "6 M": "ambiguous",
    "-30d": "a positive duration",
    "3 days ago": "'ago'",
    "0d": "longer than zero",
    "0 days 0 hours": "longer than zero",
    "1.5": "has no unit",
    "30 dayz": "'dayz'",
    "P30D": "a positive duration",
    "": "a positive duration",
    "1e9 days": "'e' is not a unit",
    "99999999999 years": "too long",
}


@pytest.mark.parametrize("text", list(REFUSED))
async def test_prune_refuses_a_duration_it_would_misread_and_deletes_nothing(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database, text: str
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/p")
    made = registry.invoke(agent, tool["key"], {})
    await drain()
    with db.connect(autocommit=True) as conn:  # finished a minute ago: any misreading takes it
        conn.execute(
            "UPDATE agents.tool_invocations SET finished_at = now() - interval '1 minute'"
            " WHERE id = %s",
            (made,),
        )
    with pytest.raises(errors.InvalidArgument, match=REFUSED[text]) as refused:
        prune(db, text)
    assert "--older-than" in str(refused.value)
    assert made in {r["id"] for r in registry.list_invocations()}


@pytest.mark.parametrize(
    ("text", "interval"),
    [("30d", "30 days"), ("12h", "12 hours"), ("2 weeks", "2 weeks"), ("90 days", "90 days"),
     ("45min", "45 minutes"), ("6mon", "6 months"), ("1 year 6 months", "1 years 6 months"),
     ("1y", "1 years"), ("36 hrs", "36 hours"), ("2W", "2 weeks"), ("10s", "10 seconds"),
     ("1.5d", "1.5 days")],
)  # fmt: skip
def test_durations_people_write_are_read_as_they_mean(text: str, interval: str) -> None:
    assert retention_interval(text) == interval


def test_prune_dry_run_counts_and_deletes_nothing(registry: Registry, db: Database) -> None:
    agent, tool = agent_with_tool(registry)
    made = registry.invoke(agent, tool["key"], {})
    with db.connect(autocommit=True) as conn:
        conn.execute(
            "UPDATE agents.tool_invocations SET status = 'failed', error_code = 'http_error',"
            " finished_at = now() - interval '40 days' WHERE id = %s",
            (made,),
        )
    pruned = prune(db, "30d", dry_run=True)
    assert pruned.count >= 1 and pruned.dry_run
    assert made in {r["id"] for r in registry.list_invocations()}
    assert prune(db, "30d").count == pruned.count
    assert made not in {r["id"] for r in registry.list_invocations()}


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
            {
                "limit": 64,
                "worker": "explain",
                "lease": 30,
                "busy": "{}",
                "full": "[]",
                "owners": "{}",
                "after": "00000000-0000-0000-0000-000000000000",
            },
        ).fetchall()
    text = "\n".join(str(next(iter(r.values()))) for r in plan)
    assert "tool_invocations_runnable_owner_idx" in text
    assert "Seq Scan on tool_invocations" not in text
