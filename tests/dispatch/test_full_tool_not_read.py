"""A claim reads none of the calls queued for a tool with no room.

A claim passes over a tool at its ``max_concurrency`` in this worker (tests/dispatch/
test_tool_room.py). It did so one row at a time: an owner's 100,000 calls queued for a tool
limited to 1 made every claim of every worker read all of them, whoever's calls it was
taking (91-106 ms a claim of 64 against 6-7 ms: bench/RESULTS.md), and an owner who set
the limit to protect its upstream made the dispatcher slow for every tenant. Now an owner
with calls waiting for a full tool has its calls read tool by tool (migration 0052), the
full tool passed over with one probe.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncConnection

from tests.dispatch.test_owner_fairness import forget
from tests.dispatch.test_plans import STATEMENTS, invoke_many
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay.dispatch.store import Busy, DispatchStore, open_pool
from toolrelay.registry import Registry

FLOOD = 2000


def limited_tool(registry: Registry, upstream: Upstream, key: str) -> dict[str, Any]:
    """A tool of agent "bot" limited to one call at a time."""
    tool = add_tool(registry, key=key, endpoint_url=f"{upstream.base_url}/{key}")
    registry.update_tool(key, {"max_concurrency": 1})
    registry.assign("bot", key)
    return tool


def with_room_for_none(tool: dict[str, Any]) -> Busy:
    """A worker's ``busy`` holding the tool's one call: the tool is full."""
    return ({UUID(str(tool["id"])): 1}, [UUID(str(tool["id"]))], {})


async def index_fetches(conn: AsyncConnection[Any]) -> int:
    """Rows of the calls table this connection has fetched through an index, as far as its
    statistics not yet reported say (they are kept across transactions until reported)."""
    cur = await conn.execute(
        "SELECT idx_tup_fetch FROM pg_stat_xact_user_tables"
        " WHERE relid = 'agents.tool_invocations'::regclass"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row["idx_tup_fetch"])


async def claim_and_reads(
    database_url: str, limit: int, busy: Busy | None, runs: int = 1, after: str | None = None
) -> tuple[list[str], int]:
    """A claim, its calls put back before the transaction commits, ``runs`` times on one
    connection (``after``: where the walk of owners starts): the ids the last took, and the
    most rows of the calls table any run fetched through an index. Not rolled back: psycopg
    forgets its prepared statements at a rollback, and from the sixth run on one connection
    the claim runs on a worker's generic plan."""
    fetched = 0
    async with open_pool(database_url, max_size=1) as pool:
        store = DispatchStore(pool, "full-tool-test")
        if after is not None:
            store.after = UUID(after)
        for _ in range(runs):
            async with pool.connection() as conn, conn.transaction():
                before = await index_fetches(conn)
                cur = await conn.execute(store.q["claim"], store._claiming(limit, 5.0, busy))
                taken = [str(row["id"]) for row in await cur.fetchall()]
                fetched = max(fetched, await index_fetches(conn) - before)
                await conn.execute(
                    "UPDATE agents.tool_invocations SET attempt = attempt - 1,"
                    " lease_owner = NULL, lease_expires_at = NULL WHERE id = ANY(%s::uuid[])",
                    (taken,),
                )
        if runs > 5:
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT generic_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                    (STATEMENTS["claim"] + "%",),
                )
                plans = await cur.fetchone()
            assert plans is not None and plans["generic_plans"] > 0, plans
    return taken, fetched


async def test_a_claim_reads_none_of_a_full_tools_queued_calls(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    flooding, other = make_registry(), make_registry()
    agent_with_tool(flooding, key="t", endpoint_url=f"{upstream.base_url}/t")
    full = limited_tool(flooding, upstream, "one")
    invoke_many(flooding, "bot", "one", FLOOD)
    [behind] = invoke_many(flooding, "bot", "t", 1)  # made after the whole flood
    agent_with_tool(other, key="t", endpoint_url=f"{upstream.base_url}/t")
    others = invoke_many(other, "bot", "t", 3)
    try:
        taken, fetched = await claim_and_reads(database_url, 8, with_room_for_none(full), 12)
        assert sorted(taken) == sorted([behind, *others])
        # the owner's probe and its first look read all 2,000 of the full tool's calls
        # (4,000 and more fetched) before they were read tool by tool
        assert fetched < 100, fetched
    finally:
        forget(database_url, {str(flooding.owner): [], str(other.owner): []})


async def test_a_full_tools_owner_has_its_other_tools_calls_in_equal_parts(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    """Read tool by tool, an owner's share of a claim is split between its tools with calls
    to take now: 4 slots, tools g (made first) and h with 3 calls each, 2 of each."""
    registry = make_registry()
    agent_with_tool(registry, key="g", endpoint_url=f"{upstream.base_url}/g")
    full = limited_tool(registry, upstream, "one")
    add_tool(registry, key="h", endpoint_url=f"{upstream.base_url}/h")
    registry.assign("bot", "h")
    invoke_many(registry, "bot", "one", 50)
    g, h = invoke_many(registry, "bot", "g", 3), invoke_many(registry, "bot", "h", 3)
    try:
        taken, _ = await claim_and_reads(database_url, 4, with_room_for_none(full))
        assert Counter("g" if call in g else "h" if call in h else "?" for call in taken) == {
            "g": 2, "h": 2}  # fmt: skip
        assert taken and set(taken) <= {*g[:2], *h[:2]}  # each tool's oldest
    finally:
        forget(database_url, {str(registry.owner): []})


async def test_owners_with_only_a_full_tools_calls_do_not_hide_one_that_has_others(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    """Owners whose due calls are all of a full tool are passed over, not counted: five of
    them and one owner with a call to take, a claim of 2 takes that call from wherever the
    worker's walk starts."""
    clogged, fulls = [], []
    for _ in range(5):
        registry = make_registry()
        registry.create_agent("bot")
        fulls.append(UUID(str(limited_tool(registry, upstream, "one")["id"])))
        invoke_many(registry, "bot", "one", 20)
        clogged.append(str(registry.owner))
    ready = make_registry()
    agent_with_tool(ready, key="t", endpoint_url=f"{upstream.base_url}/t")
    [call] = invoke_many(ready, "bot", "t", 1)
    busy: Busy = ({tool: 1 for tool in fulls}, fulls, {})
    try:
        for start in [*sorted(clogged), str(ready.owner), str(uuid4())]:
            taken, _ = await claim_and_reads(database_url, 2, busy, after=start)
            assert taken == [call], start
    finally:
        forget(database_url, {owner: [] for owner in [*clogged, str(ready.owner)]})


async def test_a_full_tools_calls_are_taken_again_once_it_has_room(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    registry = make_registry()
    registry.create_agent("bot")
    full = limited_tool(registry, upstream, "one")
    first, *_ = invoke_many(registry, "bot", "one", 5)
    try:
        taken, _ = await claim_and_reads(database_url, 4, with_room_for_none(full))
        assert taken == []
        taken, _ = await claim_and_reads(database_url, 4, None)
        assert taken == [first]  # its room: one
    finally:
        forget(database_url, {str(registry.owner): []})
