"""Quorum and separation of duties (issue 16, item 3; migration 0026): a call waits for N
distinct approvers of the same request, one rejection rejects it, and the member who last
changed the tool is not enough alone. A tenant without members approves as before."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.errors import InvalidArgument, InvalidState, PermissionDenied
from toolrelay.registry import Registry
from toolrelay.registry.members import Members

GATED = {"egress_class": "write", "requires_approval": True, "http_method": "POST"}


def team(registry: Registry, db: Database, *roles: str) -> list[Registry]:
    """Registries acting as new members with these roles (the tenant stays an admin)."""
    members = Members(db)
    return [
        Registry(db, registry.owner, member_id=members.add(registry.owner, f"m{i}", role).id)
        for i, role in enumerate(roles)
    ]


def status(registry: Registry, call: uuid.UUID) -> str:
    return str(registry.get_invocation(call)["status"])


def test_a_dangerous_tool_waits_for_two_distinct_approvers(
    registry: Registry, db: Database
) -> None:
    ann, bob = team(registry, db, "approver", "approver")
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    call = registry.invoke("bot", "bank.pay", {"text": "100"})
    ann.approve(call)
    assert status(registry, call) == "pending"  # one of two
    with pytest.raises(InvalidState, match="approved it already"):
        ann.approve(call)
    bob.approve(call)
    row = registry.get_invocation(call)
    assert (row["status"], row["decided_by"]) == ("running", bob.member_id)
    with db.as_owner(registry.owner) as conn:
        approvers = conn.execute(
            "SELECT member_id FROM agents.invocation_approvals WHERE invocation_id = %s"
            " ORDER BY approved_at", (call,),
        ).fetchall()  # fmt: skip
    assert [a["member_id"] for a in approvers] == [ann.member_id, bob.member_id]


def test_an_explicit_quorum_and_one_rejection_rejects(registry: Registry, db: Database) -> None:
    ann, bob, cid = team(registry, db, "approver", "approver", "admin")
    agent_with_tool(registry, key="ship.it", approvals_required=3, **GATED)
    assert registry.get_tool("ship.it")["approvals_required"] == 3
    call = registry.invoke("bot", "ship.it", {"text": "v2"})
    ann.approve(call)
    bob.approve(call)
    assert status(registry, call) == "pending"  # two of three
    cid.reject(call, "not on a Friday")
    assert status(registry, call) == "rejected"
    with pytest.raises(InvalidState, match="not pending"):
        registry.approve(call)


def test_a_tenant_without_members_approves_alone_as_before(registry: Registry) -> None:
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    call = registry.invoke("bot", "bank.pay", {"text": "1"})
    registry.approve(call)  # its own tool, its own call: one person, one approval
    assert status(registry, call) == "running"


def test_the_last_editor_of_a_tool_is_not_enough_alone(registry: Registry, db: Database) -> None:
    alice, bob = team(registry, db, "admin", "approver")
    agent_with_tool(alice, key="notes.create", **GATED)  # Alice made the tool
    call = registry.invoke("bot", "notes.create", {"text": "hi"})
    alice.approve(call)
    assert status(registry, call) == "pending"  # for someone else
    bob.approve(call)
    assert registry.get_invocation(call)["decided_by"] == bob.member_id
    # Bob's approval alone is enough: he did not change the tool
    second = registry.invoke("bot", "notes.create", {"text": "again"})
    bob.approve(second)
    assert status(registry, second) == "running"
    # once Bob edits it, he is the one who needs another approver
    bob_admin = Members(db)
    bob_admin.set_role(registry.owner, bob.member_id, "admin")
    bob.update_tool("notes.create", {"timeout_seconds": 20})
    third = registry.invoke("bot", "notes.create", {"text": "third"})
    bob.approve(third)
    assert status(registry, third) == "pending"
    alice.approve(third)
    assert status(registry, third) == "running"


@pytest.mark.parametrize(
    "tidy",
    [{"description": "typo fixed"}, {"name": "Create a note"}, {"category": "notes"},
     {"status": "disabled"}],
    ids=lambda change: next(iter(change)),
)  # fmt: skip
def test_a_label_edit_does_not_pass_the_tool_to_a_new_editor(
    registry: Registry, db: Database, tidy: dict[str, str]
) -> None:
    """Alice points the tool elsewhere; Bob then only tidies its labels (or switches it off
    and on). Alice is still who shaped the request, so her approval alone is not enough."""
    alice, bob = team(registry, db, "admin", "admin")
    agent_with_tool(bob, key="notes.create", **GATED)
    alice.update_tool("notes.create", {"endpoint_url": "http://127.0.0.1:9/alice"})
    bob.update_tool("notes.create", tidy)
    if "status" in tidy:
        bob.update_tool("notes.create", {"status": "active"})
    call = registry.invoke("bot", "notes.create", {"text": "hi"})
    alice.approve(call)
    assert status(registry, call) == "pending"  # for someone who did not shape it
    bob.approve(call)
    assert status(registry, call) == "running"


def test_a_gating_edit_makes_its_author_the_editor(registry: Registry, db: Database) -> None:
    """Lowering a tool's quorum is an edit like any other: its author needs someone else."""
    alice, bob = team(registry, db, "admin", "admin")
    agent_with_tool(bob, key="bank.pay", approvals_required=2, **GATED)
    alice.update_tool("bank.pay", {"approvals_required": 1})
    call = registry.invoke("bot", "bank.pay", {"text": "100"})
    alice.approve(call)
    assert status(registry, call) == "pending"
    bob.approve(call)
    assert status(registry, call) == "running"


def test_approvals_of_different_requests_do_not_add_up(registry: Registry, db: Database) -> None:
    ann, bob = team(registry, db, "approver", "approver")
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    call = registry.invoke("bot", "bank.pay", {"text": "5"})
    with db.as_owner(registry.owner, member_id=ann.member_id) as conn:
        conn.execute("SELECT fn_approve_tool_invocation(%s, %s)", (call, "a" * 64))
    with (
        pytest.raises(psycopg.DatabaseError, match="approved another request"),
        db.as_owner(registry.owner, member_id=bob.member_id) as conn,
    ):
        conn.execute("SELECT fn_approve_tool_invocation(%s, %s)", (call, "b" * 64))
    assert status(registry, call) == "pending"


def test_a_call_sent_back_to_pending_starts_its_quorum_over(
    registry: Registry, db: Database
) -> None:
    """Gated again at claim (its tool changed): earlier approvals were for another request."""
    ann, bob = team(registry, db, "approver", "approver")
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    call = registry.invoke("bot", "bank.pay", {"text": "7"})
    ann.approve(call)
    bob.approve(call)
    with db.as_dispatcher() as conn:  # what the claim does when the tool is gated anew
        conn.execute("UPDATE agents.tool_invocations SET status = 'pending',"
                     " approval_status = 'pending' WHERE id = %s", (call,))  # fmt: skip
        left = conn.execute(
            "SELECT count(*) AS n FROM agents.invocation_approvals WHERE invocation_id = %s",
            (call,),
        ).fetchone()
    assert left == {"n": 0}
    ann.approve(call)
    assert status(registry, call) == "pending"  # one of two again


def test_quorum_bounds_are_checked(registry: Registry) -> None:
    for bad in (0, 11):
        with pytest.raises(InvalidArgument, match="approvals_required"):
            agent_with_tool(registry, key=f"q{bad}.get", approvals_required=bad, **GATED)


def test_an_owner_sees_who_approved_and_how_many_are_needed(
    registry: Registry, db: Database
) -> None:
    ann, _bob = team(registry, db, "approver", "approver")
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    call = registry.invoke("bot", "bank.pay", {"text": "9"})
    ann.approve(call)
    row = registry.get_invocation(call)
    assert row["approvals_needed"] == 2
    assert [a["member_id"] for a in row["approvals"]] == [str(ann.member_id)]
    bot = Registry(db, registry.owner, agent_id=registry.get_agent("bot")["id"])
    assert "approvals" not in bot.get_invocation(call)  # the agent's read stays lean


# The tenant's own token is shared (any admin can make one: `token create`), so it names no
# person: it is never one of several approvers, and an edit made with it names no editor.


def test_the_tenant_token_and_a_member_are_not_two_approvers(
    registry: Registry, db: Database
) -> None:
    alice, bob = team(registry, db, "admin", "approver")
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    call = registry.invoke("bot", "bank.pay", {"text": "100"})
    alice.approve(call)
    with pytest.raises(PermissionDenied, match="tenant's own token"):
        registry.approve(call)  # Alice again, with the tenant's token
    assert status(registry, call) == "pending"
    bob.approve(call)
    assert status(registry, call) == "running"


def test_a_founder_and_their_own_sign_in_are_one_approver(registry: Registry, db: Database) -> None:
    """The tenant plus one member who may approve is one person: a dangerous tool needs one
    approval there, not the tenant's and the member's (which one person would give)."""
    (alice,) = team(registry, db, "admin")
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    call = registry.invoke("bot", "bank.pay", {"text": "1"})
    assert registry.get_invocation(call)["approvals_needed"] == 1
    alice.approve(call)
    assert status(registry, call) == "running"
    again = registry.invoke("bot", "bank.pay", {"text": "2"})
    registry.approve(again)  # or with the tenant's token: still the one person
    assert status(registry, again) == "running"


def test_two_people_needed_are_never_met_by_the_tenant_token(
    registry: Registry, db: Database
) -> None:
    (alice,) = team(registry, db, "admin")
    agent_with_tool(registry, key="ship.it", approvals_required=2, **GATED)
    call = registry.invoke("bot", "ship.it", {"text": "v3"})
    alice.approve(call)
    with pytest.raises(PermissionDenied, match="tenant's own token"):
        registry.approve(call)
    assert status(registry, call) == "pending"  # until a second member approves
    (bob,) = team(registry, db, "approver")
    bob.approve(call)
    assert status(registry, call) == "running"


def test_an_edit_made_with_the_tenant_token_names_no_editor(
    registry: Registry, db: Database
) -> None:
    """Whoever edited with the shared token may be the one approving: in a team, a call to a
    tool last changed that way needs a second member, as if its editor approved."""
    alice, bob = team(registry, db, "admin", "approver")
    agent_with_tool(alice, key="notes.create", **GATED)
    first = registry.invoke("bot", "notes.create", {"text": "a"})
    bob.approve(first)
    assert status(registry, first) == "running"  # Alice edited: Bob alone is enough
    registry.update_tool("notes.create", {"endpoint_url": "http://127.0.0.1:9/elsewhere"})
    call = registry.invoke("bot", "notes.create", {"text": "b"})
    assert registry.get_invocation(call)["approvals_needed"] == 2
    bob.approve(call)
    assert status(registry, call) == "pending"
    alice.approve(call)
    assert status(registry, call) == "running"


@pytest.mark.parametrize("leaves", ["removed", "made a viewer"])
def test_an_approval_counts_while_its_approver_may_approve(
    registry: Registry, db: Database, leaves: str
) -> None:
    """Ann approves a dangerous call, then leaves the team (or may no longer approve): a
    removal takes effect on the member's next statement, and on the approvals they left on
    calls still waiting. Bob's approval is then one of two, not the second."""
    ann, bob, cid = team(registry, db, "approver", "approver", "approver")
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    call = registry.invoke("bot", "bank.pay", {"text": "100"})
    ann.approve(call)
    assert ann.member_id is not None
    if leaves == "removed":
        Members(db).remove(registry.owner, ann.member_id)
    else:
        Members(db).set_role(registry.owner, ann.member_id, "viewer")
    (queued,) = registry.review_queue()
    assert (queued["approvals_given"], queued["approvals_needed"]) == (0, 2)
    (kept,) = registry.get_invocation(call)["approvals"]  # the record stays, marked
    assert (kept["member_id"], kept["counts"]) == (str(ann.member_id), False)
    bob.approve(call)
    assert status(registry, call) == "pending"  # one of two: Ann's no longer counts
    cid.approve(call)
    assert status(registry, call) == "running"
