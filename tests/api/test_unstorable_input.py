"""What the worker cannot follow or PostgreSQL cannot store is refused at the door, with a
clear error and nothing made: an input nested deeper than the bound (one level over it is
the input's 422; far past what the JSON parser reads, the body's 400), an input holding a
NUL or an unpaired surrogate, and such a surrogate in any other text."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from tests.api.conftest import Client, agent_client
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import count_invocations
from toolrelay.db import Database
from toolrelay.registry.validation import MAX_JSON_DEPTH


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def bot(make_owner: Callable[[], Client], upstream: Upstream, api: str) -> tuple[Client, Client]:
    """An owner, and its agent ``bot`` assigned the tool ``echo``."""
    owner = make_owner()
    tool = {"name": "Echo", "endpoint_url": f"{upstream.base_url}/echo", "http_method": "POST",
            "egress_class": "read_only"}  # fmt: skip
    assert owner.put("/v1/tools/echo", json=tool).status_code == 200
    agent = agent_client(api, owner, "bot")
    assert owner.put("/v1/assignments/bot/echo").status_code == 200
    return owner, agent


def call(agent: Client, body: str) -> httpx.Response:
    """``body`` as sent, byte for byte (no client re-encodes it)."""
    return agent.post(
        "/v1/agent/invocations", content=body, headers={"Content-Type": "application/json"}
    )


@pytest.mark.parametrize(
    ("depth", "status", "says"),
    [(MAX_JSON_DEPTH, 422, f"more than {MAX_JSON_DEPTH} levels deep"),  # with {"x": ...}
     (100_000, 400, "error parsing the body")],
)  # fmt: skip
def test_an_input_nested_too_deep_makes_no_call(
    depth: int,
    status: int,
    says: str,
    bot: tuple[Client, Client],
    db: Database,
) -> None:
    owner, agent = bot
    answer = call(agent, '{"tool": "echo", "input": {"x": ' + nested(depth) + "}}")
    assert answer.status_code == status, answer.text[:500]
    assert says in answer.json()["error"]["message"]
    assert count_invocations(db, owner.owner) == 0


def test_an_input_jsonb_cannot_hold_makes_no_call(bot: tuple[Client, Client], db: Database) -> None:
    """PostgreSQL stores no U+0000 and no unpaired surrogate: the door says so (422), rather
    than the insert failing."""
    owner, agent = bot
    for value in ({"x": "a\u0000b"}, {"a\u0000b": 1}, {"x": ["a\ud800"]}):
        # json.dumps escapes to ASCII: "\\u0000", "\\ud800" as a client would send them
        answer = call(agent, json.dumps({"tool": "echo", "input": value}))
        assert answer.status_code == 422, answer.text[:500]
        assert "NUL" in answer.json()["error"]["message"]
    assert count_invocations(db, owner.owner) == 0


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/agents", '{"name": "bot\\udc80"}'),
     ("/v1/tools/echo.two", '{"name": "Echo \\ud800", "endpoint_url": "https://api.example.com/",'
                            ' "http_method": "GET"}')],
)  # fmt: skip
def test_an_unpaired_surrogate_anywhere_is_the_callers_422(
    path: str, body: str, make_owner: Callable[[], Client]
) -> None:
    """Any text field, not only an input: psycopg cannot encode the str, before anything is
    sent; that was a 500 (and the connection dropped)."""
    owner = make_owner()
    method = owner.post if path == "/v1/agents" else owner.put
    answer = method(path, content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text[:300]
    assert "unpaired surrogate" in answer.json()["error"]["message"]
    assert owner.get("/v1/agents").json()["items"] == []
    assert owner.get("/v1/tools").status_code == 200  # the connection is still good
