"""An agent keeps at most MAX_PENDING calls waiting for approval (migration 0049).

An agent runs model output. Each call to a gated tool is stored with its input (up to
1 MiB) until a person decides or it expires (24 h by default), so an agent looping on one
could store 20 calls a second, 1.7 million a day, filling the database and burying every
other call on the approvals page. Past the cap its next gated call is refused (429
`too_many_pending`, naming the cap) until people decide some; its calls that need no
approval, and other agents, go on."""

from __future__ import annotations

from tests.api.conftest import Client, agent_client
from toolrelay.db import Database

MAX_PENDING = 1000
GATED = {"http_method": "POST", "egress_class": "write"}


def tool(owner: Client, key: str, **fields: object) -> None:
    made = owner.post("/v1/tools", json={
        "key": key, "name": key, "endpoint_url": "http://127.0.0.1:9/x",
        "schema_input": {"type": "object"}, **fields,
    })  # fmt: skip
    assert made.status_code == 201, made.text


def test_an_agent_cannot_bury_the_approvals_queue(
    make_owner: object, api: str, db: Database
) -> None:
    owner: Client = make_owner()  # type: ignore[operator]
    tool(owner, "notes.create", **GATED)
    tool(owner, "notes.read", http_method="GET", egress_class="read_only")
    bot, other = agent_client(api, owner, "bot"), agent_client(api, owner, "other")
    for agent in ("bot", "other"):
        for key in ("notes.create", "notes.read"):
            assert owner.put(f"/v1/assignments/{agent}/{key}").status_code in (200, 201)
    agents = {a["name"]: a["id"] for a in owner.get("/v1/agents").json()["items"]}
    tools = {t["key"]: t["id"] for t in owner.get("/v1/tools").json()["items"]}
    with db.as_owner(owner.owner, agent_id=agents["bot"]) as conn:  # the fast way to 1,000
        conn.execute(
            "SELECT fn_invoke_tool(%s, %s, '{}') FROM generate_series(1, %s)",
            (agents["bot"], tools["notes.create"], MAX_PENDING - 1),
        )
    call = {"tool": "notes.create", "input": {}}
    last = bot.post("/v1/agent/invocations", json=call)
    assert last.status_code == 202, last.text  # the thousandth
    refused = bot.post("/v1/agent/invocations", json=call)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "too_many_pending"
    assert "1000 calls waiting for approval" in refused.json()["error"]["message"]
    read = bot.post("/v1/agent/invocations", json={"tool": "notes.read", "input": {}})
    assert read.status_code == 202, read.text  # needs no approval: not counted, not refused
    assert other.post("/v1/agent/invocations", json=call).status_code == 202
    assert owner.post(f"/v1/invocations/{last.json()['id']}/reject", json={}).status_code == 200
    assert bot.post("/v1/agent/invocations", json=call).status_code == 202  # room again
