"""Registry.invoke's path: four round trips, and every refusal as clear as before."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import pytest

from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay import errors
from toolrelay.db import Database
from toolrelay.registry import Registry

# BEGIN (psycopg syncs after it, even in a pipeline); the identity and the lookup
# (agents.invoke_target) pipelined; fn_invoke_tool; COMMIT. Before: six, one per statement.
MAX_ROUND_TRIPS = 4


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


def test_invoke_takes_four_round_trips(database_url: str) -> None:
    db = Database(database_url, pool_size=1)  # one connection: the one traced
    try:
        registry = Registry(db, uuid.uuid4())
        agent, tool = agent_with_tool(registry)
        registry.invoke(agent, tool["key"], {"text": "warm"})
        trips = round_trips(db, lambda: registry.invoke(agent, tool["key"], {"text": "x"}))
        assert trips == MAX_ROUND_TRIPS
        agent_id = str(registry.get_agent(agent)["id"])
        as_agent = Registry(db, registry.owner, agent_id=agent_id)
        by_ids = round_trips(db, lambda: as_agent.invoke(agent_id, str(tool["id"]), {}))
        assert by_ids == MAX_ROUND_TRIPS
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
