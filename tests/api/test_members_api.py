"""/v1/members and member tokens through the real app (issue 16, item 1): a member acts with
their role on every route, the approvals route included; a removed member's token is dead;
`toolrelay member ...` does the same from the CLI."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

from tests.api.conftest import Client, agent_client, client
from tests.api.test_api import error_of
from tests.interop.conftest import runner
from tests.registry.helpers import agent_with_tool
from toolrelay.cli.main import app as cli
from toolrelay.db import Database
from toolrelay.registry import Registry

GATED = {"egress_class": "write", "requires_approval": True, "http_method": "POST"}


def invite(admin: Client, api: str, name: str, role: str) -> Client:
    made = admin.post("/v1/members", json={"name": name, "role": role})
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["name"], body["role"], body["removed_at"]) == (name, role, None)
    return client(api, body["token"], admin.owner)


def test_each_member_acts_with_their_role(
    make_owner: Callable[[], Client], api: str, db: Database
) -> None:
    tenant = make_owner()
    approver = invite(tenant, api, "Ann", "approver")
    viewer = invite(tenant, api, "Vic", "viewer")
    me = approver.get("/v1/me").json()
    assert (me["kind"], me["role"]) == ("owner", "approver") and me["member_id"]
    assert viewer.get("/v1/me").json()["role"] == "viewer"
    assert tenant.get("/v1/me").json() == {"kind": "owner", "owner": str(tenant.owner),
                                           "agent_id": None, "member_id": None,
                                           "role": "admin"}  # fmt: skip

    # configuration: the admin only, with a message naming the role needed
    for who in (approver, viewer):
        refused = who.post("/v1/agents", json={"name": "nope"})
        assert error_of(refused) == (403, "permission_denied")
        assert "needs the admin role" in refused.json()["error"]["message"]
        assert error_of(who.post("/v1/members", json={"name": "x", "role": "admin"}))[0] == 403
        assert who.get("/v1/agents").status_code == 200  # reading is everyone's
    # decisions: the approver, not the viewer; the decision names the approver
    registry = Registry(db, tenant.owner)
    agent_with_tool(registry, key="notes.create", endpoint_url="http://127.0.0.1:9/n", **GATED)
    call = registry.invoke("bot", "notes.create", {"text": "hi"})
    assert error_of(viewer.post(f"/v1/invocations/{call}/approve"))[0] == 403
    rejected = approver.post(f"/v1/invocations/{call}/reject", json={"reason": "no"})
    assert rejected.status_code == 200, rejected.text
    assert registry.get_invocation(call)["decided_by"] == uuid.UUID(me["member_id"])


def test_members_are_listed_changed_and_removed(make_owner: Callable[[], Client], api: str) -> None:
    tenant = make_owner()
    ann = invite(tenant, api, "Ann", "viewer")
    ann_id = ann.get("/v1/me").json()["member_id"]
    listed = tenant.get("/v1/members").json()["items"]
    assert [(m["name"], m["role"]) for m in listed] == [("owner", "admin"), ("Ann", "viewer")]
    assert ann.get("/v1/members").status_code == 200
    promoted = tenant.patch(f"/v1/members/{ann_id}", json={"role": "admin"})
    assert promoted.json()["role"] == "admin"
    assert ann.post("/v1/agents", json={"name": "by-ann"}).status_code == 201  # at once
    assert error_of(tenant.patch(f"/v1/members/{ann_id}", json={"role": "owner"}))[0] == 422
    assert tenant.delete(f"/v1/members/{ann_id}").json() == {"removed": True}
    assert error_of(ann.get("/v1/me")) == (401, "unauthenticated")  # her token is dead
    assert tenant.delete(f"/v1/members/{ann_id}").json() == {"removed": False}
    last = tenant.patch(f"/v1/members/{tenant.owner}", json={"role": "viewer"})
    assert error_of(last) == (409, "invalid_state") and "last admin" in last.text
    assert error_of(tenant.delete(f"/v1/members/{uuid.uuid4()}")) == (404, "not_found")


def test_an_agent_token_has_no_member_routes(make_owner: Callable[[], Client], api: str) -> None:
    tenant = make_owner()
    bot = agent_client(api, tenant, "bot")
    assert error_of(bot.get("/v1/members")) == (403, "permission_denied")
    assert error_of(bot.post("/v1/members", json={"name": "x", "role": "admin"}))[0] == 403


def test_the_member_cli(cli_owner: uuid.UUID, db: Database) -> None:
    added = runner.invoke(cli, ["member", "add", "Ann", "--role", "approver",
                                "--email", "ann@example.test"])  # fmt: skip
    assert added.exit_code == 0, added.output
    token = added.stdout.strip()
    assert token.startswith("trk_") and "\n" not in token  # the token alone on stdout
    assert "added member" in added.stderr and token not in added.stderr
    listed = json.loads(runner.invoke(cli, ["member", "list", "-o", "json"]).stdout)["items"]
    assert [(m["name"], m["role"], m["email"]) for m in listed] == [
        ("owner", "admin", None), ("Ann", "approver", "ann@example.test"),
    ]  # fmt: skip
    ann = listed[1]["id"]
    changed = runner.invoke(cli, ["member", "role", ann, "viewer", "-o", "json"])
    assert json.loads(changed.stdout)["role"] == "viewer"
    bad = runner.invoke(cli, ["member", "role", ann, "boss"])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: role must be one of")
    made = runner.invoke(cli, ["token", "create", "--member", ann, "--name", "laptop"])
    assert made.exit_code == 0 and made.stdout.startswith("trk_")
    removed = runner.invoke(cli, ["member", "remove", ann])
    assert removed.stdout.strip() == f"removed member {ann}"
    tokens = json.loads(runner.invoke(cli, ["token", "list", "-o", "json"]).stdout)["items"]
    assert {t["kind"] for t in tokens} == {"member"} and all(t["revoked_at"] for t in tokens)


def test_a_new_email_unbinds_the_members_sign_in(
    make_owner: Callable[[], Client], api: str, db: Database, cli_owner: uuid.UUID
) -> None:
    """Changing who signs in as a member: the email changes and the subject bound by the
    last sign-in is cleared (the next verified sign-in with the new address binds anew);
    only an admin may; nothing changes on a refused or empty request."""
    tenant = make_owner()
    made = tenant.post("/v1/members", json={"name": "Ann", "role": "approver",
                                            "email": "ann@old.example"}).json()  # fmt: skip
    ann = client(api, made["token"], tenant.owner)

    def bound() -> dict[str, object]:
        with db.as_dispatcher() as conn:
            conn.execute("SELECT agents.fn_oidc_bind(%s, 'https://idp.example', 'sub-ann')",
                         (made["id"],))  # fmt: skip
            row = conn.execute("SELECT email, oidc_subject FROM agents.members WHERE id = %s",
                               (made["id"],)).fetchone()  # fmt: skip
        assert row is not None
        return dict(row)

    assert bound() == {"email": "ann@old.example", "oidc_subject": "sub-ann"}
    refused = ann.patch(f"/v1/members/{made['id']}", json={"email": "ann@mine.example"})
    assert error_of(refused) == (403, "permission_denied")
    assert error_of(tenant.patch(f"/v1/members/{made['id']}", json={}))[0] == 422
    changed = tenant.patch(f"/v1/members/{made['id']}", json={"email": "ann@new.example"})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["email"], changed.json()["role"]) == ("ann@new.example", "approver")
    with db.as_dispatcher() as conn:
        row = conn.execute("SELECT oidc_subject, oidc_issuer FROM agents.members WHERE id = %s",
                           (made["id"],)).fetchone()  # fmt: skip
    assert row == {"oidc_subject": None, "oidc_issuer": None}

    # the CLI's `member email`, as the tenant the CLI acts as
    added = runner.invoke(
        cli, ["member", "add", "Bo", "--role", "viewer", "--email", "bo@a.example"]
    )
    assert added.exit_code == 0, added.output
    listed = json.loads(runner.invoke(cli, ["member", "list", "-o", "json"]).output)
    [member] = [m for m in listed["items"] if m["name"] == "Bo"]
    done = runner.invoke(cli, ["member", "email", member["id"], "bo@b.example", "-o", "json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["email"] == "bo@b.example"
