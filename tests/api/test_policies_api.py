"""/v1/policies and `toolrelay policy` (issue 16, item 5): an admin's rule decides an agent's
call made through the API, and the owner's view of the call names the rule."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

from tests.api.conftest import Client, agent_client
from tests.api.test_api import error_of
from tests.api.test_members_api import invite
from tests.interop.conftest import runner
from toolrelay.cli.main import app as cli
from toolrelay.db import Database
from toolrelay.registry import Registry, ToolSpec

SMALL = {"properties": {"amount": {"maximum": 100}}}


def gated_tool(owner: Client) -> None:
    made = owner.post("/v1/tools", json={
        "key": "pay.send", "name": "pay", "endpoint_url": "http://127.0.0.1:9/pay",
        "http_method": "POST", "egress_class": "write", "requires_approval": True,
        "schema_input": {"type": "object", "properties": {"amount": {"type": "integer"}}},
    })  # fmt: skip
    assert made.status_code == 201, made.text


def test_a_rule_decides_an_agents_api_call(make_owner: Callable[[], Client], api: str) -> None:
    tenant = make_owner()
    gated_tool(tenant)
    bot = agent_client(api, tenant, "bot")
    assert tenant.put("/v1/assignments/bot/pay.send").status_code in (200, 201)
    approver = invite(tenant, api, "Ann", "approver")
    refused = approver.post(
        "/v1/policies",
        json={"tool": "pay.send", "name": "small", "action": "approve", "input_schema": SMALL},
    )
    assert error_of(refused) == (403, "permission_denied")
    rule = tenant.post(
        "/v1/policies",
        json={"tool": "pay.send", "name": "small", "action": "approve", "input_schema": SMALL},
    )
    assert rule.status_code == 201, rule.text
    assert [p["name"] for p in approver.get("/v1/policies?tool=pay.send").json()["items"]] == [
        "small"]  # fmt: skip
    small = bot.post("/v1/agent/invocations", json={"tool": "pay.send", "input": {"amount": 5}})
    large = bot.post("/v1/agent/invocations", json={"tool": "pay.send", "input": {"amount": 500}})
    assert small.status_code == 202 and large.status_code == 202
    seen = tenant.get(f"/v1/invocations/{small.json()['id']}").json()
    assert (seen["approval_status"], seen["decided_by_policy"], seen["decided_by"]) == (
        "approved", rule.json()["id"], None,
    )  # fmt: skip
    assert large.json()["status"] == "pending"
    bad = tenant.post(
        "/v1/policies",
        json={"tool": "pay.send", "name": "x", "action": "approve", "input_schema": {"type": 7}},
    )
    assert error_of(bad)[0] == 422
    assert tenant.delete(f"/v1/policies/{rule.json()['id']}").status_code == 204
    assert tenant.get("/v1/policies").json() == {"items": []}


def test_the_policy_cli(cli_owner: uuid.UUID, db: Database) -> None:
    Registry(db, cli_owner).register_tool(ToolSpec.from_mapping({
        "key": "pay.send", "name": "pay", "endpoint_url": "https://api.example.com/pay",
        "http_method": "POST", "egress_class": "write"}))  # fmt: skip
    both = runner.invoke(cli, ["policy", "add", "pay.send", "x", "--approve-if", "{}",
                               "--reject-if", "{}"])  # fmt: skip
    assert both.exit_code == 1 and "exactly one of --approve-if and --reject-if" in both.stderr
    notjson = runner.invoke(cli, ["policy", "add", "pay.send", "x", "--reject-if", "{nope"])
    assert notjson.exit_code == 1 and notjson.stderr.startswith("error: the schema is not JSON")
    made = runner.invoke(
        cli,
        [
            "policy",
            "add",
            "pay.send",
            "no ceo",
            "-o",
            "json",
            "--reject-if",
            json.dumps({"properties": {"to": {"const": "ceo"}}}),
        ],
    )
    assert made.exit_code == 0, made.output
    rule = json.loads(made.stdout)
    assert (rule["name"], rule["action"], rule["tool_key"]) == ("no ceo", "reject", "pay.send")
    listed = json.loads(runner.invoke(cli, ["policy", "list", "-o", "json"]).stdout)["items"]
    assert [p["id"] for p in listed] == [rule["id"]]
    gone = runner.invoke(cli, ["policy", "remove", rule["id"]])
    assert gone.stdout.strip() == f"removed policy {rule['id']}"


def test_a_stale_rule_is_shown_and_confirmed_by_the_cli(cli_owner: uuid.UUID, db: Database) -> None:
    registry = Registry(db, cli_owner)
    gated = {"key": "pay.send", "name": "pay", "endpoint_url": "https://api.example.com/pay",
             "http_method": "POST", "egress_class": "write"}  # fmt: skip
    registry.register_tool(ToolSpec.from_mapping(gated))
    made = runner.invoke(cli, ["policy", "add", "pay.send", "small", "-o", "json",
                               "--approve-if", json.dumps(SMALL)])  # fmt: skip
    assert made.exit_code == 0, made.output
    rule = json.loads(made.stdout)
    assert rule["current"] is True
    registry.update_tool("pay.send", {"endpoint_url": "https://elsewhere.example.com/pay"})
    listed = json.loads(runner.invoke(cli, ["policy", "list", "-o", "json"]).stdout)["items"]
    assert [p["current"] for p in listed] == [False]
    confirmed = runner.invoke(cli, ["policy", "confirm", rule["id"], "-o", "json"])
    assert confirmed.exit_code == 0, confirmed.output
    assert json.loads(confirmed.stdout)["current"] is True


def test_a_stale_rule_is_confirmed_through_the_api(make_owner: Callable[[], Client]) -> None:
    tenant = make_owner()
    gated_tool(tenant)
    rule = tenant.post(
        "/v1/policies",
        json={"tool": "pay.send", "name": "small", "action": "approve", "input_schema": SMALL},
    ).json()
    moved = tenant.patch("/v1/tools/pay.send", json={"endpoint_url": "http://127.0.0.1:9/other"})
    assert moved.status_code == 200, moved.text
    (stale,) = tenant.get("/v1/policies").json()["items"]
    assert (stale["current"], stale["in_force"], stale["confirmations"]) == (False, False, 0)
    confirmed = tenant.post(f"/v1/policies/{rule['id']}/confirm")
    assert confirmed.status_code == 200 and confirmed.json()["current"] is True
    assert (confirmed.json()["in_force"], confirmed.json()["confirmations_needed"]) == (True, 1)
    assert error_of(tenant.post(f"/v1/policies/{uuid.uuid4()}/confirm")) == (404, "not_found")
