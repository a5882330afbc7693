"""An approval rule takes as many people as the calls it decides (migration 0048,
docs/approvals.md): a rule is an approval given in advance, so on a tool whose calls need
two approvers it decides nothing until two admins have confirmed it for the tool as it is.
Before, one admin's rule approved a dangerous tool's calls alone, the quorum unmet. And the
tool's editor is never a rule's only confirmer where someone else could be, at the moment
the rule decides too (0043 checked only when the rule was written)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import psycopg
import pytest

from tests.registry.helpers import agent_with_tool
from tests.registry.test_policy_binding import GATED, INPUT, SMALL
from toolrelay.db import Database
from toolrelay.registry import Registry
from toolrelay.registry.members import Members
from toolrelay.registry.policies import Policies, Policy, apply_policies
from toolrelay.tokens import Caller


class Team:
    """Carol made the tool; Alice and Bob are the other admins."""

    def __init__(self, registry: Registry, db: Database, **tool: Any) -> None:
        members = Members(db)
        ids = {n: members.add(registry.owner, n, "admin").id for n in ("carol", "alice", "bob")}
        self.owner = registry.owner
        self.registry = registry
        self.carol = Registry(db, registry.owner, member_id=ids["carol"])
        self.alice = Caller(owner=registry.owner, member_id=ids["alice"])
        self.bob = Caller(owner=registry.owner, member_id=ids["bob"])
        self.as_alice = Registry(db, registry.owner, member_id=ids["alice"])
        agent_with_tool(self.carol, key="pay.send", **(GATED | tool))
        self.bot = Registry(db, registry.owner, agent_id=registry.get_agent("bot")["id"])
        self.policies = Policies(db)

    def call(self) -> UUID:
        return self.bot.invoke("bot", "pay.send", INPUT)

    def status(self, call: UUID) -> str:
        return str(self.registry.get_invocation(call)["status"])

    def rule(self, rule_id: UUID) -> Policy:
        (found,) = [p for p in self.policies.list(self.owner) if p.id == rule_id]
        return found


def test_a_rule_on_a_dangerous_tool_takes_two_admins(registry: Registry, db: Database) -> None:
    team = Team(registry, db, is_dangerous=True)
    rule = team.policies.add(team.alice, "pay.send", "small payments", "approve", SMALL)
    assert (rule.confirmations, rule.confirmations_needed, rule.in_force) == (1, 2, False)
    call = team.call()
    assert team.status(call) == "pending"  # one admin's rule is one approval of two
    again = team.policies.confirm(team.alice, rule.id)
    assert (again.confirmations, again.in_force) == (1, False)  # the same person once
    confirmed = team.policies.confirm(team.bob, rule.id)
    assert (confirmed.confirmations, confirmed.in_force) == (2, True)
    with db.as_owner(team.owner) as conn:  # who confirmed is in the audit log
        confirmers = conn.execute(
            "SELECT actor_member FROM agents.config_audit WHERE kind = 'policy_confirmation'"
            " AND action = 'insert' ORDER BY id"
        ).fetchall()
    assert [r["actor_member"] for r in confirmers] == [team.alice.member_id, team.bob.member_id]
    decided = team.registry.get_invocation(team.call())
    assert (decided["status"], decided["decided_by_policy"]) == ("running", rule.id)


def test_an_explicit_quorum_counts_for_rules_too(registry: Registry, db: Database) -> None:
    team = Team(registry, db, approvals_required=2)
    rule = team.policies.add(team.alice, "pay.send", "small payments", "approve", SMALL)
    assert team.status(team.call()) == "pending"
    team.policies.confirm(team.bob, rule.id)
    assert team.status(team.call()) == "running"


def test_confirmations_of_an_older_request_do_not_count(registry: Registry, db: Database) -> None:
    team = Team(registry, db, is_dangerous=True)
    rule = team.policies.add(team.alice, "pay.send", "small payments", "approve", SMALL)
    team.policies.confirm(team.bob, rule.id)
    team.carol.update_tool("pay.send", {"endpoint_url": "https://elsewhere.example.com/send"})
    assert team.rule(rule.id).confirmations == 0
    assert team.policies.confirm(team.alice, rule.id).confirmations == 1  # Bob saw the old one
    assert team.status(team.call()) == "pending"
    assert team.policies.confirm(team.bob, rule.id).in_force
    assert team.status(team.call()) == "running"


def test_an_underconfirmed_rule_cannot_decide_even_by_sql(registry: Registry, db: Database) -> None:
    team = Team(registry, db, is_dangerous=True)
    rule = team.policies.add(team.alice, "pay.send", "small payments", "approve", SMALL)
    call = team.call()
    with (
        pytest.raises(psycopg.Error, match="needs 2 admins"),
        db.as_dispatcher() as conn,
    ):
        conn.execute("SELECT fn_policy_decide(%s, %s, %s)", (call, rule.id, "a" * 64))
    assert team.status(call) == "pending"


def test_a_rule_confirmed_only_by_the_tools_new_editor_waits(
    registry: Registry, db: Database
) -> None:
    """Alice's rule is in force; Alice then changes how the tool is gated (not its request,
    so the rule stays bound). She is now its editor: her rule alone no longer decides."""
    team = Team(registry, db)
    rule = team.policies.add(team.alice, "pay.send", "small payments", "approve", SMALL)
    assert team.status(team.call()) == "running"
    team.as_alice.update_tool("pay.send", {"approval_ttl_seconds": 600})
    assert not team.rule(rule.id).in_force
    assert team.status(team.call()) == "pending"
    team.policies.confirm(team.bob, rule.id)
    assert team.status(team.call()) == "running"


def test_rejection_rules_need_no_confirmations(registry: Registry, db: Database) -> None:
    team = Team(registry, db, is_dangerous=True)
    rule = team.policies.add(team.alice, "pay.send", "no ops", "reject",
                             {"properties": {"channel": {"const": "ops"}}})  # fmt: skip
    assert rule.in_force
    assert team.status(team.call()) == "rejected"


def test_a_tenant_alone_still_writes_rules_that_decide(registry: Registry, db: Database) -> None:
    agent_with_tool(registry, key="pay.send", is_dangerous=True, **GATED)
    bot = Registry(db, registry.owner, agent_id=registry.get_agent("bot")["id"])
    rule = Policies(db).add(registry.owner, "pay.send", "small payments", "approve", SMALL)
    assert (rule.confirmations, rule.confirmations_needed, rule.in_force) == (1, 1, True)
    assert registry.get_invocation(bot.invoke("bot", "pay.send", INPUT))["status"] == "running"


@pytest.mark.parametrize("leaves", ["removed", "demoted"])
def test_a_confirmation_counts_while_its_admin_is_one(
    registry: Registry, db: Database, leaves: str
) -> None:
    """A rule stands for as long as its tool; the second admin who confirmed it may leave,
    or stop being an admin. Then the rule has one admin behind it, and waits for another."""
    team = Team(registry, db, is_dangerous=True)
    rule = team.policies.add(team.alice, "pay.send", "small payments", "approve", SMALL)
    team.policies.confirm(team.bob, rule.id)
    assert team.status(team.call()) == "running"
    members = Members(db)
    assert team.bob.member_id is not None
    if leaves == "removed":
        members.remove(registry.owner, team.bob.member_id)
    else:
        members.set_role(registry.owner, team.bob.member_id, "approver")
    standing = team.rule(rule.id)
    assert (standing.confirmations, standing.in_force) == (1, False)
    assert team.status(team.call()) == "pending"


def test_an_agent_reads_nothing_of_a_rule(registry: Registry, db: Database) -> None:
    team = Team(registry, db, is_dangerous=True)
    rule = team.policies.add(team.alice, "pay.send", "small payments", "approve", SMALL)
    bot = registry.get_agent("bot")["id"]
    with db.as_owner(team.owner, agent_id=bot) as conn:
        seen = conn.execute("SELECT * FROM agents.policy_standing(%s)", (rule.id,)).fetchone()
        confirmations = conn.execute("SELECT count(*) AS n FROM agents.policy_confirmations")
        assert confirmations.fetchone() == {"n": 0}
    assert seen == {"confirmations": None, "needed": None, "in_force": None}


def test_a_rule_that_stops_counting_while_it_decides_leaves_the_call_to_a_person(
    registry: Registry, db: Database, database_url: str
) -> None:
    # apply_policies reads which rules are in force, then asks fn_policy_decide, which
    # checks again under the call's row lock. Bob's removal landing between the two made
    # that check refuse (TR003), and the refusal went up into the agent's invoke as an
    # error about a call it had just made and that was stored, pending.
    team = Team(registry, db, is_dangerous=True)
    rule = team.policies.add(team.alice, "pay.send", "small payments", "approve", SMALL)
    call = team.call()  # pending: the rule has one admin of two
    team.policies.confirm(team.bob, rule.id)
    assert team.rule(rule.id).in_force
    with psycopg.connect(database_url) as holder:  # holds the call's row, as a person deciding
        holder.execute("SELECT 1 FROM agents.tool_invocations WHERE id = %s FOR UPDATE", (call,))
        with ThreadPoolExecutor(1) as pool:
            deciding = pool.submit(apply_policies, db, call)
            wait_until_blocked(database_url, "fn_policy_decide")
            Members(db).remove(team.alice, team.bob.member_id)  # the rule is now one of two
            holder.rollback()
            outcome = deciding.result(timeout=30)
    assert outcome is None
    assert team.status(call) == "pending"  # left for a person, as when no rule matches
    assert not team.rule(rule.id).in_force


def wait_until_blocked(database_url: str, query: str) -> None:
    """Until another backend running ``query`` waits for a lock (30 s at most). Its own
    connection, outside any transaction: a transaction sees pg_stat_activity as it was."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        for _ in range(3000):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE %s",
                (f"%{query}%",),
            ).fetchone()
            if row and row[0]:
                return
            conn.execute("SELECT pg_sleep(0.01)")
    raise AssertionError(f"nothing running {query} waited for a lock")
