"""Finding 2: an agent identity invokes and reads its own rows, nothing else.

With ``agent_id`` in its claims an agent could rewrite its owner's configuration by plain
SQL: ungate its write tool, assign itself a tool, widen a credential's allowed_hosts,
disable another agent. Now the database refuses it whichever door the identity comes
through: toolrelay's own (``Database.as_owner(owner, agent_id)``), PostgREST's older
one-setting-per-claim style, and PostgREST's ``request.jwt.claims`` JSON alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import pytest

from tests.registry.helpers import add_tool
from toolrelay.db import Database
from toolrelay.db.connect import Row
from toolrelay.registry import Registry

DOORS = ("toolrelay", "per_claim_settings", "claims_json")
# Functions an agent identity may call; every other public.fn_* is for a human owner.
AGENT_CALLABLE = frozenset({"fn_invoke_tool", "fn_expire_tool_invocations"})


@dataclass(frozen=True)
class Office:
    """One owner's configuration: a bot and another agent, each with its own tool."""

    registry: Registry
    bot: UUID
    other_agent: UUID
    bot_tool: UUID  # a gated write, assigned to the bot
    other_tool: UUID  # assigned to the other agent only
    credential: UUID
    bot_call: UUID
    other_call: UUID
    token: UUID


def _owner_sql(db: Database, owner: UUID, sql: str, params: Any = None) -> Row:
    with db.as_owner(owner) as conn:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        return row


@pytest.fixture
def office(registry: Registry, db: Database) -> Office:
    bot_tool = add_tool(registry, "notes.create", http_method="POST", egress_class="write")
    other_tool = add_tool(registry, "notes.list")
    bot, other_agent = registry.create_agent("bot"), registry.create_agent("other")
    registry.assign("bot", "notes.create")
    registry.assign("other", "notes.list")
    credential = _owner_sql(
        db,
        registry.owner,
        "INSERT INTO agents.credentials (name, kind, allowed_hosts, key_id, wrapped_key, nonce,"
        " ciphertext) VALUES ('notes-key', 'api_key', '{api.example.com}', 'k1', '\\x00',"
        " '\\x00', '\\x00') RETURNING id",
    )["id"]
    token = _owner_sql(
        db,
        registry.owner,
        "SELECT fn_create_api_token(%s, %s) AS id",
        (os.urandom(32), bot),
    )["id"]
    bot_call = registry.invoke("bot", "notes.create", {"text": "hi"})
    other_call = registry.invoke("other", "notes.list", {})
    with db.as_dispatcher() as conn:
        for call in (bot_call, other_call):
            conn.execute(
                "INSERT INTO agents.tool_invocation_attempts (invocation_id, owner, attempt,"
                " worker, started_at) VALUES (%s, %s, 1, 'w', now())",
                (call, registry.owner),
            )
    return Office(
        registry, bot, other_agent, bot_tool["id"], other_tool["id"], credential, bot_call,
        other_call, token,
    )  # fmt: skip


@contextmanager
def as_agent(
    db: Database, door: str, owner: UUID, agent: UUID
) -> Iterator[psycopg.Connection[Row]]:
    """A transaction under role authenticated carrying ``agent``'s identity through ``door``."""
    if door == "toolrelay":
        with db.as_owner(owner, agent_id=agent) as conn:
            yield conn
        return
    if door == "per_claim_settings":  # PostgREST before v9: one setting per claim
        settings = {"request.jwt.claim.sub": str(owner), "request.jwt.claim.agent_id": str(agent)}
    else:  # PostgREST 9 and later: the JSON of all claims, nothing else
        claims = {"sub": str(owner), "role": "authenticated", "agent_id": str(agent)}
        settings = {"request.jwt.claims": json.dumps(claims)}
    with db.connect() as conn:
        conn.execute("SELECT set_config('role', 'authenticated', true)")
        for name, value in settings.items():
            conn.execute("SELECT set_config(%s, %s, true)", (name, value))
        yield conn


def _snapshot(db: Database, owner: UUID) -> dict[str, list[Row]]:
    with db.as_owner(owner) as conn:
        return {
            table: conn.execute(f"SELECT * FROM agents.{table} ORDER BY id").fetchall()
            for table in ("agents", "tools_registry", "tool_assignments")
        } | {
            "credentials": conn.execute(
                "SELECT id, name, allowed_hosts, status FROM agents.credentials ORDER BY id"
            ).fetchall()
        }


# What the agent tried, each refused now; the owner may do every one of them.
WRITES = {
    "ungate_its_write_tool": "UPDATE agents.tools_registry SET requires_approval = false,"
    " egress_class = 'read_only' WHERE id = %(bot_tool)s",
    "assign_itself_a_tool": "INSERT INTO agents.tool_assignments (agent_id, tool_id)"
    " VALUES (%(bot)s, %(other_tool)s)",
    "allow_itself_every_host": "UPDATE agents.credentials SET allowed_hosts = '{evil.example}'"
    " WHERE id = %(credential)s",
    "disable_another_agent": "UPDATE agents.agents SET status = 'disabled' WHERE id = %(other)s",
    "rename_itself": "UPDATE agents.agents SET name = 'boss' WHERE id = %(bot)s",
    "register_a_tool": "INSERT INTO agents.tools_registry (key, name) VALUES ('x.new', 'x')",
    "create_an_agent": "INSERT INTO agents.agents (name) VALUES ('clone')",
    "drop_its_assignment": "DELETE FROM agents.tool_assignments WHERE agent_id = %(bot)s",
    "delete_a_tool": "DELETE FROM agents.tools_registry WHERE id = %(other_tool)s",
    "delete_itself": "DELETE FROM agents.agents WHERE id = %(bot)s",
    "delete_the_credential": "DELETE FROM agents.credentials WHERE id = %(credential)s",
    "bind_itself_to_an_identity": "UPDATE agents.agents SET oauth_issuer ="
    " 'https://auth.example.com', oauth_subject = 'mallory' WHERE id = %(bot)s",
}


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("write", sorted(WRITES))
def test_agent_identity_cannot_change_configuration(
    office: Office, db: Database, door: str, write: str
) -> None:
    owner = office.registry.owner
    params = {
        "bot": office.bot, "other": office.other_agent, "bot_tool": office.bot_tool,
        "other_tool": office.other_tool, "credential": office.credential,
    }  # fmt: skip
    if write == "delete_the_credential":  # a tool still uses it otherwise (RESTRICT)
        params["credential"] = _owner_sql(
            db, owner, "INSERT INTO agents.credentials (name, kind, key_id, wrapped_key, nonce,"
            " ciphertext) VALUES ('spare', 'api_key', 'k1', '\\x00', '\\x00', '\\x00') RETURNING id",
        )["id"]  # fmt: skip
    before = _snapshot(db, owner)
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent identity"),
        as_agent(db, door, owner, office.bot) as conn,
    ):
        conn.execute(WRITES[write], params)
    assert _snapshot(db, owner) == before
    assert office.registry.get_tool(str(office.bot_tool))["requires_approval"] is True
    # The refusal is about the identity: the owner's own transaction does the same.
    with db.as_owner(owner) as conn:
        assert conn.execute(WRITES[write], params).rowcount == 1
        conn.rollback()


@pytest.mark.parametrize("door", DOORS)
def test_agent_identity_reads_only_its_own_rows(office: Office, db: Database, door: str) -> None:
    owner = office.registry.owner
    with as_agent(db, door, owner, office.bot) as conn:

        def ids(sql: str) -> set[UUID]:
            return {row["id"] for row in conn.execute(sql).fetchall()}

        assert ids("SELECT id FROM agents.agents") == {office.bot}
        assert ids("SELECT tool_id AS id FROM agents.tool_assignments") == {office.bot_tool}
        assert ids("SELECT id FROM agents.tools_registry") == {office.bot_tool}
        assert ids("SELECT id FROM agents.tool_invocations") == {office.bot_call}
        # attempts are the owner's (egress detail, the request sent): not even its own
        assert ids("SELECT invocation_id AS id FROM agents.tool_invocation_attempts") == set()
        assert ids("SELECT id FROM agents.credentials") == set()
        assert ids("SELECT id FROM agents.api_tokens") == set()
        # ...and it may still invoke, as itself.
        call = conn.execute(
            "SELECT fn_invoke_tool(%s, %s, '{}') AS id", (office.bot, office.bot_tool)
        ).fetchone()
        assert call is not None
        assert ids("SELECT id FROM agents.tool_invocations") == {office.bot_call, call["id"]}
    # The owner still sees everything of theirs.
    with db.as_owner(owner) as conn:
        assert len(conn.execute("SELECT id FROM agents.tools_registry").fetchall()) == 2
        assert len(conn.execute("SELECT id FROM agents.tool_invocations").fetchall()) == 3


# Owner-only functions of migrations that may not be on every branch yet: checked when there.
LATER_OWNER_ONLY: dict[str, tuple[str, tuple[Any, ...]]] = {
    "fn_webhook_redeliver": ("SELECT fn_webhook_redeliver(gen_random_uuid())", ()),
}


def _owner_only_calls(office: Office) -> dict[str, tuple[str, tuple[Any, ...]]]:
    return {
        "fn_register_tool": ("SELECT fn_register_tool(p_key => 'x.y', p_name => 'x')", ()),
        "fn_create_agent": ("SELECT fn_create_agent('clone')", ()),
        "fn_assign_tool": ("SELECT fn_assign_tool(%s, %s)", (office.bot, office.other_tool)),
        "fn_revoke_tool": ("SELECT fn_revoke_tool(%s, %s)", (office.bot, office.bot_tool)),
        "fn_approve_tool_invocation": ("SELECT fn_approve_tool_invocation(%s)", (office.bot_call,)),
        "fn_reject_tool_invocation": ("SELECT fn_reject_tool_invocation(%s)", (office.bot_call,)),
        "fn_retry_tool_invocation": ("SELECT fn_retry_tool_invocation(%s)", (office.bot_call,)),
        "fn_create_api_token": (
            "SELECT fn_create_api_token(%s, %s)", (os.urandom(32), office.bot)),
        "fn_revoke_api_token": ("SELECT fn_revoke_api_token(%s)", (office.token,)),
        "fn_add_member": ("SELECT fn_add_member('Eve', 'admin')", ()),
        "fn_set_member_role": ("SELECT fn_set_member_role(%s, 'admin')", (office.registry.owner,)),
        "fn_set_member_email": ("SELECT fn_set_member_email(%s, 'x@example.test')", (office.registry.owner,)),
        "fn_remove_member": ("SELECT fn_remove_member(%s)", (office.registry.owner,)),
        "fn_confirm_policy": ("SELECT fn_confirm_policy(gen_random_uuid())", ()),
        "fn_connect_begin": (
            "SELECT fn_connect_begin(gen_random_uuid(), NULL, 'x', 'github', NULL, '{}',"
            " '{}', '{}', 'app', NULL, NULL, NULL, NULL, 60)", ()),
        "fn_set_agent_oauth": (
            "SELECT fn_set_agent_oauth(%s, 'https://auth.example.com', 'bot')", (office.bot,)),
    }  # fmt: skip


def test_agent_identity_cannot_call_what_is_a_human_owners(office: Office, db: Database) -> None:
    owner = office.registry.owner
    with db.as_owner(owner) as conn:
        rows = conn.execute(
            "SELECT proname, prosrc, has_function_privilege('authenticated', oid, 'EXECUTE')"
            " AS callable FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
            " AND proname LIKE 'fn\\_%'"
        ).fetchall()
    # The dispatcher role's alone (a policy's decision, migration 0028): no identity calls them.
    assert {r["proname"] for r in rows if not r["callable"]} == {"fn_policy_decide"}
    functions = {row["proname"]: row["prosrc"] for row in rows if row["callable"]}
    # Every owner-only function, including those later migrations add, checks the caller:
    # a human owner (an admin, migration 0025) or a member with the role it needs.
    owner_only = sorted(set(functions) - AGENT_CALLABLE)
    unchecked = [
        name for name in owner_only
        if "require_human_owner" not in functions[name] and "require_role(" not in functions[name]
    ]  # fmt: skip
    assert not unchecked
    calls = _owner_only_calls(office) | {
        name: (sql, params) for name, (sql, params) in LATER_OWNER_ONLY.items() if name in functions
    } | {
        "fn_invoke_tool as another agent": (
            "SELECT fn_invoke_tool(%s, %s, '{}')", (office.other_agent, office.other_tool)),
    }  # fmt: skip
    assert set(owner_only) <= set(calls)
    for door in DOORS:
        for name, (sql, params) in calls.items():
            with (
                pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent"),
                as_agent(db, door, owner, office.bot) as conn,
            ):
                conn.execute(sql, params)
                pytest.fail(f"{name} succeeded for an agent identity through {door}")
    assert office.registry.get_invocation(office.bot_call)["status"] == "pending"


@pytest.mark.parametrize("door", DOORS)
def test_agent_identity_expires_only_its_own_calls(office: Office, db: Database, door: str) -> None:
    registry = office.registry
    registry.update_tool("notes.list", {"requires_approval": True})
    mine = registry.invoke("bot", "notes.create", {})
    theirs = registry.invoke("other", "notes.list", {})
    with db.as_dispatcher() as conn:  # both approval windows closed
        conn.execute(
            "UPDATE agents.tool_invocations SET approval_expires_at = now() - interval '1 s'"
            " WHERE id = ANY(%s)",
            ([mine, theirs],),
        )
    with as_agent(db, door, registry.owner, office.bot) as conn:
        expired = conn.execute("SELECT fn_expire_tool_invocations() AS n").fetchone()
    assert expired is not None and expired["n"] == 1
    assert registry.get_invocation(mine)["status"] == "expired"
    assert registry.get_invocation(theirs)["status"] == "pending"


@pytest.mark.parametrize("door", DOORS)
def test_definer_helpers_tell_an_agent_nothing_of_what_it_is_not_assigned(
    office: Office, db: Database, door: str
) -> None:
    # Helpers that read past row-level security answer an agent identity about another
    # agent's tool as they answer about an unknown id: not whether it exists, is gated or
    # has rules. Its own gated tool it still learns about (the invoke path asks).
    registry = office.registry
    registry.update_tool("notes.list", {"requires_approval": True})
    _owner_sql(
        db, registry.owner,
        "INSERT INTO agents.tool_policies (tool_id, name, action, input_schema)"
        " VALUES (%s, 'rule', 'reject', '{}') RETURNING id", (office.other_tool,),
    )  # fmt: skip
    unknown = UUID(int=1)
    with as_agent(db, door, registry.owner, office.bot) as conn:

        def answer(sql: str, arg: UUID) -> Any:
            row = conn.execute(sql, (arg,)).fetchone()
            assert row is not None
            return row["v"]

        policed = "SELECT agents.tool_policed(%s) AS v"
        assert answer(policed, office.other_tool) == answer(policed, unknown) is None
        assert answer(policed, office.bot_tool) is False  # gated, no rules
        stamp = "SELECT agents.agent_tools_stamp(%s) AS v"
        assert answer(stamp, office.other_agent) == answer(stamp, unknown) is None
        assert answer(stamp, office.bot) is not None
    with db.as_owner(registry.owner) as conn:  # the owner is told
        row = conn.execute(policed, (office.other_tool,)).fetchone()
        assert row is not None and row["v"] is True
