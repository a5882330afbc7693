"""Two owners: B cannot see or change A's rows; nobody writes invocations directly."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from tests.registry.helpers import agent_with_tool
from toolrelay import errors
from toolrelay.db import Database
from toolrelay.registry import Registry


@pytest.fixture
def alice_and_bob(make_registry: Callable[[], Registry]) -> tuple[Registry, Registry]:
    alice, bob = make_registry(), make_registry()
    agent, tool = agent_with_tool(alice, requires_approval=True)
    alice.invoke(agent, tool["key"], {})
    return alice, bob


@pytest.mark.parametrize(
    "table", ["tools_registry", "agents", "tool_assignments", "tool_invocations", "credentials"]
)
def test_owner_cannot_see_another_owners_rows(
    alice_and_bob: tuple[Registry, Registry], db: Database, table: str
) -> None:
    alice, bob = alice_and_bob
    with db.as_owner(bob.owner) as conn:
        rows = conn.execute(f"SELECT owner FROM agents.{table}").fetchall()
    assert all(r["owner"] == bob.owner for r in rows)
    with db.as_owner(alice.owner) as conn:
        mine = conn.execute(f"SELECT count(*) AS n FROM agents.{table}").fetchone()
    assert mine is not None and (mine["n"] > 0 or table == "credentials")


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE agents.tools_registry SET name = 'pwned'",
        "DELETE FROM agents.tools_registry",
        "UPDATE agents.agents SET name = 'pwned'",
        "UPDATE agents.tool_assignments SET allowed = false",
    ],
)
def test_owner_cannot_change_another_owners_rows(
    alice_and_bob: tuple[Registry, Registry], db: Database, sql: str
) -> None:
    alice, bob = alice_and_bob
    with db.as_owner(bob.owner) as conn:
        assert conn.execute(sql).rowcount == 0
    assert alice.get_tool("echo.get")["name"] == "echo.get"
    assert alice.list_assignments()[0]["allowed"] is True


def test_owner_cannot_insert_a_running_invocation(
    alice_and_bob: tuple[Registry, Registry], db: Database
) -> None:
    alice, _ = alice_and_bob
    pending = alice.list_invocations()[0]
    with pytest.raises(psycopg.errors.InsufficientPrivilege), db.as_owner(alice.owner) as conn:
        conn.execute(
            "INSERT INTO agents.tool_invocations (owner, tool_id, agent_id, status, approval_status)"
            " VALUES (%s, %s, %s, 'running', 'not_required')",
            (alice.owner, pending["tool_id"], pending["agent_id"]),
        )


def test_owner_cannot_move_an_invocations_status(
    alice_and_bob: tuple[Registry, Registry], db: Database
) -> None:
    alice, _ = alice_and_bob
    with pytest.raises(psycopg.errors.InsufficientPrivilege), db.as_owner(alice.owner) as conn:
        conn.execute(
            "UPDATE agents.tool_invocations SET status = 'running', approval_status = 'approved'"
        )
    assert alice.list_invocations()[0]["status"] == "pending"


def test_cannot_assign_another_owners_tool(
    alice_and_bob: tuple[Registry, Registry], db: Database
) -> None:
    alice, bob = alice_and_bob
    alice_tool = alice.get_tool("echo.get")
    bob.create_agent("bob-bot")
    bob_agent = bob.get_agent("bob-bot")
    with db.as_owner(bob.owner) as conn, pytest.raises(psycopg.errors.NoDataFound):
        conn.execute("SELECT fn_assign_tool(%s, %s)", (bob_agent["id"], alice_tool["id"]))
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"),
        db.as_owner(bob.owner) as conn,
    ):
        conn.execute(
            "INSERT INTO agents.tool_assignments (agent_id, tool_id) VALUES (%s, %s)",
            (bob_agent["id"], alice_tool["id"]),
        )


def test_cannot_invoke_or_approve_across_owners(alice_and_bob: tuple[Registry, Registry]) -> None:
    alice, bob = alice_and_bob
    inv = alice.list_invocations()[0]
    with pytest.raises(errors.NotFound):
        bob.get_invocation(inv["id"])
    with pytest.raises(errors.NotFound):
        bob.approve(inv["id"])
    with pytest.raises(errors.NotFound):
        bob.invoke("bot", "echo.get", {})


def test_unauthenticated_caller_is_refused(db: Database) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege), db.connect() as conn:
        conn.execute("SET ROLE authenticated")
        conn.execute("SELECT fn_create_agent('x')")
