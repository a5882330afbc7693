"""Reading a tenant's rows takes a caller who is one of its members now (migration 0056).

Every function refused a caller who is not a member (``require_role``), but row-level
security read only ``sub`` and ``agent_id``: with the tenant's ``sub`` and a removed
member's id, another tenant's member's id, a made-up id, or no member id at all once the
tenant's own member row was removed, a plain SELECT returned the whole tenant. And the
tenant's own token (no member, no agent) still authenticated after that removal.

Also here: an agent identity invoking a tool of its tenant that it is not assigned is told
what it is told of an unknown id, not the tool's key and status; and ``policy_standing``
answers a caller without ``sub`` only when it is the dispatcher.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import pytest

from tests.credentials.conftest import make_keyring
from tests.registry.helpers import add_tool
from toolrelay.db import Database
from toolrelay.db.connect import Row, Trips
from toolrelay.errors import NotAssigned
from toolrelay.notify.subscriptions import Webhooks
from toolrelay.registry import Registry


@dataclass(frozen=True)
class Team:
    registry: Registry
    bot: UUID
    bot_tool: UUID  # a gated write, assigned to the bot
    other_tool: UUID  # assigned to nobody
    call: UUID  # the bot's, pending
    policy: UUID
    approver: UUID  # a current member
    admin: UUID  # a current member, who removed the others
    removed: UUID  # a removed member
    outsider: UUID  # a member of another tenant
    # The hashes of tokens (what is stored): the tenant's own (no member, no agent), made
    # before the removal; Ada's; the bot's.
    tenant_token: bytes
    admin_token: bytes
    agent_token: bytes


def _one(db: Database, owner: UUID, sql: str, params: Any = None, **claims: Any) -> Row:
    with db.as_owner(owner, **claims) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row


@pytest.fixture
def team(make_registry: Callable[[], Registry], db: Database) -> Team:
    reg = make_registry()
    owner = reg.owner
    Webhooks(db, str(owner), make_keyring("k")).add("https://hooks.example.com/in", ["pending"])
    bot_tool = add_tool(reg, "notes.create", http_method="POST", egress_class="write")["id"]
    other_tool = add_tool(reg, "notes.list")["id"]
    bot = reg.create_agent("bot")
    reg.assign("bot", "notes.create")
    call = reg.invoke("bot", "notes.create", {"text": "hi"})
    _one(
        db, owner,
        "INSERT INTO agents.credentials (name, kind, allowed_hosts, key_id, wrapped_key, nonce,"
        " ciphertext) VALUES ('notes-key', 'api_key', '{api.example.com}', 'k', '\\x00',"
        " '\\x00', '\\x00') RETURNING id",
    )  # fmt: skip
    policy = _one(
        db, owner,
        "INSERT INTO agents.tool_policies (tool_id, name, action, input_schema)"
        " VALUES (%s, 'rule', 'reject', '{}') RETURNING id", (other_tool,),
    )["id"]  # fmt: skip
    tenant_token, admin_token, agent_token = os.urandom(32), os.urandom(32), os.urandom(32)
    _one(db, owner, "SELECT fn_create_api_token(%s) AS id", (tenant_token,))
    _one(db, owner, "SELECT fn_create_api_token(%s, %s) AS id", (agent_token, bot))

    def add(name: str, role: str) -> UUID:
        return UUID(str(_one(db, owner, "SELECT fn_add_member(%s, %s) AS id", (name, role))["id"]))

    approver, admin, removed = add("Ann", "approver"), add("Ada", "admin"), add("Rob", "viewer")
    _one(
        db, owner, "SELECT fn_create_api_token(%s, NULL, 'ada', NULL, %s) AS id",
        (admin_token, admin),
    )  # fmt: skip
    # Ada removes Rob, then the tenant's own member row.
    for member in (removed, owner):
        assert _one(db, owner, "SELECT fn_remove_member(%s) AS r", (member,), member_id=admin)["r"]
    other = make_registry()
    outsider = UUID(str(_one(db, other.owner, "SELECT fn_add_member('Oz', 'admin') AS id")["id"]))
    return Team(
        reg, bot, bot_tool, other_tool, call, policy, approver, admin, removed, outsider,
        tenant_token, admin_token, agent_token,
    )  # fmt: skip


def _policed_tables(db: Database) -> list[str]:
    """Every table of schema agents with a policy letting role authenticated read it."""
    with db.as_dispatcher() as conn:
        rows = conn.execute(
            "SELECT DISTINCT tablename FROM pg_policies WHERE schemaname = 'agents'"
            " AND 'authenticated' = ANY (roles) AND cmd IN ('SELECT', 'ALL') ORDER BY 1"
        ).fetchall()
    return [row["tablename"] for row in rows]


def _counts(db: Database, owner: UUID, tables: list[str], **claims: Any) -> dict[str, int]:
    counts = {}
    with db.as_owner(owner, **claims) as conn:
        for table in tables:
            row = conn.execute(f"SELECT count(*) AS n FROM agents.{table}").fetchone()
            assert row is not None
            counts[table] = int(row["n"])
    return counts


def test_every_read_policy_asks_for_a_member(db: Database) -> None:
    tables = _policed_tables(db)
    assert {"tools_registry", "agents", "tool_invocations", "members", "api_tokens",
            "credentials", "tool_policies"} <= set(tables)  # fmt: skip
    with db.as_dispatcher() as conn:
        rows = conn.execute(
            "SELECT tablename, policyname, qual FROM pg_policies WHERE schemaname = 'agents'"
            " AND 'authenticated' = ANY (roles) AND cmd IN ('SELECT', 'ALL')"
        ).fetchall()
    unasked = [r["policyname"] for r in rows if "caller_member_role()" not in r["qual"]]
    assert not unasked


def test_a_caller_who_is_not_a_member_reads_nothing(team: Team, db: Database) -> None:
    owner = team.registry.owner
    tables = _policed_tables(db)
    # A current member reads its tenant (the tables an approver may read have rows).
    ann = _counts(db, owner, tables, member_id=team.approver)
    for table in ("tools_registry", "agents", "tool_assignments", "tool_invocations", "members",
                  "api_tokens", "credentials", "tool_policies", "webhook_deliveries"):  # fmt: skip
        assert ann[table] > 0, table
    assert (ann["tools_registry"], ann["members"]) == (2, 4)  # the tenant, Ann, Ada, Rob
    ada = _counts(db, owner, tables, member_id=team.admin)
    assert ada["config_audit"] > 0 and ada["webhook_subscriptions"] == 1
    nothing = dict.fromkeys(tables, 0)
    callers = {
        "a removed member": {"member_id": team.removed},
        "another tenant's member": {"member_id": team.outsider},
        "a made-up member": {"member_id": uuid.uuid4()},
        "the tenant, its member row removed": {},
    }
    for name, claims in callers.items():
        assert _counts(db, owner, tables, **claims) == nothing, name
    # The agent identity reads what it read before: itself, its tool, its call.
    with db.as_owner(owner, agent_id=team.bot) as conn:

        def ids(sql: str) -> set[UUID]:
            return {row["id"] for row in conn.execute(sql).fetchall()}

        assert ids("SELECT id FROM agents.agents") == {team.bot}
        assert ids("SELECT id FROM agents.tools_registry") == {team.bot_tool}
        assert ids("SELECT tool_id AS id FROM agents.tool_assignments") == {team.bot_tool}
        assert ids("SELECT id FROM agents.tool_invocations") == {team.call}
        assert ids("SELECT id FROM agents.members") == set()


def test_who_the_caller_is(team: Team, db: Database, make_registry: Callable[[], Registry]) -> None:
    owner = team.registry.owner
    role = "SELECT agents.caller_member_role() AS r"
    assert _one(db, owner, role, agent_id=team.bot)["r"] == "agent"
    assert _one(db, owner, role, member_id=team.approver)["r"] == "approver"
    assert _one(db, owner, role, member_id=team.admin)["r"] == "admin"
    for claims in ({"member_id": team.removed}, {"member_id": team.outsider},
                   {"member_id": uuid.uuid4()}, {}):  # fmt: skip
        assert _one(db, owner, role, **claims)["r"] is None, claims
    alone = make_registry()  # a tenant with no members yet is its own admin
    assert _one(db, alone.owner, role)["r"] == "admin"
    assert _one(db, alone.owner, role, member_id=uuid.uuid4())["r"] is None


def _authenticates(db: Database, token: bytes) -> bool:
    with db.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM agents.authenticate_token(%s)", (token,)
        ).fetchone()
    assert row is not None
    return bool(row["n"])


def test_removing_the_tenants_row_revokes_its_own_tokens(team: Team, db: Database) -> None:
    owner = team.registry.owner
    with db.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT revoked_at FROM agents.api_tokens WHERE token_hash = %s",
            (team.tenant_token,),
        ).fetchone()
    assert row is not None and row["revoked_at"] is not None
    assert not _authenticates(db, team.tenant_token)
    # One made afterwards (an admin may) does not authenticate either while the row is removed.
    later = os.urandom(32)
    _one(db, owner, "SELECT fn_create_api_token(%s) AS id", (later,), member_id=team.admin)
    assert not _authenticates(db, later)
    # The admin's own token and the agent's are untouched.
    assert _authenticates(db, team.admin_token)
    assert _authenticates(db, team.agent_token)


# F2: an agent invoking a tool of its tenant it is not assigned -----------------------------


def _refusal(conn: psycopg.Connection[Row], sql: str, params: Any) -> tuple[str | None, str]:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(sql, params)
    conn.rollback()
    return err.value.sqlstate, str(err.value.diag.message_primary)


INVOKES = {
    "fn_invoke_tool": "SELECT fn_invoke_tool(%(agent)s, %(tool)s, '{}')",
    "invoke_seen": "SELECT agents.invoke_seen(%(agent)s, NULL, %(tool)s, '{}', NULL, NULL)",
}


@pytest.mark.parametrize("status", ["active", "disabled"])
@pytest.mark.parametrize("function", sorted(INVOKES))
def test_an_agent_is_told_nothing_of_a_tool_it_is_not_assigned(
    registry: Registry, db: Database, function: str, status: str
) -> None:
    mine = add_tool(registry, "notes.create")["id"]
    theirs = add_tool(registry, "notes.list")["id"]
    registry.set_tool_status("notes.list", status)
    bot = registry.create_agent("bot")
    registry.assign("bot", "notes.create")
    unknown = uuid.uuid4()
    sql = INVOKES[function]

    @contextmanager
    def as_bot() -> Iterator[psycopg.Connection[Row]]:
        with db.as_owner(registry.owner, agent_id=bot) as conn:
            yield conn

    with as_bot() as conn:
        told = _refusal(conn, sql, {"agent": bot, "tool": theirs})
    with as_bot() as conn:
        expected = _refusal(conn, sql, {"agent": bot, "tool": unknown})
    assert told == (expected[0], expected[1].replace(str(unknown), str(theirs)))
    assert told == ("P0002", f"tool {theirs} not found")
    with as_bot() as conn:  # its own tool it still calls
        assert conn.execute(sql, {"agent": bot, "tool": mine}).fetchone() is not None
    # The owner is still told which tool and why.
    with db.as_owner(registry.owner) as conn:
        state, message = _refusal(conn, sql, {"agent": bot, "tool": theirs})
    assert "notes.list" in message and state in {"TR001", "TR002"}


# F3: policy_standing without a sub -----------------------------------------------------------


def test_policy_standing_answers_no_one_without_a_sub_but_the_dispatcher(
    team: Team, db: Database
) -> None:
    standing = "SELECT * FROM agents.policy_standing(%s)"
    nulls = {"confirmations": None, "needed": None, "in_force": None}
    with db.connect() as conn:  # role authenticated, claims without sub
        conn.execute("SELECT set_config('role', 'authenticated', true)")
        conn.execute(
            "SELECT set_config('request.jwt.claims', %s, true)",
            (json.dumps({"role": "authenticated"}),),
        )
        assert conn.execute(standing, (team.policy,)).fetchone() == nulls
    with db.as_owner(team.registry.owner, member_id=team.removed) as conn:
        assert conn.execute(standing, (team.policy,)).fetchone() == nulls
    with db.as_dispatcher() as conn:  # the dispatcher applies rules (registry/policies.py)
        row = conn.execute(standing, (team.policy,)).fetchone()
        assert row is not None and row["in_force"] is True
    with db.as_owner(team.registry.owner, member_id=team.approver) as conn:
        row = conn.execute(standing, (team.policy,)).fetchone()
        assert row is not None and row["in_force"] is True


@pytest.mark.parametrize("door", ["invoke", "call"])
def test_an_assignment_revoked_after_the_lookup_is_still_not_assigned(
    registry: Registry, db: Database, monkeypatch: pytest.MonkeyPatch, door: str
) -> None:
    # The insert after the lookup now refuses the tool as an unknown id (P0002); the agent
    # still hears what it heard before: 403 not_assigned, in the lookup's words.
    add_tool(registry, "notes.list")
    bot = registry.create_agent("bot")
    registry.assign("bot", "notes.list")
    trips: list[int] = []
    run = Trips.run

    def revoke_before_the_insert(self: Trips, *args: Any, **kwargs: Any) -> Any:
        trips.append(1)
        if len(trips) == 2:
            registry.revoke("bot", "notes.list")
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Trips, "run", revoke_before_the_insert)
    agent = Registry(db, registry.owner, agent_id=bot)
    with pytest.raises(NotAssigned, match="tool notes.list is not assigned to this agent"):
        if door == "invoke":
            agent.invoke("bot", "notes.list", {})
        else:
            agent.call("notes.list", {})
    assert len(trips) == 2


def test_definer_helpers_tell_a_non_member_nothing(team: Team, db: Database) -> None:
    """The helpers that read past row-level security answer a caller who is not a member
    as they answer about an unknown id: not whether a tool is gated and has rules, not an
    agent's tools version."""
    owner = team.registry.owner
    _one(
        db, owner, "UPDATE agents.tools_registry SET requires_approval = true WHERE id = %s"
        " RETURNING id", (team.other_tool,), member_id=team.admin,
    )  # fmt: skip
    unknown = UUID(int=1)
    asked = {
        "SELECT agents.tool_policed(%s) AS v": team.other_tool,
        "SELECT agents.agent_tools_stamp(%s) AS v": team.bot,
    }
    for sql, arg in asked.items():
        assert _one(db, owner, sql, (arg,), member_id=team.admin)["v"] is not None, sql
        for claims in ({"member_id": team.removed}, {"member_id": team.outsider}, {}):
            told = _one(db, owner, sql, (arg,), **claims)["v"]
            assert told == _one(db, owner, sql, (unknown,), **claims)["v"] is None, (sql, claims)
