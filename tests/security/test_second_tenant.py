"""A second tenant names the first's ids: every function that takes one answers "not found".

Tenant B is an admin of its own tenant with SQL access (role authenticated, its own claims,
as PostgREST gives it). It knows tenant A's ids (they are in URLs, logs, screenshots) and
calls every ``public.fn_*`` and every definer helper an owner may execute with them: assign
A's tool to its agent, bind its agent to A's... approve A's call, take over A's member,
revoke A's token, confirm A's policy, redeliver A's webhook, reconnect A's credential, bind
a tool of its own to A's credential. Each is refused as an unknown id, the error names none
of A's objects, and A's configuration, members, tokens and pending call are as they were.
A function added later that takes a uuid must be added here (the first test says so).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import pytest

from tests.credentials.conftest import make_keyring
from tests.registry.helpers import add_tool
from toolrelay.db import Database
from toolrelay.db.connect import Row
from toolrelay.notify.subscriptions import Webhooks
from toolrelay.registry import Registry

# A's names: none of them may appear in what B is told.
A_NAMES = ("alpha-tool", "alpha-bot", "Alpha Approver", "alpha-key", "alpha-rule", "alpha.example")


@dataclass(frozen=True)
class TenantA:
    registry: Registry
    agent: UUID
    tool: UUID
    call: UUID
    credential: UUID  # oauth: what a reconnect names
    member: UUID
    token: UUID
    policy: UUID
    delivery: UUID


def _one(db: Database, owner: UUID, sql: str, params: Any = None) -> Row:
    with db.as_owner(owner) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row


@pytest.fixture
def tenant_a(make_registry: Callable[[], Registry], db: Database) -> TenantA:
    a = make_registry()
    Webhooks(db, str(a.owner), make_keyring("k")).add("https://hooks.alpha.example/in", ["pending"])
    tool = add_tool(a, "alpha-tool", http_method="POST", egress_class="write")
    agent = a.create_agent("alpha-bot")
    a.assign("alpha-bot", "alpha-tool")
    call = a.invoke("alpha-bot", "alpha-tool", {"text": "hi"})
    credential = _one(
        db, a.owner,
        "INSERT INTO agents.credentials (name, kind, allowed_hosts, key_id, wrapped_key, nonce,"
        " ciphertext) VALUES ('alpha-key', 'oauth', '{api.alpha.example}', 'k', '\\x00', '\\x00',"
        " '\\x00') RETURNING id",
    )["id"]  # fmt: skip
    member = _one(db, a.owner, "SELECT fn_add_member('Alpha Approver', 'approver') AS id")["id"]
    token = _one(db, a.owner, "SELECT fn_create_api_token(%s, %s) AS id", (os.urandom(32), agent))
    policy = _one(
        db, a.owner,
        "INSERT INTO agents.tool_policies (owner, tool_id, name, action, input_schema)"
        " VALUES (%s, %s, 'alpha-rule', 'reject', '{}') RETURNING id", (a.owner, tool["id"]),
    )["id"]  # fmt: skip
    with db.as_dispatcher() as conn:
        delivery = conn.execute(
            "SELECT id FROM agents.webhook_deliveries WHERE owner = %s", (a.owner,)
        ).fetchone()
    assert delivery is not None
    return TenantA(a, agent, tool["id"], call, credential, member, token["id"], policy,
                   delivery["id"])  # fmt: skip


def _calls(a: TenantA, b_agent: UUID, b_tool: UUID) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """B's attempts, by function, each with A's ids."""
    return {
        "fn_assign_tool": ("SELECT fn_assign_tool(%s, %s)", (b_agent, a.tool)),
        "fn_assign_tool (A's agent)": ("SELECT fn_assign_tool(%s, %s)", (a.agent, b_tool)),
        "fn_revoke_tool": ("SELECT fn_revoke_tool(%s, %s)", (a.agent, a.tool)),
        "fn_invoke_tool": ("SELECT fn_invoke_tool(%s, %s, '{}')", (a.agent, a.tool)),
        "fn_approve_tool_invocation": ("SELECT fn_approve_tool_invocation(%s)", (a.call,)),
        "fn_reject_tool_invocation": ("SELECT fn_reject_tool_invocation(%s)", (a.call,)),
        "fn_retry_tool_invocation": ("SELECT fn_retry_tool_invocation(%s)", (a.call,)),
        "fn_create_api_token": (
            "SELECT fn_create_api_token(%s, %s)", (os.urandom(32), a.agent)),
        "fn_create_api_token (A's member)": (
            "SELECT fn_create_api_token(%s, NULL, 'x', NULL, %s)", (os.urandom(32), a.member)),
        "fn_revoke_api_token": ("SELECT fn_revoke_api_token(%s)", (a.token,)),
        "fn_set_member_role": ("SELECT fn_set_member_role(%s, 'admin')", (a.member,)),
        "fn_set_member_email": (
            "SELECT fn_set_member_email(%s, 'mallory@b.example')", (a.member,)),
        "fn_remove_member": ("SELECT fn_remove_member(%s)", (a.member,)),
        "fn_set_member_role (A itself)": (
            "SELECT fn_set_member_role(%s, 'viewer')", (a.registry.owner,)),
        "fn_confirm_policy": ("SELECT fn_confirm_policy(%s)", (a.policy,)),
        "fn_webhook_redeliver": ("SELECT fn_webhook_redeliver(%s)", (a.delivery,)),
        "fn_connect_begin": (
            "SELECT fn_connect_begin(gen_random_uuid(), %s, 'x', 'github', NULL, '{}', '{}',"
            " '{}', 'app', NULL, NULL, NULL, NULL, 60)", (a.credential,)),
        "fn_set_agent_oauth": (
            "SELECT fn_set_agent_oauth(%s, 'https://auth.b.example', 'mallory')", (a.agent,)),
        "fn_register_tool": (
            "SELECT fn_register_tool(p_key => 'b.tool', p_name => 'b', p_auth_method => 'oauth',"
            " p_endpoint_url => 'https://api.alpha.example/x', p_credential_ref => %s)",
            (a.credential,)),
    }  # fmt: skip


def test_every_function_taking_an_id_refuses_another_tenants(
    tenant_a: TenantA, make_registry: Callable[[], Registry], db: Database
) -> None:
    a = tenant_a
    b = make_registry()
    b_tool = add_tool(b, "b.own")["id"]
    b_agent = b.create_agent("b-bot")
    with db.as_owner(b.owner) as conn:
        functions = conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
            " AND proname LIKE 'fn\\_%' AND 'uuid'::regtype = ANY (proargtypes)"
            " AND has_function_privilege('authenticated', oid, 'EXECUTE')"
        ).fetchall()
    calls = _calls(a, b_agent, b_tool)
    named = {name.split(" ")[0] for name in calls}
    assert {f["proname"] for f in functions} <= named, "a new fn_* taking an id: add it here"
    before = _state(db, a)

    for name, (sql, params) in calls.items():
        with (
            pytest.raises((psycopg.errors.NoDataFound, psycopg.errors.ForeignKeyViolation)) as err,
            db.as_owner(b.owner) as conn,
        ):
            conn.execute(sql, params)
            pytest.fail(f"{name} succeeded for another tenant")
        told = str(err.value) + str(err.value.diag.message_detail or "")
        assert "not found" in told, (name, told)
        assert not any(word in told for word in A_NAMES), (name, told)

    assert _state(db, a) == before
    call = a.registry.get_invocation(a.call)
    assert (call["status"], call["approval_status"]) == ("pending", "pending")


def test_definer_helpers_tell_another_tenant_nothing(
    tenant_a: TenantA, make_registry: Callable[[], Registry], db: Database
) -> None:
    # Helpers an owner may execute that read past row-level security: A's ids answer as an
    # unknown id does, never A's tools version, gating or schema.
    a, b = tenant_a, make_registry()
    unknown = UUID(int=1)
    with db.as_owner(b.owner) as conn:
        for sql in (
            "SELECT agents.agent_tools_stamp(%s) AS v",
            "SELECT agents.tool_policed(%s) AS v",
        ):
            mine = conn.execute(sql, (unknown,)).fetchone()
            theirs = conn.execute(sql, (a.agent if "stamp" in sql else a.tool,)).fetchone()
            assert mine == theirs, sql
        standing = "SELECT * FROM agents.policy_standing(%s)"
        mine = conn.execute(standing, (unknown,)).fetchone()
        assert conn.execute(standing, (a.policy,)).fetchone() == mine
        assert mine == {"confirmations": None, "needed": None, "in_force": None}
        seen = conn.execute(
            "SELECT agents.invoke_seen(%s, NULL, %s, '{}', NULL, 'x') AS v", (a.agent, a.tool)
        ).fetchone()
        assert seen == {"v": None}
        for table in ("tool_policies", "members", "webhook_deliveries", "invocation_approvals",
                      "config_audit", "api_tokens", "credential_connections",
                      "policy_confirmations"):  # fmt: skip
            rows = conn.execute(f"SELECT owner FROM agents.{table}").fetchall()
            assert all(row["owner"] == b.owner for row in rows), table


_TABLES = ("agents", "tools_registry", "tool_assignments", "members", "tool_policies",
           "webhook_deliveries", "invocation_approvals", "connect_flows")  # fmt: skip


def _state(db: Database, a: TenantA) -> dict[str, list[Row]]:
    owner = a.registry.owner
    with db.as_dispatcher() as conn:
        state = {
            table: conn.execute(
                f"SELECT * FROM agents.{table} WHERE owner = %s ORDER BY 1, 2", (owner,)
            ).fetchall()
            for table in _TABLES
        }
        state["api_tokens"] = conn.execute(
            "SELECT id, agent_id, member_id, revoked_at FROM agents.api_tokens"
            " WHERE owner = %s ORDER BY id",
            (owner,),
        ).fetchall()
        state["credentials"] = conn.execute(
            "SELECT id, name, allowed_hosts, status FROM agents.credentials"
            " WHERE owner = %s ORDER BY id",
            (owner,),
        ).fetchall()
    return state
