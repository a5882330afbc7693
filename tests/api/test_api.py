"""The HTTP API end to end: two owners and an agent, what each may and may not do."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.api.conftest import Client, agent_client
from tests.dispatch.upstream import Upstream
from toolrelay import errors
from toolrelay.db import Database
from toolrelay.registry import Registry

SECRET = "sk-live-4f9c2b7d1e"
NOTE_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "minLength": 1}},
    "required": ["text"],
}


@dataclass
class World:
    alice: Client
    bob: Client
    bot: Client  # alice's agent
    credential_id: str


def error_of(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    assert body["error"]["message"]
    return response.status_code, body["error"]["code"]


def tool(upstream: Upstream, path: str, **fields: Any) -> dict[str, Any]:
    return {"name": path.strip("/").title(), "endpoint_url": f"{upstream.base_url}{path}"} | fields


@pytest.fixture
def world(api: str, make_owner: Any, upstream: Upstream) -> World:
    alice, bob = make_owner(), make_owner()
    cred = alice.post(
        "/v1/credentials",
        json={"kind": "api_key", "name": "notes", "secret": SECRET, "allowed_hosts": ["127.0.0.1"]},
    )
    assert cred.status_code == 201, cred.text
    write = tool(upstream, "/notes", http_method="POST", egress_class="write",
                 schema_input=NOTE_SCHEMA, auth_method="api_key",
                 credential_ref=cred.json()["id"], auth_param_prefix="Bearer ",
                 request_template={"body": {"note": {"text": "{{input.text}}"}}})  # fmt: skip
    read = tool(upstream, "/notes", http_method="GET", egress_class="read_only")
    for key, body in (("notes.create", write), ("notes.list", read), ("notes.purge", read)):
        response = alice.put(f"/v1/tools/{key}", json=body)
        assert response.status_code == 200, response.text
    bot = agent_client(api, alice, "bot")
    for key in ("notes.create", "notes.list"):
        assert alice.put(f"/v1/assignments/bot/{key}").status_code == 200
    return World(alice, bob, bot, cred.json()["id"])


def invoke(agent: Client, key: str, input: dict[str, Any]) -> dict[str, Any]:
    response = agent.post("/v1/agent/invocations", json={"tool": key, "input": input})
    assert response.status_code == 202, response.text
    assert response.headers["Location"] == f"/v1/agent/invocations/{response.json()['id']}"
    return dict(response.json())


# --- the happy path ----------------------------------------------------------------------------


def test_approved_write_is_sent_once_with_the_credential_and_the_agent_sees_the_outcome(
    world: World, upstream: Upstream
) -> None:
    inv = invoke(world.bot, "notes.create", {"text": "hello"})
    assert (inv["status"], inv["approval_status"]) == ("pending", "pending")
    waited = world.bot.get(f"/v1/agent/invocations/{inv['id']}", params={"wait": 0.3})
    assert waited.json()["status"] == "pending"  # a bounded wait ends with the current state

    approved = world.alice.post(f"/v1/invocations/{inv['id']}/approve")
    assert approved.status_code == 200, approved.text
    assert approved.json()["approval_status"] == "approved"

    done = world.bot.get(f"/v1/agent/invocations/{inv['id']}", params={"wait": 30}).json()
    assert done["status"] == "completed", done["error"]
    assert done["output"]["body"] == {"note": {"text": "hello"}}
    assert [a["status_code"] for a in done["attempts"]] == [200]
    assert upstream.by_invocation[inv["id"]] == 1
    seen = next(s for s in upstream.seen if s.headers.get("X-Toolrelay-Invocation") == inv["id"])
    assert seen.headers["Authorization"] == f"Bearer {SECRET}"
    assert SECRET not in world.alice.get(f"/v1/invocations/{inv['id']}").text


def test_read_tool_runs_at_once_and_reject_keeps_a_write_from_being_sent(
    world: World, upstream: Upstream
) -> None:
    read = invoke(world.bot, "notes.list", {"q": "x"})
    assert read["approval_status"] == "not_required"  # not gated: the worker may be done already
    assert read["status"] in ("running", "completed")
    out = world.bot.get(f"/v1/agent/invocations/{read['id']}", params={"wait": 30}).json()
    assert (out["status"], out["output"]["query"]) == ("completed", {"q": "x"})

    write = invoke(world.bot, "notes.create", {"text": "no"})
    rejected = world.alice.post(f"/v1/invocations/{write['id']}/reject", json={"reason": "spam"})
    assert rejected.status_code == 200, rejected.text
    seen = world.bot.get(f"/v1/agent/invocations/{write['id']}", params={"wait": 5}).json()
    assert (seen["status"], seen["reject_reason"]) == ("rejected", "spam")
    assert upstream.by_invocation[write["id"]] == 0
    again = world.alice.post(f"/v1/invocations/{write['id']}/approve")
    assert error_of(again) == (409, "invalid_state")


def test_invoke_with_wait_answers_with_the_outcome_in_one_request(
    world: World, upstream: Upstream
) -> None:
    response = world.bot.post(
        "/v1/agent/invocations", params={"wait": 30}, json={"tool": "notes.list", "input": {}}
    )
    assert response.status_code == 202, response.text
    done = response.json()
    assert done["status"] == "completed", done  # without ?wait it may still be running
    assert response.headers["Location"] == f"/v1/agent/invocations/{done['id']}"
    assert upstream.by_invocation[done["id"]] == 1
    # A gated call answers 'pending' at once: the wait is for the dispatcher, not a human
    # (a 30 s wait on the decision would outlast this client's 10 s timeout).
    gated = world.bot.post(
        "/v1/agent/invocations",
        params={"wait": 30},
        json={"tool": "notes.create", "input": {"text": "later"}},
        timeout=10.0,
    ).json()
    assert (gated["status"], gated["approval_status"]) == ("pending", "pending")
    bad = world.bot.post(
        "/v1/agent/invocations", params={"wait": -1}, json={"tool": "notes.list", "input": {}}
    )
    assert bad.status_code == 422
    assert len(world.alice.get("/v1/invocations").json()["items"]) == 2  # not the refused one


# --- what an agent may and may not do ---------------------------------------------------------


def test_agent_sees_only_its_assigned_allowed_active_tools(world: World) -> None:
    listed = world.bot.get("/v1/agent/tools").json()["tools"]
    assert [t["name"] for t in listed] == ["notes.create", "notes.list"]
    create = listed[0]
    assert create["input_schema"] == NOTE_SCHEMA and create["requires_approval"] is True
    assert listed[1]["requires_approval"] is False

    world.alice.put("/v1/assignments/bot/notes.list", json={"allowed": False})
    world.alice.post("/v1/tools/notes.create/disable")
    assert world.bot.get("/v1/agent/tools").json()["tools"] == []
    world.alice.post("/v1/tools/notes.create/enable")
    assert [t["name"] for t in world.bot.get("/v1/agent/tools").json()["tools"]] == ["notes.create"]


def test_agent_invoking_an_unassigned_tool_gets_a_clear_403(world: World) -> None:
    for key in ("notes.purge", "no.such.tool"):  # whether it exists stays hidden
        response = world.bot.post("/v1/agent/invocations", json={"tool": key, "input": {}})
        assert error_of(response) == (403, "not_assigned")
        assert f"tool {key} is not assigned to this agent" in response.json()["error"]["message"]
    world.alice.put("/v1/assignments/bot/notes.list", json={"allowed": False})
    denied = world.bot.post("/v1/agent/invocations", json={"tool": "notes.list", "input": {}})
    assert error_of(denied) == (403, "not_assigned")
    world.alice.post("/v1/tools/notes.create/disable")
    inactive = world.bot.post(
        "/v1/agent/invocations", json={"tool": "notes.create", "input": {"text": "hi"}}
    )
    assert error_of(inactive) == (409, "tool_inactive")


def test_agent_input_is_validated_against_the_schema(world: World) -> None:
    response = world.bot.post(
        "/v1/agent/invocations", json={"tool": "notes.create", "input": {"text": ""}}
    )
    assert error_of(response) == (422, "invalid_input")
    assert "input.text" in response.json()["error"]["message"]


def test_agent_cannot_approve_even_its_own_call(world: World, db: Database) -> None:
    inv = invoke(world.bot, "notes.create", {"text": "mine"})
    for action in ("approve", "reject"):
        response = world.bot.post(f"/v1/invocations/{inv['id']}/{action}")
        assert error_of(response) == (403, "permission_denied")
    # The last line of defence holds too: the SQL function refuses the agent identity.
    as_agent = Registry(db, world.alice.owner, agent_id=world.bot.agent_id)
    with pytest.raises(errors.PermissionDenied, match="only a human owner"):
        as_agent.approve(inv["id"])
    assert world.alice.get(f"/v1/invocations/{inv['id']}").json()["status"] == "pending"


def test_agent_tokens_cannot_use_owner_endpoints_and_owners_not_agent_ones(world: World) -> None:
    for method, path in (("GET", "/v1/tools"), ("GET", "/v1/invocations"),
                         ("POST", "/v1/agents"), ("GET", "/v1/credentials"),
                         ("POST", "/v1/tokens")):  # fmt: skip
        response = world.bot.request(method, path, json={"name": "x"})
        assert error_of(response) == (403, "permission_denied"), path
    assert error_of(world.alice.get("/v1/agent/tools")) == (403, "permission_denied")
    me = world.bot.get("/v1/me").json()
    assert me == {"kind": "agent", "owner": str(world.alice.owner),
                  "agent_id": str(world.bot.agent_id), "member_id": None, "role": None}  # fmt: skip


def test_agent_cannot_read_another_agents_invocation(world: World, api: str) -> None:
    inv = invoke(world.bot, "notes.create", {"text": "private"})
    other = agent_client(api, world.alice, "other-bot")
    assert error_of(other.get(f"/v1/agent/invocations/{inv['id']}")) == (404, "not_found")


# --- one owner cannot reach another's rows ----------------------------------------------------


def test_another_owner_gets_404_for_everything(world: World) -> None:
    inv = invoke(world.bot, "notes.create", {"text": "a's"})
    bob = world.bob
    for method, path in (
        ("GET", "/v1/tools/notes.create"),
        ("PATCH", "/v1/tools/notes.create"),
        ("POST", "/v1/tools/notes.create/disable"),
        ("GET", f"/v1/invocations/{inv['id']}"),
        ("POST", f"/v1/invocations/{inv['id']}/approve"),
        ("POST", f"/v1/invocations/{inv['id']}/reject"),
        ("GET", f"/v1/credentials/{world.credential_id}"),
        ("DELETE", f"/v1/credentials/{world.credential_id}"),
        ("GET", "/v1/agents/bot"),
        ("PUT", "/v1/assignments/bot/notes.create"),
    ):
        response = bob.request(method, path, json={} if method in ("PATCH", "POST") else None)
        assert error_of(response) == (404, "not_found"), (method, path, response.text)
    assert bob.get("/v1/tools").json() == {"items": []}
    assert bob.get("/v1/invocations").json() == {"items": [], "next_cursor": None}
    # bob's own tool of the same key is his, not alice's
    mine = bob.put("/v1/tools/notes.create", json={"name": "Bob's"})
    assert mine.status_code == 200 and mine.json()["name"] == "Bob's"
    assert world.alice.get("/v1/tools/notes.create").json()["name"] == "Notes"
    cross = bob.patch("/v1/tools/notes.create", json={"credential_ref": world.credential_id,
                                                      "auth_method": "api_key"})  # fmt: skip
    assert error_of(cross)[0] == 422 and "not found for this owner" in cross.text


# --- owners' resources ------------------------------------------------------------------------


def test_tools_create_update_show_and_errors(world: World, upstream: Upstream) -> None:
    alice = world.alice
    body = {
        "key": "calc.add",
        **tool(upstream, "/add", http_method="GET", egress_class="read_only"),
    }
    created = alice.post("/v1/tools", json=body)
    assert created.status_code == 201 and created.headers["Location"] == "/v1/tools/calc.add"
    assert error_of(alice.post("/v1/tools", json=body)) == (409, "conflict")
    patched = alice.patch("/v1/tools/calc.add", json={"max_attempts": 5, "description": "adds"})
    assert (patched.json()["max_attempts"], patched.json()["description"]) == (5, "adds")
    assert alice.get(f"/v1/tools/{created.json()['id']}").json()["key"] == "calc.add"
    assert "calc.add" in [t["key"] for t in alice.get("/v1/tools").json()["items"]]
    bad_template = alice.patch(
        "/v1/tools/calc.add", json={"request_template": {"headers": {"Host": "evil"}}}
    )
    assert error_of(bad_template) == (422, "invalid_argument")
    assert "Host" in bad_template.json()["error"]["message"]
    unknown = alice.patch("/v1/tools/calc.add", json={"owner": str(uuid.uuid4())})
    assert error_of(unknown) == (422, "invalid_request")
    assert error_of(alice.get("/v1/tools/no.such")) == (404, "not_found")


def test_credentials_never_return_secret_material(world: World) -> None:
    alice = world.alice
    listed = alice.get("/v1/credentials")
    shown = alice.get(f"/v1/credentials/{world.credential_id}")
    rotated = alice.post(f"/v1/credentials/{world.credential_id}/rotate", json={"secret": "sk-2"})
    oauth = alice.post("/v1/credentials", json={
        "kind": "oauth", "name": "o", "secret": {"access_token": "at-secret-1",
        "refresh_token": "rt-secret-2", "token_url": "https://auth.example.com/token",
        "client_id": "c", "client_secret": "cs-secret-3", "expires_in": 3600}})  # fmt: skip
    assert oauth.status_code == 201, oauth.text
    for response in (listed, shown, rotated, oauth, alice.get("/v1/credentials")):
        assert response.status_code in (200, 201)
        for secret in (SECRET, "sk-2", "at-secret-1", "rt-secret-2", "cs-secret-3"):
            assert secret not in response.text
    assert shown.json()["allowed_hosts"] == ["127.0.0.1"] and shown.json()["kind"] == "api_key"
    assert rotated.json()["rotated_at"] is not None
    in_use = alice.delete(f"/v1/credentials/{world.credential_id}")
    assert error_of(in_use) == (409, "conflict") and "notes.create" in in_use.text
    forced = alice.delete(f"/v1/credentials/{world.credential_id}", params={"force": "true"})
    assert forced.json() == {"id": world.credential_id, "unbound_tools": ["notes.create"]}
    bad = alice.post("/v1/credentials", json={"kind": "api_key", "name": "e", "secret": "a\nb"})
    assert error_of(bad) == (422, "invalid_argument")


def test_agents_assignments_and_revoke(world: World) -> None:
    alice = world.alice
    agents = alice.get("/v1/agents").json()["items"]
    assert [a["name"] for a in agents] == ["bot"]
    assert error_of(alice.post("/v1/agents", json={"name": "bot"})) == (409, "conflict")
    rows = alice.get("/v1/assignments").json()["items"]
    assert {(r["agent"], r["tool"], r["allowed"]) for r in rows} == {
        ("bot", "notes.create", True), ("bot", "notes.list", True)}  # fmt: skip
    assert alice.delete("/v1/assignments/bot/notes.list").json() == {"revoked": True}
    assert alice.delete("/v1/assignments/bot/notes.list").json() == {"revoked": False}
    assert [t["name"] for t in world.bot.get("/v1/agent/tools").json()["tools"]] == ["notes.create"]


def test_invocations_filter_and_page_by_keyset(world: World) -> None:
    ids = [invoke(world.bot, "notes.create", {"text": f"n{i}"})["id"] for i in range(5)]
    ids.reverse()  # newest first
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2, "tool": "notes.create", "status": "pending"}
        if cursor:
            params["cursor"] = cursor
        page = world.alice.get("/v1/invocations", params=params).json()
        seen += [i["id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    assert world.alice.get("/v1/invocations", params={"agent": "nobody"}).json()["items"] == []
    by_agent = world.alice.get("/v1/invocations", params={"agent": str(world.bot.agent_id)})
    assert len(by_agent.json()["items"]) == 5
    assert world.alice.get("/v1/invocations", params={"status": "completed"}).json()["items"] == []
    bad = world.alice.get("/v1/invocations", params={"cursor": "not-a-cursor"})
    assert error_of(bad) == (422, "invalid_argument")
    detail = world.alice.get(f"/v1/invocations/{ids[0]}").json()
    assert detail["attempts"] == [] and detail["tool_key"] == "notes.create"


# --- tokens and errors ------------------------------------------------------------------------


def test_tokens_list_and_revoke_stop_a_token_at_once(world: World, api: str) -> None:
    tokens = world.alice.get("/v1/tokens").json()["items"]
    assert {t["kind"] for t in tokens} == {"owner", "agent"}
    assert all("token" not in t for t in tokens)
    agent_token = next(t for t in tokens if t["kind"] == "agent")
    assert world.bot.get("/v1/me").status_code == 200
    assert world.alice.delete(f"/v1/tokens/{agent_token['id']}").json() == {"revoked": True}
    assert error_of(world.bot.get("/v1/me")) == (401, "unauthenticated")
    assert world.bot.get("/v1/me").headers["WWW-Authenticate"].startswith("Bearer")
    assert error_of(world.bob.delete(f"/v1/tokens/{agent_token['id']}")) == (404, "not_found")


def test_errors_are_json_with_stable_codes(api: str, world: World) -> None:
    anonymous = httpx.Client(base_url=api)
    assert error_of(anonymous.get("/v1/tools")) == (401, "unauthenticated")
    bad = anonymous.get("/v1/tools", headers={"Authorization": "Bearer trk_nope"})
    assert error_of(bad) == (401, "unauthenticated")
    assert error_of(anonymous.get("/v1/nothing-here")) == (404, "not_found")
    assert error_of(world.alice.delete("/v1/tools")) == (405, "method_not_allowed")
    not_json = world.alice.post(
        "/v1/agents", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert error_of(not_json) == (422, "invalid_request")
    assert error_of(world.alice.get("/v1/invocations/not-a-uuid")) == (422, "invalid_request")
    assert error_of(world.alice.post("/v1/agents", json={"name": "a\x00b"}))[0] == 422


def test_request_bodies_over_one_mebibyte_get_413(world: World) -> None:
    big = {"tool": "notes.create", "input": {"text": "x" * (1024 * 1024)}}
    assert error_of(world.bot.post("/v1/agent/invocations", json=big)) == (413, "payload_too_large")

    def chunks() -> Any:
        for _ in range(20):
            yield b" " * 65536  # streamed without a Content-Length

    streamed = world.bot.post(
        "/v1/agent/invocations", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert error_of(streamed) == (413, "payload_too_large")
