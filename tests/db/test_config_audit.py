"""The audit log of configuration (migration 0023) as SQL sees it: each kind and action is
logged with its actor and a diff of the non-secret columns, whichever statement made it
(the fn_* functions, a plain UPDATE as the owner, service_role, a psql session outside the
convention); nothing is logged for what changed nothing, for bookkeeping, or for a change
that was rolled back."""

from __future__ import annotations

import os
import uuid
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.registry.helpers import add_tool
from toolrelay.db import Database
from toolrelay.registry import Registry

Row = dict[str, Any]
CREDENTIAL_INSERT = (
    "INSERT INTO agents.credentials (name, kind, key_id, wrapped_key, nonce, ciphertext)"
    " VALUES (%s, 'api_key', 'k1', '\\xdeadbeef', '\\xcafe', '\\xf00d') RETURNING id"
)


def audit_rows(database_url: str, owner: UUID, **where: Any) -> list[Row]:
    """The owner's rows, oldest first, read as the superuser (no policy in the way)."""
    conditions = "".join(f" AND {column} = %({column})s" for column in where)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT * FROM agents.config_audit WHERE owner = %(owner)s" + conditions
            + " ORDER BY at, id",
            {"owner": owner, **where},
        ).fetchall()  # fmt: skip


def owner_sql(db: Database, owner: UUID, sql: str, params: Any = None) -> Row | None:
    with db.as_owner(owner) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchone() if cur.description else None


def test_fn_register_tool_logs_an_insert_then_only_what_an_upsert_changed(
    registry: Registry, db: Database, database_url: str
) -> None:
    owner = registry.owner
    owner_sql(db, owner, "SELECT fn_register_tool(p_key => 'weather.get', p_name => 'Weather')")
    owner_sql(db, owner, "SELECT fn_register_tool(p_key => 'weather.get', p_name => 'Weather')")
    owner_sql(db, owner, "SELECT fn_register_tool(p_key => 'weather.get', p_name => 'Météo')")
    rows = audit_rows(database_url, owner)
    assert [(r["kind"], r["action"], r["object_label"]) for r in rows] == [
        ("tool", "insert", "weather.get"),
        ("tool", "update", "weather.get"),  # the second upsert changed nothing: no row
    ]
    insert, update = rows
    tool_id = registry.get_tool("weather.get")["id"]
    assert insert["object_id"] == update["object_id"] == tool_id
    assert insert["changes"]["key"] == {"new": "weather.get"}
    assert insert["changes"]["category"] == {"new": "general"}
    assert "updated_at" not in insert["changes"]  # bookkeeping
    assert "id" not in insert["changes"] and "owner" not in insert["changes"]  # columns of ours
    assert update["changes"] == {"name": {"old": "Weather", "new": "Météo"}}
    for row in rows:
        assert (row["actor"], row["actor_role"]) == (owner, "authenticated")
        assert row["session_role"]  # the login role, whatever the test server's is


def test_the_rfcs_plain_update_as_owner_is_logged_with_old_and_new(
    registry: Registry, db: Database, database_url: str
) -> None:
    owner = registry.owner
    add_tool(registry, "postiz.create_post", http_method="POST", egress_class="write")
    credential = owner_sql(db, owner, CREDENTIAL_INSERT, ("postiz",))
    assert credential is not None
    owner_sql(db, owner, "UPDATE agents.tools_registry SET auth_method = 'api_key' WHERE key = %s",
              ("postiz.create_post",))  # fmt: skip
    before = len(audit_rows(database_url, owner))
    with db.as_owner(owner) as conn:  # the RFC's example, with real values
        conn.execute(
            "UPDATE agents.tools_registry SET endpoint_url = %s, credential_ref = %s"
            " WHERE key = 'postiz.create_post'",
            ("https://postiz.example.com/api/public/v1/posts", credential["id"]),
        )
    new = audit_rows(database_url, owner)[before:]
    tool, cred = sorted(new, key=lambda r: r["kind"], reverse=True)
    assert (tool["kind"], tool["action"], tool["actor"]) == ("tool", "update", owner)
    assert tool["changes"] == {
        "endpoint_url": {"old": "https://api.example.com/echo",
                         "new": "https://postiz.example.com/api/public/v1/posts"},
        "credential_ref": {"old": None, "new": str(credential["id"])},
    }  # fmt: skip
    # Binding the credential bound it to the tool's host (0004's trigger): logged as well,
    # in the same transaction, by the same actor.
    assert (cred["kind"], cred["action"], cred["object_id"]) == ("credential", "update",
                                                                 credential["id"])  # fmt: skip
    assert cred["changes"] == {"allowed_hosts": {"old": [], "new": ["postiz.example.com"]}}
    assert cred["xact_id"] == tool["xact_id"] and cred["actor"] == owner


def test_agents_assignments_and_tokens_each_action(
    registry: Registry, db: Database, database_url: str
) -> None:
    owner = registry.owner
    tool = add_tool(registry, "notes.list")
    bot = registry.create_agent("bot")
    registry.assign("bot", "notes.list")
    registry.assign("bot", "notes.list", allowed=False)
    owner_sql(db, owner, "UPDATE agents.agents SET status = 'disabled' WHERE id = %s", (bot,))
    token = owner_sql(db, owner, "SELECT fn_create_api_token(%s, %s, 'ci') AS id",
                      (os.urandom(32), bot))  # fmt: skip
    assert token is not None
    owner_sql(db, owner, "SELECT fn_revoke_api_token(%s)", (token["id"],))
    registry.revoke("bot", "notes.list")
    owner_sql(db, owner, "DELETE FROM agents.agents WHERE id = %s", (bot,))
    rows = [r for r in audit_rows(database_url, owner) if r["kind"] != "tool"]
    assert [(r["kind"], r["action"]) for r in rows] == [
        ("agent", "insert"),
        ("assignment", "insert"),
        ("assignment", "update"),
        ("agent", "update"),
        ("token", "insert"),
        ("token", "update"),
        ("assignment", "delete"),
        ("agent", "delete"),
        ("token", "delete"),  # the agent's token goes with it (the foreign key's cascade)
    ]
    by = {(r["kind"], r["action"]): r for r in rows}
    assert by["agent", "insert"]["changes"]["name"] == {"new": "bot"}
    assert by["agent", "insert"]["object_id"] == bot
    assert by["assignment", "insert"]["changes"]["agent_id"] == {"new": str(bot)}
    assert by["assignment", "insert"]["changes"]["tool_id"] == {"new": str(tool["id"])}
    assert by["assignment", "update"]["changes"] == {"allowed": {"old": True, "new": False}}
    assert by["agent", "update"]["changes"] == {"status": {"old": "active", "new": "disabled"}}
    assert by["token", "insert"]["object_label"] == "ci"
    assert by["token", "insert"]["changes"]["agent_id"] == {"new": str(bot)}
    assert set(by["token", "update"]["changes"]) == {"revoked_at"}
    assert by["token", "update"]["changes"]["revoked_at"]["old"] is None
    assert by["agent", "delete"]["changes"]["name"] == {"old": "bot"}
    assert all(r["actor"] == owner and r["actor_role"] == "authenticated" for r in rows)


def test_credential_metadata_changes_and_delete(
    registry: Registry, db: Database, database_url: str
) -> None:
    owner = registry.owner
    cred = owner_sql(db, owner, CREDENTIAL_INSERT, ("stripe",))
    assert cred is not None
    with db.as_owner(owner) as conn:
        conn.execute("UPDATE agents.credentials SET name = 'stripe-live',"
                     " allowed_hosts = '{api.stripe.com}' WHERE id = %s", (cred["id"],))  # fmt: skip
        conn.execute("UPDATE agents.credentials SET ciphertext = '\\x0102', nonce = '\\x0304',"
                     " rotated_at = now(), status = 'active' WHERE id = %s", (cred["id"],))  # fmt: skip
        conn.execute("DELETE FROM agents.credentials WHERE id = %s", (cred["id"],))
    rows = audit_rows(database_url, owner, kind="credential")
    assert [r["action"] for r in rows] == ["insert", "update", "update", "delete"]
    insert, rename, rotate, delete = rows
    assert set(insert["changes"]) == {"name", "kind", "allowed_hosts", "status", "created_at",
                                      "rotated_at", "expires_at"}  # fmt: skip
    assert rename["changes"] == {
        "name": {"old": "stripe", "new": "stripe-live"},
        "allowed_hosts": {"old": [], "new": ["api.stripe.com"]},
    }
    assert set(rotate["changes"]) == {"rotated_at"}  # the secret changed: only that it did
    assert delete["object_label"] == "stripe-live"
    assert delete["changes"]["name"] == {"old": "stripe-live"}


def test_updates_that_change_nothing_logged_write_no_row(
    registry: Registry, db: Database, database_url: str
) -> None:
    owner = registry.owner
    add_tool(registry, "notes.list")
    registry.create_agent("bot")
    cred = owner_sql(db, owner, CREDENTIAL_INSERT, ("k",))
    assert cred is not None
    before = audit_rows(database_url, owner)
    with db.as_owner(owner) as conn:
        conn.execute("UPDATE agents.tools_registry SET name = name, updated_at = now()")
        conn.execute("UPDATE agents.agents SET status = status")
        conn.execute("UPDATE agents.credentials SET name = name")
    with db.as_dispatcher() as conn:  # the dispatcher's bookkeeping and an OAuth refresh
        conn.execute("UPDATE agents.credentials SET last_used_at = now() WHERE id = %s",
                     (cred["id"],))  # fmt: skip
        conn.execute("UPDATE agents.credentials SET key_id = 'k2', wrapped_key = '\\x01',"
                     " nonce = '\\x02', ciphertext = '\\x03', expires_at = now() + interval '1 h'"
                     " WHERE id = %s", (cred["id"],))  # fmt: skip
    assert audit_rows(database_url, owner) == before


def test_service_role_and_a_plain_session_are_logged_as_what_they_are(
    registry: Registry, db: Database, database_url: str
) -> None:
    owner = registry.owner
    cred = owner_sql(db, owner, CREDENTIAL_INSERT, ("oauth-ish",))
    assert cred is not None
    with db.as_dispatcher() as conn:  # e.g. an OAuth credential whose refresh was refused
        conn.execute("UPDATE agents.credentials SET status = 'needs_reauth' WHERE id = %s",
                     (cred["id"],))  # fmt: skip
    with psycopg.connect(database_url) as conn:  # psql as the login role, no SET ROLE, no sub
        conn.execute("UPDATE agents.credentials SET status = 'revoked' WHERE id = %s",
                     (cred["id"],))  # fmt: skip
        session_user = conn.execute("SELECT session_user").fetchone()
    assert session_user is not None
    dispatcher, session = audit_rows(database_url, owner, kind="credential")[1:]
    assert (dispatcher["actor"], dispatcher["actor_role"]) == (None, "service_role")
    assert dispatcher["changes"] == {"status": {"old": "active", "new": "needs_reauth"}}
    assert (session["actor"], session["actor_role"]) == (None, session_user[0])
    assert session["session_role"] == session_user[0]
    assert session["changes"] == {"status": {"old": "needs_reauth", "new": "revoked"}}


def test_a_change_rolled_back_leaves_no_row(
    registry: Registry, db: Database, database_url: str
) -> None:
    owner = registry.owner
    add_tool(registry, "notes.list")
    before = audit_rows(database_url, owner)
    with pytest.raises(RuntimeError), db.as_owner(owner) as conn:
        conn.execute("UPDATE agents.tools_registry SET name = 'renamed'")
        conn.execute("SELECT fn_create_agent('bot')")
        raise RuntimeError("the caller gives up")
    with pytest.raises(psycopg.errors.CheckViolation), db.as_owner(owner) as conn:
        conn.execute("UPDATE agents.tools_registry SET name = 'renamed'")
        conn.execute("UPDATE agents.tools_registry SET http_method = 'TRACE'")
    assert audit_rows(database_url, owner) == before


def test_each_row_is_stamped_with_its_statements_clock(
    registry: Registry, db: Database, database_url: str
) -> None:
    owner = registry.owner
    with db.as_owner(owner) as conn:
        conn.execute("SELECT fn_create_agent('a')")
        conn.execute("SELECT pg_sleep(0.01)")
        conn.execute("SELECT fn_create_agent('b')")
        started = conn.execute("SELECT now() AS t").fetchone()
    assert started is not None
    a, b = audit_rows(database_url, owner)
    assert started["t"] <= a["at"] < b["at"]  # clock_timestamp(), not the transaction's now()
    assert a["id"] < b["id"] and a["xact_id"] == b["xact_id"]


def test_an_object_moved_to_another_tenant_is_in_both_logs(
    registry: Registry, db: Database, database_url: str
) -> None:
    new_owner = uuid.uuid4()
    bot = registry.create_agent("bot")
    with db.as_dispatcher() as conn:
        conn.execute("UPDATE agents.agents SET owner = %s WHERE id = %s", (new_owner, bot))
    [old_side] = audit_rows(database_url, registry.owner, action="update")
    [new_side] = audit_rows(database_url, new_owner)
    for row in (old_side, new_side):
        assert row["object_id"] == bot
        assert row["changes"] == {"owner": {"old": str(registry.owner), "new": str(new_owner)}}
