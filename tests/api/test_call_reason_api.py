"""The agent's stated reason through the API, shown on the approvals page escaped (issue 16,
item 5; the registry's own tests: tests/registry/test_call_reason.py)."""

from __future__ import annotations

from tests.api.conftest import Client, agent_client
from tests.security.test_approvals_spoofing import escape_of, signed_in


def test_the_api_takes_it_and_the_page_shows_it_escaped(make_owner: object, api: str) -> None:
    owner: Client = make_owner()  # type: ignore[operator]
    made = owner.post("/v1/tools", json={
        "key": "notes.create", "name": "notes", "endpoint_url": "http://127.0.0.1:9/n",
        "http_method": "POST", "egress_class": "write",
        "schema_input": {"type": "object", "properties": {"text": {"type": "string"}}},
    })  # fmt: skip
    assert made.status_code == 201, made.text
    bot = agent_client(api, owner, "bot")
    assert owner.put("/v1/assignments/bot/notes.create").status_code in (200, 201)
    reason = "<b>urgent</b> \u202eevil"
    call = bot.post(
        "/v1/agent/invocations",
        json={"tool": "notes.create", "input": {"text": "x"}, "reason": reason},
    )
    assert call.status_code == 202 and call.json()["reason"] == reason
    with signed_in(api, owner.token) as http:
        html = http.get("/approvals/queue").text
    card = html.split(f'data-invocation="{call.json()["id"]}"', 1)[1]
    assert '<p class="reason" data-part="reason"><span class="label">The agent\'s reason:' in card
    assert "&lt;b&gt;urgent&lt;/b&gt;" in card and "<b>urgent</b>" not in card
    assert escape_of("\u202e") in card  # the bidi override drawn as a marked escape
