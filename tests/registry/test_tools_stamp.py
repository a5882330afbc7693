"""The list stamp is the agent's tools version (migration 0035): renewed in the same
transaction as every change that can alter what the agent may call or how, by any door
(the registry, an owner's plain SQL), and by nothing else (invocations, other agents,
other tenants)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.registry.helpers import add_tool
from toolrelay.db import Database
from toolrelay.registry import Registry


def _setup(registry: Registry) -> tuple[Registry, uuid.UUID]:
    """Agent 'bot' with tools a (allowed), b (allowed), c (denied); tool d unassigned."""
    for key in ("a", "b", "c", "d"):
        add_tool(registry, key)
    agent_id = registry.create_agent("bot")
    registry.assign("bot", "a")
    registry.assign("bot", "b")
    registry.assign("bot", "c", allowed=False)
    return Registry(registry.db, registry.owner, agent_id=agent_id), agent_id


def _sql(registry: Registry, statement: str, *params: Any) -> None:
    """An owner's plain SQL, as role authenticated under row-level security."""
    with registry.db.as_owner(registry.owner) as conn:
        conn.execute(statement, params)


def _tool_id(registry: Registry, key: str) -> uuid.UUID:
    return uuid.UUID(str(registry.get_tool(key)["id"]))


Change = Callable[[Registry, uuid.UUID], object]

CHANGES: dict[str, Change] = {
    "assigned": lambda r, _a: r.assign("bot", "d"),
    "allowed turned off": lambda r, _a: r.assign("bot", "a", allowed=False),
    "denied turned on": lambda r, _a: r.assign("bot", "c", allowed=True),
    "revoked": lambda r, _a: r.revoke("bot", "a"),
    "tool disabled": lambda r, _a: r.set_tool_status("a", "disabled"),
    "tool configured": lambda r, _a: r.update_tool("a", {"description": "new words"}),
    "tool gated": lambda r, _a: r.update_tool("a", {"requires_approval": True}),
    "sql: description": lambda r, _a: _sql(
        r, "UPDATE agents.tools_registry SET description = 'x' WHERE key = 'b'"
    ),
    "sql: gating": lambda r, _a: _sql(
        r, "UPDATE agents.tools_registry SET is_dangerous = true WHERE key = 'b'"
    ),
    "sql: schema": lambda r, _a: _sql(
        r,
        "UPDATE agents.tools_registry SET schema_input = '{\"type\": \"object\"}' WHERE key = 'a'",
    ),
    "sql: many tools at once": lambda r, _a: _sql(
        r, "UPDATE agents.tools_registry SET status = 'deprecated'"
    ),
    "sql: allowed": lambda r, a: _sql(
        r, "UPDATE agents.tool_assignments SET allowed = false WHERE agent_id = %s", a
    ),
    "sql: assignment deleted": lambda r, a: _sql(
        r,
        "DELETE FROM agents.tool_assignments WHERE agent_id = %s AND tool_id = %s",
        a,
        _tool_id(r, "b"),
    ),
    "sql: tool deleted": lambda r, _a: _sql(r, "DELETE FROM agents.tools_registry WHERE key = 'a'"),
    "sql: agent disabled": lambda r, a: _sql(
        r, "UPDATE agents.agents SET status = 'disabled' WHERE id = %s", a
    ),
}


@pytest.mark.parametrize("kind", list(CHANGES))
def test_each_change_renews_the_stamp(registry: Registry, kind: str) -> None:
    as_agent, agent_id = _setup(registry)
    before = as_agent.tools_stamp()
    assert before == as_agent.tools_stamp()
    CHANGES[kind](registry, agent_id)
    after = as_agent.tools_stamp()
    assert after != before, kind
    assert after == as_agent.tools_stamp()


def test_calls_invokes_and_reads_leave_the_stamp_alone(
    registry: Registry, database_url: str
) -> None:
    as_agent, _agent_id = _setup(registry)
    add_tool(registry, "gated", requires_approval=True)
    registry.assign("bot", "gated")
    before = as_agent.tools_stamp()
    called = as_agent.call("a", {"text": "one"})
    assert called.invocation_id is not None and called.stamp == before
    assert as_agent.call("a", {"text": "two"}).stamp == before  # the one-trip path
    assert as_agent.call("c", {"text": "denied"}).stamp == before
    registry.invoke("bot", "b", {"text": "three"})
    registry.reject(registry.invoke("bot", "gated", {"text": "four"}))
    # what a worker writes: the claim's lease and the outcome, on the invocation alone
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(
            "UPDATE agents.tool_invocations SET attempt = attempt + 1,"
            " lease_expires_at = now() + interval '1 minute' WHERE agent_id = %s",
            (as_agent.agent_id,),
        )
        admin.execute(
            "UPDATE agents.tool_invocations SET status = 'completed', output = '{}'"
            " WHERE agent_id = %s AND status = 'running'",
            (as_agent.agent_id,),
        )
    registry.list_tools()
    registry.agent_tools("bot")
    assert as_agent.tools_stamp() == before


def test_others_changes_leave_the_stamp_alone(registry: Registry, db: Database) -> None:
    as_agent, _agent_id = _setup(registry)
    before = as_agent.tools_stamp()
    # the same tenant: another agent, and a tool this agent does not have
    registry.create_agent("other")
    registry.assign("other", "a")
    registry.assign("other", "d")
    registry.revoke("other", "d")
    registry.update_tool("d", {"description": "not bot's"})
    registry.update_tool("c", {"description": "denied to bot"})
    _sql(registry, "UPDATE agents.tools_registry SET is_dangerous = true WHERE key = 'd'")
    # another tenant, with tools of the same keys
    stranger = Registry(db, uuid.uuid4())
    stranger_as_agent, _ = _setup(stranger)
    stranger.update_tool("a", {"description": "elsewhere"})
    stranger.set_tool_status("b", "disabled")
    stranger.revoke("bot", "a")
    assert as_agent.tools_stamp() == before
    assert stranger_as_agent.tools_stamp() != before


def test_a_stamp_is_only_for_its_owner(registry: Registry, db: Database) -> None:
    _as_agent, agent_id = _setup(registry)
    stranger = Registry(db, uuid.uuid4())
    stranger.create_agent("bot")
    with db.as_owner(stranger.owner) as conn:
        row = conn.execute("SELECT agents.agent_tools_stamp(%s) AS s", (agent_id,)).fetchone()
        missing = conn.execute(
            "SELECT agents.agent_tools_stamp(%s) AS s", (uuid.uuid4(),)
        ).fetchone()
    assert row is not None and missing is not None
    assert row["s"] == missing["s"]
    with db.as_owner(registry.owner) as conn:
        for table in ("agents.agent_tools_versions",):
            with pytest.raises(Exception, match="permission denied"):
                conn.execute(f"SELECT * FROM {table}")


def test_tool_updates_racing_calls_and_each_other_do_not_deadlock(
    registry: Registry, db: Database
) -> None:
    """Two tools shared by three agents, each updated in a loop by its own thread while
    the agents call them: every statement completes (a deadlock would raise 40P01)."""
    for key in ("a", "b"):  # gated: the calls wait, and no worker of another test runs them
        add_tool(registry, key, requires_approval=True)
    agents = []
    for name in ("x", "y", "z"):
        agents.append(Registry(db, registry.owner, agent_id=registry.create_agent(name)))
        registry.assign(name, "a")
        registry.assign(name, "b")
    before = [agent.tools_stamp() for agent in agents]
    start = threading.Barrier(2 + len(agents))
    errors: list[BaseException] = []
    rounds = 40

    def run(work: Callable[[int], object]) -> None:
        try:
            start.wait(timeout=30)
            for i in range(rounds):
                work(i)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    def update(key: str) -> Callable[[int], object]:
        return lambda i: registry.update_tool(key, {"description": f"{key} {i}"})

    def calls(agent: Registry) -> Callable[[int], object]:
        return lambda i: agent.call("a" if i % 2 else "b", {"text": str(i)})

    threads = [threading.Thread(target=run, args=(update(key),)) for key in ("a", "b")]
    threads += [threading.Thread(target=run, args=(calls(agent),)) for agent in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    after = [agent.tools_stamp() for agent in agents]
    assert all(b != a for b, a in zip(before, after, strict=True))
    assert len(set(after)) == len(after)  # one sequence: no two agents share a stamp
