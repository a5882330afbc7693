"""Finding 8: deleting a tool or an agent erased every invocation and attempt made with it.

Now the history stays (the foreign keys set NULL; the tool key and agent name are copied
onto the invocation rows as they go) and the deleted tool's or agent's calls that were not
sent yet end ``failed``; calls under a worker's lease are left to that worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from uuid import UUID

from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry


def _finish(db: Database, call: UUID, owner: UUID) -> None:
    """What a worker records for a call it sent: the outcome and the attempt."""
    with db.as_dispatcher() as conn:
        conn.execute(
            "UPDATE agents.tool_invocations SET status = 'completed', output = '{\"ok\": 1}',"
            " attempt = 1, finished_at = now() WHERE id = %s",
            (call,),
        )
        conn.execute(
            "INSERT INTO agents.tool_invocation_attempts (invocation_id, owner, attempt, worker,"
            " started_at, finished_at, status_code) VALUES (%s, %s, 1, 'w1', now(), now(), 200)",
            (call, owner),
        )


def _delete(db: Database, owner: UUID, table: str, ident: UUID) -> None:
    """A plain DELETE by the owner (no function needed: RLS lets owners delete their rows)."""
    with db.as_owner(owner) as conn:
        assert conn.execute(f"DELETE FROM agents.{table} WHERE id = %s", (ident,)).rowcount == 1


def test_deleting_a_tool_keeps_its_calls_and_their_attempts(
    registry: Registry, db: Database
) -> None:
    agent, tool = agent_with_tool(registry)
    call = registry.invoke(agent, tool["key"], {"text": "hi"})
    _finish(db, call, registry.owner)

    _delete(db, registry.owner, "tools_registry", tool["id"])

    kept = registry.get_invocation(call)
    assert (kept["status"], kept["output"], kept["tool_id"]) == ("completed", {"ok": 1}, None)
    assert kept["tool_key"] == tool["key"] and kept["agent_name"] == agent
    assert [(a["attempt"], a["status_code"]) for a in kept["attempts"]] == [(1, 200)]
    assert [r["id"] for r in registry.list_invocations()] == [call]
    assert [r["id"] for r in registry.list_invocations(tool=tool["key"])] == [call]
    assert registry.list_assignments() == []  # configuration still cascades


def test_deleting_an_agent_keeps_its_calls_and_stops_its_unsent_ones(
    registry: Registry, db: Database
) -> None:
    agent, tool = agent_with_tool(registry, requires_approval=True)
    sent, waiting = (registry.invoke(agent, tool["key"], {}) for _ in range(2))
    registry.approve(sent)
    _finish(db, sent, registry.owner)
    agent_id = registry.get_agent(agent)["id"]

    _delete(db, registry.owner, "agents", agent_id)

    calls = {r["id"]: r for r in registry.list_invocations(agent=agent)}
    assert set(calls) == {sent, waiting}
    assert all(r["agent_id"] is None and r["agent_name"] == agent for r in calls.values())
    assert calls[sent]["status"] == "completed"
    assert len(registry.get_invocation(sent)["attempts"]) == 1
    assert (calls[waiting]["status"], calls[waiting]["error_code"]) == ("failed", "not_assigned")
    assert f"agent {agent} was deleted" in calls[waiting]["error"]
    assert registry.review_queue() == []


def test_a_deleted_tools_unsent_calls_fail_and_leased_ones_are_left_to_the_worker(
    registry: Registry, db: Database
) -> None:
    agent, tool = agent_with_tool(registry, requires_approval=True)
    waiting, runnable, leased, done = (registry.invoke(agent, tool["key"], {}) for _ in range(4))
    for call in (runnable, leased, done):
        registry.approve(call)
    _finish(db, done, registry.owner)
    with db.as_dispatcher() as conn:  # a worker claimed this one and may be sending it now
        conn.execute(
            "UPDATE agents.tool_invocations SET attempt = 1, lease_owner = 'w1',"
            " lease_expires_at = now() + interval '30 s' WHERE id = %s",
            (leased,),
        )

    _delete(db, registry.owner, "tools_registry", tool["id"])

    calls = {r["id"]: r for r in registry.list_invocations()}
    assert set(calls) == {waiting, runnable, leased, done}
    assert all(r["tool_id"] is None and r["tool_key"] == tool["key"] for r in calls.values())
    for call in (waiting, runnable):
        assert (calls[call]["status"], calls[call]["error_code"]) == ("failed", "tool_inactive")
        assert f"tool {tool['key']} was deleted" in calls[call]["error"]
        assert calls[call]["finished_at"] is not None
    assert (calls[leased]["status"], calls[leased]["lease_owner"]) == ("running", "w1")
    assert calls[leased]["error_code"] is None
    assert (calls[done]["status"], calls[done]["error_code"]) == ("completed", None)
    assert registry.review_queue() == []
    _finish(db, leased, registry.owner)  # as its worker would: no lease left for others' drains


async def test_a_leased_call_whose_tool_was_deleted_ends_when_its_lease_is_recovered(
    registry: Registry, db: Database, drain: Callable[..., Awaitable[Worker]]
) -> None:
    """A dead worker's claim on a call of a tool deleted since: the next worker fails it
    (``tool_inactive``), instead of claiming it forever."""
    agent, tool = agent_with_tool(registry)
    call = registry.invoke(agent, tool["key"], {})
    with db.as_dispatcher() as conn:  # claimed by a worker that then died, before sending
        conn.execute(
            "UPDATE agents.tool_invocations SET attempt = 1, lease_owner = 'dead',"
            " lease_expires_at = now() - interval '1 second' WHERE id = %s",
            (call,),
        )
    _delete(db, registry.owner, "tools_registry", tool["id"])
    assert registry.get_invocation(call)["status"] == "running"  # left to the worker
    await drain()
    done = registry.get_invocation(call)
    assert (done["status"], done["error_code"]) == ("failed", "tool_inactive")
    assert done["tool_key"] == tool["key"]
