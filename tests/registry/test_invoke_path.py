"""The agent's path in round trips (Registry.invoke and .call, get_invocation, a token's
lookup), every refusal as clear as before, and a failed trip leaving nothing behind."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay import errors
from toolrelay.db import Database
from toolrelay.db.connect import owner_identity
from toolrelay.registry import Registry
from toolrelay.tokens import TokenStore

# The lookup (agents.invoke_lookup), then fn_invoke_tool, each a whole transaction sent as
# one string (Database.trips); one (agents.invoke_seen) once the process has read the tool.
# Before: six, one per statement; then four, pipelined.
COLD_ROUND_TRIPS, WARM_ROUND_TRIPS = 2, 1


def round_trips(db: Database, call: object) -> int:
    """Messages that make the server answer (Sync, or a simple Query), per libpq's trace."""
    pool = db._get_pool()
    conn = pool.getconn()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace"
        with path.open("w") as fh:
            conn.pgconn.trace(fh.fileno())
            pool.putconn(conn)
            assert callable(call)
            call()
            conn.pgconn.untrace()
        lines = path.read_text().splitlines()
    return sum(1 for line in lines if line.split("\t")[1:2] == ["F"] and _waits(line))


def _waits(line: str) -> bool:
    kind = line.split("\t")[3] if len(line.split("\t")) > 3 else ""
    return kind in ("Sync", "Query")


def test_invoke_takes_one_round_trip_once_the_tool_was_read(database_url: str) -> None:
    db = Database(database_url, pool_size=1)  # one connection: the one traced
    try:
        registry = Registry(db, uuid.uuid4())
        agent, tool = agent_with_tool(registry)
        registry.get_agent(agent)  # a warm connection
        cold = round_trips(db, lambda: registry.invoke(agent, tool["key"], {"text": "cold"}))
        assert cold == COLD_ROUND_TRIPS
        trips = round_trips(db, lambda: registry.invoke(agent, tool["key"], {"text": "x"}))
        assert trips == WARM_ROUND_TRIPS
        agent_id = str(registry.get_agent(agent)["id"])
        as_agent = Registry(db, registry.owner, agent_id=agent_id)
        by_ids = round_trips(db, lambda: as_agent.invoke(agent_id, str(tool["id"]), {}))
        assert by_ids == COLD_ROUND_TRIPS  # another caller, another name: read first
        assert round_trips(db, lambda: as_agent.invoke(agent_id, str(tool["id"]), {})) == 1
        # The MCP door: the tool by key with its stamp, then the insert; then one.
        called = []
        assert round_trips(db, lambda: called.append(as_agent.call(tool["key"], {}))) == 2
        assert round_trips(db, lambda: called.append(as_agent.call(tool["key"], {}))) == 1
        assert called[0].stamp == called[1].stamp and called[1].tool == called[0].tool
        # Reading it back, as the waiting agent does: one.
        ident = called[1].invocation_id
        assert round_trips(db, lambda: as_agent.get_invocation(ident, agent=agent_id)) == 1
        assert round_trips(db, lambda: registry.get_invocation(ident)) == 1  # with attempts
        # And the token behind every request: one.
        owner_token = TokenStore(db).create(registry.owner, None, name="t")[1]
        assert round_trips(db, lambda: TokenStore(db).lookup(owner_token)) == 1
    finally:
        db.close()


def test_call_finds_only_what_the_agent_may_call(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry)
    denied = add_tool(registry, key="echo.denied")
    registry.assign(agent, denied["key"], allowed=False)
    unassigned = add_tool(registry, key="echo.unassigned")
    agent_id = registry.get_agent(agent)["id"]
    as_agent = Registry(registry.db, registry.owner, agent_id=agent_id)
    made = as_agent.call(tool["key"], {"text": "hi"})
    assert made.tool is not None and made.tool["tool_key"] == tool["key"]
    assert made.invocation_id is not None
    for key in (denied["key"], unassigned["key"], "no.such.tool"):
        refused = as_agent.call(key, {})
        assert (refused.tool, refused.invocation_id) == (None, None)
        assert refused.stamp == made.stamp  # the same tools, the same stamp
    registry.set_tool_status(tool["key"], "disabled")
    gone = as_agent.call(tool["key"], {"text": "hi"})
    assert gone.tool is None and gone.stamp != made.stamp
    registry.set_tool_status(tool["key"], "active")
    with pytest.raises(errors.InvalidInput):
        as_agent.call(tool["key"], {"text": 5})
    assert len(registry.list_invocations()) == 1  # nothing else was recorded


def test_a_failed_trip_rolls_back_and_the_connection_is_reused(database_url: str) -> None:
    db = Database(database_url, pool_size=1)
    try:
        registry = Registry(db, uuid.uuid4())
        agent, tool = agent_with_tool(registry)
        agent_id = registry.get_agent(agent)["id"]
        identity = owner_identity(registry.owner, agent_id)
        insert = (
            "SELECT fn_invoke_tool(%(agent)s, %(tool)s, '{}'::jsonb, NULL) AS id",
            {"agent": agent_id, "tool": tool["id"]},
        )
        with db.trips() as trips, pytest.raises(psycopg.errors.DivisionByZero):
            trips.run(identity, [insert, ("SELECT 1 / %(zero)s", {"zero": 0})])
        assert registry.list_invocations() == []  # the insert before the failure is gone
        # The one pooled connection is idle again, not stuck in a failed transaction.
        as_agent = Registry(db, registry.owner, agent_id=agent_id)
        assert as_agent.call(tool["key"], {"text": "after"}).invocation_id is not None
        assert len(registry.list_invocations()) == 1
    finally:
        db.close()


def test_a_trips_identity_ends_with_it(database_url: str) -> None:
    """The identity is set for the trip's transaction alone (SET LOCAL): the pooled
    connection is its login role again after a trip, and after a failed one."""
    db = Database(database_url, pool_size=1)
    try:
        identity = owner_identity(uuid.uuid4(), uuid.uuid4())
        during = "SELECT current_user AS who, current_setting('request.jwt.claims') AS claims"
        with db.trips() as trips:
            [[row]] = trips.run(identity, [(during, {})])
        assert (row["who"], row["claims"]) == (identity[0], identity[2])
        with db.trips() as trips, pytest.raises(psycopg.errors.DivisionByZero):
            trips.run(identity, [("SELECT 1 / %(zero)s", {"zero": 0})])
        pool = db._get_pool()
        conn = pool.getconn()
        try:
            after = conn.execute(
                "SELECT current_user = session_user AS plain,"
                " current_setting('request.jwt.claims', true) AS claims,"
                " current_setting('request.jwt.claim.sub', true) AS sub"
            ).fetchone()
            conn.rollback()
        finally:
            pool.putconn(conn)
        assert after == {"plain": True, "claims": "", "sub": ""}
    finally:
        db.close()


def test_refusals_name_what_was_not_found(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry)
    with pytest.raises(errors.NotFound, match="^agent nobody not found$"):
        registry.invoke("nobody", tool["key"], {})
    missing = str(uuid.uuid4())
    with pytest.raises(errors.NotFound, match=f"^agent {missing} not found$"):
        registry.invoke(missing, "no.such.tool", {})  # the agent is reported first
    with pytest.raises(errors.NotFound, match=f"^tool {missing} not found$"):
        registry.invoke(agent, missing, {})
    agent_id = str(registry.get_agent(agent)["id"])
    assert registry.invoke(agent_id, str(tool["id"]), {})  # by ids as well as by names
    assert len(registry.list_invocations()) == 1


def test_an_agent_identity_cannot_tell_unassigned_from_missing(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry)
    other = add_tool(registry, key="echo.other")
    agent_id = registry.get_agent(agent)["id"]
    as_agent = Registry(registry.db, registry.owner, agent_id=agent_id)
    for key in (other["key"], "no.such.tool", str(other["id"])):
        with pytest.raises(errors.NotAssigned, match=f"^tool {key} is not assigned to this agent$"):
            as_agent.invoke(agent, key, {})
    registry.assign(agent, other["key"], allowed=False)
    with pytest.raises(errors.NotAssigned, match="denied"):
        as_agent.invoke(agent, other["key"], {})
    assert as_agent.invoke(agent, tool["key"], {"text": "ok"})
    # Another agent of the same owner is not visible to this identity.
    registry.create_agent("other-bot")
    with pytest.raises(errors.NotFound, match="^agent other-bot not found$"):
        as_agent.invoke("other-bot", tool["key"], {})


def test_a_pooled_connection_that_died_is_replaced_on_the_first_trip(
    database_url: str,
) -> None:
    db = Database(database_url, pool_size=1)
    try:
        registry = Registry(db, uuid.uuid4())
        agent, tool = agent_with_tool(registry)
        made = registry.invoke(agent, tool["key"], {"text": "x"})
        pool = db._get_pool()
        conn = pool.getconn()
        pid = conn.info.backend_pid
        pool.putconn(conn)
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # The lookup trip fails on the dead connection before anything ran: tried again.
        assert registry.get_invocation(made)["id"] == made
        assert registry.invoke(agent, tool["key"], {"text": "y"})
    finally:
        db.close()


# --- what a process keeps of the tools it read (registry/seen.py) -----------------------------


def test_a_schema_changed_since_it_was_read_decides_on_a_fresh_read(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry)
    registry.invoke(agent, tool["key"], {"text": "read it"})  # kept now
    numbers = {"type": "object", "properties": {"text": {"type": "integer"}}}
    registry.update_tool(tool["key"], {"schema_input": numbers})
    with pytest.raises(errors.InvalidInput):  # valid under the kept schema: not any more
        registry.invoke(agent, tool["key"], {"text": "no"})
    assert registry.invoke(agent, tool["key"], {"text": 5})  # refused by the kept one
    assert [r["input"] for r in registry.list_invocations()] == [{"text": 5}, {"text": "read it"}]
    for _ in range(2):  # and from now on against the new one, kept
        with pytest.raises(errors.InvalidInput):
            registry.invoke(agent, tool["key"], {"text": "no"})


def test_what_was_read_never_grants_a_call(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry)
    agent_id = registry.get_agent(agent)["id"]
    as_agent = Registry(registry.db, registry.owner, agent_id=agent_id)
    as_agent.invoke(agent, tool["key"], {"text": "kept"})
    as_agent.call(tool["key"], {"text": "kept"})
    registry.revoke(agent, tool["key"])
    with pytest.raises(
        errors.NotAssigned, match=f"^tool {tool['key']} is not assigned to this agent$"
    ):
        as_agent.invoke(agent, tool["key"], {"text": "after revoke"})
    assert as_agent.call(tool["key"], {"text": "after revoke"}).invocation_id is None
    registry.assign(agent, tool["key"])
    registry.set_tool_status(tool["key"], "disabled")
    with pytest.raises(errors.ToolrelayError):
        registry.invoke(agent, tool["key"], {"text": "disabled"})
    assert as_agent.call(tool["key"], {"text": "disabled"}).invocation_id is None
    assert len(registry.list_invocations()) == 2


def test_another_owner_never_gets_what_one_owner_read(db: Database) -> None:
    alice, bob = Registry(db, uuid.uuid4()), Registry(db, uuid.uuid4())
    for owner in (alice, bob):  # the same names on both sides
        agent, tool = agent_with_tool(owner)
    assert alice.invoke(agent, tool["key"], {"text": "alice"})
    assert bob.invoke(agent, tool["key"], {"text": "bob"})
    assert [r["input"] for r in alice.list_invocations()] == [{"text": "alice"}]
    assert [r["input"] for r in bob.list_invocations()] == [{"text": "bob"}]
    assert bob.list_invocations()[0]["agent_id"] == bob.get_agent(agent)["id"]


def test_a_name_that_now_means_another_agent_is_read_again(
    registry: Registry, database_url: str
) -> None:
    agent, tool = agent_with_tool(registry)
    first = registry.get_agent(agent)["id"]
    registry.invoke(agent, tool["key"], {"text": "first"})  # kept: the name means `first`
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("UPDATE agents.agents SET name = name || '-old' WHERE id = %s", (first,))
    registry.create_agent(agent)
    registry.assign(agent, tool["key"])
    registry.invoke(agent, tool["key"], {"text": "second"})
    latest = registry.list_invocations()[0]
    assert latest["input"] == {"text": "second"}
    assert latest["agent_id"] == registry.get_agent(agent)["id"] != first


def test_the_list_stamp_tells_nothing_of_other_agents(registry: Registry) -> None:
    """agents.agent_tools_stamp runs as its definer (migration 0021): it must check the
    caller itself. An agent gets no stamp for another agent; an owner an empty one for an
    agent that is not its own."""
    agent, _tool = agent_with_tool(registry)
    mine = registry.get_agent(agent)["id"]
    other_id = registry.create_agent("other")
    registry.assign("other", _tool["key"])
    as_agent = Registry(registry.db, registry.owner, agent_id=mine)
    stamp = "SELECT agents.agent_tools_stamp(%(a)s) AS stamp"
    with registry.db.trips() as trips:
        own = trips.run(owner_identity(registry.owner, mine), [(stamp, {"a": mine})])
        peer = trips.run(owner_identity(registry.owner, mine), [(stamp, {"a": other_id})])
        stranger = Registry(registry.db, uuid.uuid4())
        foreign = trips.run(owner_identity(stranger.owner), [(stamp, {"a": mine})])
        empty = trips.run(owner_identity(stranger.owner), [(stamp, {"a": uuid.uuid4()})])
    assert own[0][0]["stamp"] == as_agent.tools_stamp() and own[0][0]["stamp"]
    assert peer[0][0]["stamp"] is None
    assert foreign[0][0]["stamp"] == empty[0][0]["stamp"] != own[0][0]["stamp"]


def test_the_insert_against_a_read_version_answers_only_for_the_callers_own(
    db: Database, database_url: str
) -> None:
    """agents.invoke_seen runs as definer (migration 0036): called by hand with the right
    version of a tool it may not call (another tenant's, or its own tenant's unassigned),
    it makes nothing and says only "read again" (NULL)."""
    alice, bob = Registry(db, uuid.uuid4()), Registry(db, uuid.uuid4())
    agent, mine = agent_with_tool(alice)
    unassigned = add_tool(alice, "echo.other")
    _, theirs = agent_with_tool(bob)
    agent_id = alice.get_agent(agent)["id"]
    as_agent = Registry(db, alice.owner, agent_id=agent_id)
    admin_of_alice = owner_identity(alice.owner)

    def seen(identity: tuple[str, str, str], tool: dict[str, Any]) -> Any:
        with psycopg.connect(database_url, autocommit=True) as conn:
            version = conn.execute("SELECT agents.tool_version(%s)", (tool["id"],)).fetchone()
        with db.trips() as trips:
            [[row]] = trips.run(identity, [(
                "SELECT agents.invoke_seen(%(agent)s, NULL, %(tool)s, '{}', NULL, %(v)s) AS id",
                {"agent": agent_id, "tool": tool["id"], "v": version[0] if version else None},
            )])  # fmt: skip
        return row["id"]

    assert seen(as_agent.identity, theirs) is None
    assert seen(admin_of_alice, theirs) is None
    assert seen(as_agent.identity, unassigned) is None
    assert seen(as_agent.identity, mine) is not None  # the version right, the call its own
    assert len(alice.list_invocations()) == 1 and not bob.list_invocations()


def test_call_from_the_event_loop_keeps_every_rule_of_call(registry: Registry) -> None:
    """Registry.call_async (MCP's door, db/aio.py) runs call's own steps: cold then warm,
    a kept schema that went stale read again, a revoked tool refused though it was kept."""
    agent, tool = agent_with_tool(registry)
    agent_id = registry.get_agent(agent)["id"]
    as_agent = Registry(registry.db, registry.owner, agent_id=agent_id)
    numbers = {"type": "object", "properties": {"text": {"type": "integer"}}}

    async def go() -> None:
        try:
            cold = await as_agent.call_async(tool["key"], {"text": "cold"})
            warm = await as_agent.call_async(tool["key"], {"text": "warm"})
            assert cold.invocation_id and warm.invocation_id and cold.tool == warm.tool
            assert cold.stamp == warm.stamp
            registry.update_tool(tool["key"], {"schema_input": numbers})
            with pytest.raises(errors.InvalidInput):  # valid under the kept schema only
                await as_agent.call_async(tool["key"], {"text": "no"})
            assert (await as_agent.call_async(tool["key"], {"text": 5})).invocation_id
            registry.revoke(agent, tool["key"])
            gone = await as_agent.call_async(tool["key"], {"text": 6})
            assert gone.tool is None and gone.invocation_id is None
            with pytest.raises(errors.InvalidInput, match="JSON object"):
                await as_agent.call_async(tool["key"], [1])  # type: ignore[arg-type]
        finally:
            await registry.db.aclose()

    asyncio.run(go())
    inputs = [r["input"] for r in registry.list_invocations()]
    assert inputs == [{"text": 5}, {"text": "warm"}, {"text": "cold"}]


def test_invoke_from_the_event_loop_keeps_every_rule_of_invoke(registry: Registry) -> None:
    """Registry.invoke_async (the API's agent door) runs invoke's own steps."""
    agent, tool = agent_with_tool(registry)
    numbers = {"type": "object", "properties": {"text": {"type": "integer"}}}

    async def go() -> None:
        try:
            assert await registry.invoke_async(agent, tool["key"], {"text": "cold"})
            assert await registry.invoke_async(agent, tool["key"], {"text": "warm"})
            registry.update_tool(tool["key"], {"schema_input": numbers})
            with pytest.raises(errors.InvalidInput):  # valid under the kept schema only
                await registry.invoke_async(agent, tool["key"], {"text": "no"})
            assert await registry.invoke_async(agent, tool["key"], {"text": 5})
            with pytest.raises(errors.NotFound, match="^agent nobody not found$"):
                await registry.invoke_async("nobody", tool["key"], {"text": 6})
            registry.revoke(agent, tool["key"])
            with pytest.raises(errors.ToolrelayError):  # kept, but no longer assigned
                await registry.invoke_async(agent, tool["key"], {"text": 7})
        finally:
            await registry.db.aclose()

    asyncio.run(go())
    inputs = [r["input"] for r in registry.list_invocations()]
    assert inputs == [{"text": 5}, {"text": "warm"}, {"text": "cold"}]
