"""Members and roles (issue 16, item 1; migration 0025): what each role may do, decided by the
database whichever door is used; a role change or a removal taking effect at once; one admin
always remaining; another tenant's member having no rights here."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay.db import Database
from toolrelay.errors import InvalidArgument, InvalidState, NotFound, PermissionDenied
from toolrelay.registry import Registry
from toolrelay.registry.audit import read_audit
from toolrelay.registry.members import Members
from toolrelay.tokens import Authenticator, Caller, TokenStore

GATED = {"egress_class": "write", "requires_approval": True, "http_method": "POST"}


@dataclass
class Team:
    db: Database
    owner: Registry  # the tenant itself (its first admin)
    members: Members
    ids: dict[str, uuid.UUID]  # role -> a member with it

    def as_(self, role: str) -> Registry:
        return Registry(self.db, self.owner.owner, member_id=self.ids[role])

    def caller(self, role: str) -> Caller:
        return Caller(owner=self.owner.owner, member_id=self.ids[role])


@pytest.fixture
def team(registry: Registry, db: Database) -> Team:
    members = Members(db)
    ids = {
        role: members.add(registry.owner, f"{role} person", role, f"{role}@example.test").id
        for role in ("admin", "approver", "viewer")
    }
    return Team(db, registry, members, ids)


def _pending(team: Team) -> uuid.UUID:
    if not any(a["name"] == "bot" for a in team.owner.list_agents()):
        # made by a member: one made with the tenant's own token names no editor, so its
        # calls would need two approvers (migration 0040)
        agent_with_tool(team.as_("admin"), key="notes.create", **GATED)
    return team.owner.invoke("bot", "notes.create", {"text": "hi"})


# What each action is, as a function of a Registry acting as someone.
ACTIONS: dict[str, Callable[[Registry, Team], Any]] = {
    "register a tool": lambda r, t: add_tool(r, key=f"t{uuid.uuid4().hex[:8]}.get"),
    "create an agent": lambda r, t: r.create_agent(f"a{uuid.uuid4().hex[:8]}"),
    "assign a tool": lambda r, t: r.assign("bot", add_tool(t.owner, key="x.get")["key"]),
    "invoke for an agent": lambda r, t: r.invoke("bot", "notes.create", {"text": "x"}),
    "approve a call": lambda r, t: r.approve(_pending(t)),
    "reject a call": lambda r, t: r.reject(_pending(t), "no"),
    "read tools": lambda r, t: r.list_tools(),
    "read invocations": lambda r, t: r.list_invocations(limit=5),
}
ALLOWED = {
    "admin": set(ACTIONS),
    "approver": {"approve a call", "reject a call", "read tools", "read invocations"},
    "viewer": {"read tools", "read invocations"},
}


@pytest.mark.parametrize("role", ["admin", "approver", "viewer"])
@pytest.mark.parametrize("action", list(ACTIONS))
def test_what_each_role_may_do(team: Team, role: str, action: str) -> None:
    _pending(team)  # the agent, its gated tool and one call exist
    run = ACTIONS[action]
    if action in ALLOWED[role]:
        run(team.as_(role), team)
        return
    with pytest.raises(PermissionDenied, match="needs the admin|needs the admin or approver"):
        run(team.as_(role), team)


def test_a_plain_update_as_a_non_admin_is_refused_too(team: Team, db: Database) -> None:
    """The RFC's `UPDATE agents.tools_registry SET ...` as the owner: by an admin it works,
    by an approver or a viewer it is refused, not silently skipped."""
    tool = add_tool(team.owner, key="plain.get")
    gone = team.members.add(team.owner.owner, "Gone", "admin")
    team.members.remove(team.owner.owner, gone.id)
    team.ids["removed"] = gone.id
    for role, phrase in (("approver", "an approver"), ("viewer", "a viewer"),
                         ("removed", "not a member")):  # fmt: skip
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege,
                          match=f"needs the admin role; this member is {phrase}\n"),
            db.as_owner(team.owner.owner, member_id=team.ids[role]) as conn,
        ):  # fmt: skip
            conn.execute(
                "UPDATE agents.tools_registry SET endpoint_url = 'https://evil.example/x'"
                " WHERE id = %s", (tool["id"],),
            )  # fmt: skip
    with db.as_owner(team.owner.owner, member_id=team.ids["admin"]) as conn:
        conn.execute(
            "UPDATE agents.tools_registry SET name = 'renamed' WHERE id = %s", (tool["id"],)
        )
    assert team.owner.get_tool("plain.get")["name"] == "renamed"


def test_a_decision_names_the_member_who_made_it(team: Team) -> None:
    approved, rejected, by_tenant = _pending(team), _pending(team), _pending(team)
    team.as_("approver").approve(approved)
    team.as_("admin").reject(rejected, "not today")
    team.owner.reject(by_tenant)
    rows = {i: team.owner.get_invocation(i) for i in (approved, rejected, by_tenant)}
    assert rows[approved]["decided_by"] == team.ids["approver"]
    assert rows[rejected]["decided_by"] == team.ids["admin"]
    assert rows[by_tenant]["decided_by"] == team.owner.owner  # the tenant's own member row


def test_a_role_change_or_removal_takes_effect_on_the_next_statement(
    team: Team, db: Database
) -> None:
    """The role is read from the table on every check, not carried by a token or a claim."""
    viewer = team.as_("viewer")
    with pytest.raises(PermissionDenied):
        viewer.create_agent("early")
    team.members.set_role(team.owner.owner, team.ids["viewer"], "admin")
    viewer.create_agent("promoted")  # the same Registry, the same claims
    _info, token = TokenStore(db).create(team.owner.owner, member_id=team.ids["viewer"])
    authenticator = Authenticator(db)
    assert authenticator.authenticate(token).member_id == team.ids["viewer"]
    assert team.members.remove(team.caller("admin"), team.ids["viewer"]) is True
    with pytest.raises(PermissionDenied, match="not a member"):
        viewer.create_agent("removed")
    with pytest.raises(Exception, match="unknown, revoked or expired"):
        authenticator.authenticate(token)  # removing revoked its tokens
    assert team.members.remove(team.owner.owner, team.ids["viewer"]) is False  # already


def test_one_admin_always_remains(registry: Registry, db: Database) -> None:
    members = Members(db)
    tenant = registry.owner
    alice = members.add(tenant, "Alice", "admin")
    members.set_role(tenant, tenant, "viewer")  # the tenant's own row: Alice remains admin
    as_alice = Caller(owner=tenant, member_id=alice.id)
    with pytest.raises(InvalidState, match="last admin"):
        members.set_role(as_alice, alice.id, "approver")
    with pytest.raises(InvalidState, match="last admin"):
        members.remove(as_alice, alice.id)
    with pytest.raises(PermissionDenied, match="is a viewer"):
        members.set_role(tenant, tenant, "admin")  # the tenant is a viewer now
    members.set_role(as_alice, tenant, "admin")
    members.remove(tenant, alice.id)  # another admin (the tenant) remains
    assert [(m.name, m.role) for m in members.list(tenant)] == [("owner", "admin")]


def test_before_its_first_member_a_tenant_is_its_own_admin(
    registry: Registry, db: Database
) -> None:
    members = Members(db)
    assert members.role_of(registry.owner) == "admin"
    assert members.list(registry.owner) == []  # no member row until the first member
    members.add(registry.owner, "Bo", "viewer")
    assert [(m.id, m.name, m.role) for m in members.list(registry.owner)] == [
        (registry.owner, "owner", "admin"), (members.list(registry.owner)[1].id, "Bo", "viewer"),
    ]  # fmt: skip


def test_another_tenants_member_has_no_rights_here(
    team: Team, make_registry: Callable[[], Registry], db: Database
) -> None:
    other = make_registry()
    stranger = Members(db).add(other.owner, "Mallory", "admin")
    forged = Registry(db, team.owner.owner, member_id=stranger.id)  # a claim naming her
    with pytest.raises(PermissionDenied, match="not a member"):
        forged.create_agent("x")
    with pytest.raises(PermissionDenied, match="not a member"):
        forged.approve(_pending(team))
    with pytest.raises(NotFound):
        TokenStore(db).create(team.owner.owner, member_id=stranger.id)  # not this tenant's


def test_an_agent_is_never_a_member(team: Team, db: Database) -> None:
    _pending(team)
    bot = team.owner.get_agent("bot")["id"]
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent"),
        db.as_owner(team.owner.owner, agent_id=bot, member_id=team.ids["admin"]) as conn,
    ):
        conn.execute("SELECT fn_create_agent('clone')")
    with pytest.raises(Exception, match="agent's or a member's, not both"):
        TokenStore(db).create(team.owner.owner, agent_id=bot, member_id=team.ids["admin"])


@pytest.mark.parametrize(
    ("name", "role", "email", "error"),
    [
        ("Eve", "owner", None, InvalidArgument),
        ("", "viewer", None, Exception),
        ("Eve\nRoot", "viewer", None, Exception),
        ("Eve", "viewer", "not-an-email", Exception),
    ],
)
def test_bad_members_are_refused_and_nothing_is_written(
    registry: Registry, db: Database, name: str, role: str, email: str | None, error: type
) -> None:
    members = Members(db)
    with pytest.raises(error):
        members.invite(registry.owner, name, role, email)
    assert members.list(registry.owner) == []
    assert TokenStore(db).list(registry.owner) == []


def test_an_email_is_one_members(team: Team) -> None:
    with pytest.raises(Exception, match="already in this tenant"):
        team.members.add(team.owner.owner, "Twin", "viewer", "VIEWER@example.test")


def test_the_audit_log_names_the_member(team: Team, db: Database) -> None:
    team.as_("admin").create_agent("audited")
    with db.as_owner(team.owner.owner) as conn:
        row = conn.execute(
            "SELECT actor, actor_member FROM agents.config_audit"
            " WHERE kind = 'agent' AND object_label = 'audited'"
        ).fetchone()
    assert row == {"actor": team.owner.owner, "actor_member": team.ids["admin"]}


def test_tokens_name_their_member(team: Team, db: Database) -> None:
    info, _ = TokenStore(db).create(
        team.owner.owner, member_id=team.ids["approver"], name=os.urandom(4).hex()
    )
    assert (info.kind, info.member_id) == ("member", team.ids["approver"])
    with pytest.raises(PermissionDenied, match="needs the admin"):
        TokenStore(db).create(team.caller("approver"), name="mine")


def test_the_audit_api_shape_names_the_member(team: Team) -> None:
    """registry/audit.py's reading gives actor_member, and members are a kind of their own."""
    team.as_("admin").create_agent("read-back")
    rows = read_audit(team.owner, kind="agent", limit=5)
    assert rows[0]["actor_member"] == team.ids["admin"]
    assert {r["kind"] for r in read_audit(team.owner, kind="member", limit=10)} == {"member"}


def test_only_admins_read_the_audit_log(team: Team) -> None:
    """Issue 16, item 7: readable by admins (migration 0030)."""
    team.owner.create_agent("logged")
    assert read_audit(team.as_("admin"), kind="agent", limit=5)
    for role in ("approver", "viewer"):
        assert read_audit(team.as_(role), limit=50) == []
