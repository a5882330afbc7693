"""An approval rule approves calls to the tool as it was when the rule was added (migration
0042, docs/approvals.md): a person's approval binds to the request they saw, and a rule is
an approval written in advance, reviewed against the tool's endpoint and template of that
moment. Before, a rule kept approving after the tool's request changed (a re-import that
moved `amount` elsewhere, an endpoint pointed at another API), with nobody seeing it. Once
the tool's request-shaping configuration changes, its approval rules stop deciding until an
admin confirms each; rejection rules keep rejecting (they only ever refuse more)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.errors import PermissionDenied
from toolrelay.registry import Registry
from toolrelay.registry.members import Members
from toolrelay.registry.policies import Policies
from toolrelay.tokens import Caller

PAY: dict[str, Any] = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "channel": {"type": "string"}},
    "required": ["amount", "channel"],
}
SMALL = {"properties": {"amount": {"maximum": 100}}}
GATED = {"egress_class": "write", "requires_approval": True, "http_method": "POST",
         "schema_input": PAY, "endpoint_url": "https://pay.example.com/send"}  # fmt: skip
INPUT = {"amount": 50, "channel": "ops"}


@pytest.fixture
def bot(registry: Registry, db: Database) -> Registry:
    agent_with_tool(registry, key="pay.send", **GATED)
    return Registry(db, registry.owner, agent_id=registry.get_agent("bot")["id"])


def status(registry: Registry, bot: Registry) -> str:
    return str(registry.get_invocation(bot.invoke("bot", "pay.send", INPUT))["status"])


def test_an_approval_rule_stops_when_the_tools_request_changes(
    registry: Registry, db: Database, bot: Registry
) -> None:
    policies = Policies(db)
    rule = policies.add(registry.owner, "pay.send", "small payments", "approve", SMALL)
    assert rule.current and status(registry, bot) == "running"
    registry.update_tool("pay.send", {"description": "words only"})  # shapes no request
    assert policies.list(registry.owner)[0].current and status(registry, bot) == "running"
    registry.update_tool("pay.send", {"endpoint_url": "https://elsewhere.example.com/send"})
    (stale,) = policies.list(registry.owner)
    assert not stale.current
    assert status(registry, bot) == "pending"  # for a person, who sees the new request
    confirmed = policies.confirm(registry.owner, rule.id)
    assert confirmed.current and status(registry, bot) == "running"


def test_rejection_rules_keep_rejecting_after_a_change(
    registry: Registry, db: Database, bot: Registry
) -> None:
    Policies(db).add(registry.owner, "pay.send", "no ops", "reject",
                     {"properties": {"channel": {"const": "ops"}}})  # fmt: skip
    registry.update_tool("pay.send", {"endpoint_url": "https://elsewhere.example.com/send"})
    assert status(registry, bot) == "rejected"


def test_a_stale_rule_cannot_decide_even_by_sql(
    registry: Registry, db: Database, bot: Registry
) -> None:
    rule = Policies(db).add(registry.owner, "pay.send", "small payments", "approve", SMALL)
    registry.update_tool("pay.send", {"endpoint_url": "https://elsewhere.example.com/send"})
    call = bot.invoke("bot", "pay.send", INPUT)
    with (
        pytest.raises(psycopg.Error, match="changed since"),
        db.as_dispatcher() as conn,
    ):
        conn.execute("SELECT fn_policy_decide(%s, %s, %s)", (call, rule.id, "a" * 64))
    assert registry.get_invocation(call)["status"] == "pending"


def test_only_an_admin_confirms_a_rule(registry: Registry, db: Database, bot: Registry) -> None:
    rule = Policies(db).add(registry.owner, "pay.send", "small payments", "approve", SMALL)
    approver = Members(db).add(registry.owner, "ann", "approver").id
    registry.update_tool("pay.send", {"endpoint_url": "https://elsewhere.example.com/send"})
    with pytest.raises(PermissionDenied):
        Policies(db).confirm(Caller(owner=registry.owner, member_id=approver), rule.id)
    assert not Policies(db).list(registry.owner)[0].current


def test_a_migration_that_changes_every_fingerprint_carries_current_rules_over(
    registry: Registry, db: Database, bot: Registry, database_url: str
) -> None:
    """A migration adding a column to tools_registry changes every tool's fingerprint and no
    request: the rules that were current stay current (migrate's refresh carries them), a
    stale one stays stale."""
    policies = Policies(db)
    current = policies.add(registry.owner, "pay.send", "small payments", "approve", SMALL)
    stale = policies.add(registry.owner, "pay.send", "reviewed long ago", "approve", SMALL)
    tool_id = registry.get_tool("pay.send")["id"]
    with psycopg.connect(database_url, autocommit=True) as admin:  # as the formula changed
        admin.execute("UPDATE agents.tool_fingerprints SET fingerprint = 'before' WHERE tool_id = %s",
                      (tool_id,))  # fmt: skip
        admin.execute("UPDATE agents.tool_policies SET tool_fingerprint = 'before' WHERE id = %s",
                      (current.id,))  # fmt: skip
        admin.execute("UPDATE agents.tool_policies SET tool_fingerprint = 'older' WHERE id = %s",
                      (stale.id,))  # fmt: skip
        admin.execute("UPDATE agents.policy_confirmations SET tool_fingerprint = 'before'"
                      " WHERE policy_id = %s", (current.id,))  # fmt: skip
        admin.execute("UPDATE agents.policy_confirmations SET tool_fingerprint = 'older'"
                      " WHERE policy_id = %s", (stale.id,))  # fmt: skip
        admin.execute("SELECT agents.refresh_tool_fingerprints()")
    kept = {p.name: (p.current, p.in_force) for p in policies.list(registry.owner)}
    assert kept == {"small payments": (True, True), "reviewed long ago": (False, False)}
    assert status(registry, bot) == "running"


# Separation of duties for rules (migration 0043): a rule approves calls, so the tool's last
# editor does not add or confirm its approval rules where another admin could.


def test_the_tools_last_editor_does_not_write_its_approval_rules(
    registry: Registry, db: Database
) -> None:
    members = Members(db)
    alice, bob = (members.add(registry.owner, name, "admin").id for name in ("alice", "bob"))
    as_alice, as_bob = (Caller(owner=registry.owner, member_id=m) for m in (alice, bob))
    agent_with_tool(Registry(db, registry.owner, member_id=alice), key="pay.send", **GATED)
    policies = Policies(db)
    with pytest.raises(PermissionDenied, match="you changed this tool last"):
        policies.add(as_alice, "pay.send", "small payments", "approve", SMALL)
    with pytest.raises(PermissionDenied, match="tenant's own token"):
        policies.add(registry.owner, "pay.send", "small payments", "approve", SMALL)
    policies.add(
        as_alice, "pay.send", "no ceo", "reject", {"properties": {"channel": {"const": "ceo"}}}
    )
    rule = policies.add(as_bob, "pay.send", "small payments", "approve", SMALL)
    Registry(db, registry.owner, member_id=alice).update_tool(
        "pay.send", {"endpoint_url": "https://elsewhere.example.com/send"}
    )
    with pytest.raises(PermissionDenied, match="you changed this tool last"):
        policies.confirm(as_alice, rule.id)
    assert policies.confirm(as_bob, rule.id).current


def test_a_tool_changed_with_the_tenant_token_takes_a_named_admin_for_its_rules(
    registry: Registry, db: Database
) -> None:
    members = Members(db)
    alice, _bob = (members.add(registry.owner, name, "admin").id for name in ("alice", "bob"))
    agent_with_tool(registry, key="pay.send", **GATED)  # made with the tenant's own token
    with pytest.raises(PermissionDenied, match="may have changed this tool"):
        Policies(db).add(Caller(owner=registry.owner, member_id=alice), "pay.send", "s",
                         "approve", SMALL)  # fmt: skip


def test_a_sole_admin_still_writes_rules(registry: Registry, db: Database, bot: Registry) -> None:
    """Nobody else could: a tenant alone, or with approvers only, works as before."""
    Members(db).add(registry.owner, "ann", "approver")
    rule = Policies(db).add(registry.owner, "pay.send", "small payments", "approve", SMALL)
    assert rule.current and status(registry, bot) == "running"
