"""Policies for the obvious cases (issue 16, item 5; migration 0028): a tool's rules approve
or reject a call waiting for approval when its input matches a JSON Schema; decided by the
rule (named in the history), an approval bound to the request's digest; nobody but
toolrelay's dispatcher role can decide by a rule, and only admins write rules."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.errors import InvalidArgument, PermissionDenied
from toolrelay.registry import Registry
from toolrelay.registry.members import Members
from toolrelay.registry.policies import Policies
from toolrelay.registry.preview import approval_digest
from toolrelay.registry.service import _APPROVAL_ROW
from toolrelay.tokens import Caller

PAY: dict[str, Any] = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "channel": {"type": "string"}},
    "required": ["amount", "channel"],
}
SMALL = {"properties": {"amount": {"maximum": 100}, "channel": {"enum": ["general", "ops"]}}}
FORBIDDEN = {"properties": {"channel": {"const": "ceo"}}}
GATED = {"egress_class": "write", "requires_approval": True, "http_method": "POST",
         "schema_input": PAY}  # fmt: skip


@pytest.fixture
def bot(registry: Registry, db: Database) -> Registry:
    """The agent 'bot' with the gated tool pay.send, as the agent itself."""
    agent_with_tool(registry, key="pay.send", **GATED)
    return Registry(db, registry.owner, agent_id=registry.get_agent("bot")["id"])


def test_an_approve_rule_approves_what_it_matches_and_binds_the_digest(
    registry: Registry, db: Database, bot: Registry
) -> None:
    rule = Policies(db).add(registry.owner, "pay.send", "small payments", "approve", SMALL)
    small = bot.invoke("bot", "pay.send", {"amount": 50, "channel": "ops"})
    large = bot.invoke("bot", "pay.send", {"amount": 5000, "channel": "ops"})
    elsewhere = bot.call("pay.send", {"amount": 5, "channel": "random"}).invocation_id
    row = registry.get_invocation(small)
    assert (row["status"], row["approval_status"]) == ("running", "approved")
    assert (row["decided_by"], row["decided_by_policy"]) == (None, rule.id)
    with db.as_owner(registry.owner) as conn:
        again = conn.execute(_APPROVAL_ROW.replace("AND i.status = 'pending'", ""), (small,))
        assert row["request_digest"] == approval_digest(again.fetchone())  # as a person's binds
    assert registry.get_invocation(large)["status"] == "pending"  # for a person
    assert registry.get_invocation(elsewhere)["status"] == "pending"


def test_a_reject_rule_wins_and_names_itself(
    registry: Registry, db: Database, bot: Registry
) -> None:
    policies = Policies(db)
    policies.add(registry.owner, "pay.send", "anything", "approve", {})
    no = policies.add(registry.owner, "pay.send", "never the ceo channel", "reject", FORBIDDEN)
    refused = bot.invoke("bot", "pay.send", {"amount": 1, "channel": "ceo"})
    row = registry.get_invocation(refused)
    assert (row["status"], row["decided_by_policy"]) == ("rejected", no.id)
    assert row["reject_reason"] == "policy never the ceo channel"
    assert registry.get_invocation(bot.invoke("bot", "pay.send", {"amount": 1, "channel": "x"}))[
        "status"
    ] == "running"  # fmt: skip


def test_nobody_but_the_dispatcher_role_decides_by_a_rule(
    registry: Registry, db: Database, bot: Registry
) -> None:
    """An agent (or an owner) calling fn_policy_decide for its own call is refused."""
    rule = Policies(db).add(registry.owner, "pay.send", "small", "approve", SMALL)
    call = bot.invoke("bot", "pay.send", {"amount": 9999, "channel": "ops"})  # not matched
    for agent_id in (bot.agent_id, None):
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege),
            db.as_owner(registry.owner, agent_id=agent_id) as conn,
        ):
            conn.execute("SELECT fn_policy_decide(%s, %s)", (call, rule.id))
    assert registry.get_invocation(call)["status"] == "pending"
    with (
        pytest.raises(psycopg.errors.NoDataFound, match="not one of this call's tool"),
        db.as_dispatcher() as conn,
    ):
        conn.execute("SELECT fn_policy_decide(%s, %s)", (call, uuid.uuid4()))


def test_only_admins_write_rules_and_bad_rules_are_refused(
    registry: Registry, db: Database, bot: Registry
) -> None:
    policies = Policies(db)
    approver = Members(db).add(registry.owner, "Ann", "approver")
    as_approver = Caller(owner=registry.owner, member_id=approver.id)
    with pytest.raises(PermissionDenied, match="needs the admin role"):
        policies.add(as_approver, "pay.send", "mine", "approve", {})
    with pytest.raises(InvalidArgument, match="action must be approve or reject"):
        policies.add(registry.owner, "pay.send", "x", "allow", {})
    with pytest.raises(InvalidArgument, match="its schema"):
        policies.add(registry.owner, "pay.send", "x", "approve", {"type": "no-such-type"})
    made = policies.add(registry.owner, "pay.send", "ok", "approve", SMALL)
    assert [p.name for p in policies.list(as_approver, "pay.send")] == ["ok"]  # read: anyone
    with pytest.raises(PermissionDenied):
        policies.remove(as_approver, made.id)
    policies.remove(registry.owner, made.id)
    assert policies.list(registry.owner) == []


def test_a_call_decided_by_a_person_first_stays_theirs(
    registry: Registry, db: Database, bot: Registry
) -> None:
    rule = Policies(db).add(registry.owner, "pay.send", "small", "approve", SMALL)
    call = bot.invoke("bot", "pay.send", {"amount": 9999, "channel": "ops"})
    registry.reject(call, "no")
    with db.as_dispatcher() as conn:
        status = conn.execute("SELECT fn_policy_decide(%s, %s) AS s", (call, rule.id)).fetchone()
    assert status == {"s": "rejected"}
    assert registry.get_invocation(call)["decided_by_policy"] is None
