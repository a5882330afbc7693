"""An agent token serve has seen is not looked up again for a call: the call's own
transaction checks it (migration 0039). Whatever ends the token between two calls (its
revocation, its expiry, its agent disabled) must stop the next call as the lookup did: a
401, and no invocation made."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest

from tests.api.conftest import Client, agent_client
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import count_invocations
from toolrelay.db import Database

WAIT = {"wait": "10"}


@pytest.fixture
def bot(make_owner: Callable[[], Client], upstream: Upstream, api: str) -> tuple[Client, Client]:
    """An owner, and its agent ``bot`` with a read tool ``echo`` (the upstream echoes) that
    it has called once, so that serve remembers its token."""
    owner = make_owner()
    tool = {"name": "Echo", "endpoint_url": f"{upstream.base_url}/echo", "http_method": "GET",
            "egress_class": "read_only"}  # fmt: skip
    assert owner.put("/v1/tools/echo", json=tool).status_code == 200
    agent = agent_client(api, owner, "bot")
    assert owner.put("/v1/assignments/bot/echo").status_code == 200
    first = agent.post("/v1/agent/invocations", json={"tool": "echo"}, params=WAIT)
    assert first.status_code == 202 and first.json()["status"] == "completed", first.text
    return owner, agent


def _refused(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "unauthenticated"
    return error


def test_a_revoked_token_makes_no_call(bot: tuple[Client, Client], db: Database) -> None:
    owner, agent = bot
    assert agent.agent_id is not None
    made = count_invocations(db, owner.owner)
    token_id = next(
        t["id"] for t in owner.get("/v1/tokens").json()["items"] if t["kind"] == "agent"
    )
    assert owner.delete(f"/v1/tokens/{token_id}").json() == {"revoked": True}

    # the call's own check refuses it: no row, as when every request looked the token up
    refused = agent.post("/v1/agent/invocations", json={"tool": "echo"}, params=WAIT)
    assert "revoked" in _refused(refused)["message"]
    assert count_invocations(db, owner.owner) == made
    # and forgotten: the next request is refused by the lookup itself
    _refused(agent.get("/v1/agent/tools"))
    _refused(agent.post("/v1/agent/invocations", json={"tool": "echo"}, params=WAIT))
    assert count_invocations(db, owner.owner) == made


def test_a_disabled_agents_token_makes_no_call(bot: tuple[Client, Client], db: Database) -> None:
    owner, agent = bot
    assert agent.agent_id is not None
    made = count_invocations(db, owner.owner)
    with psycopg.connect(db.url) as conn:
        conn.execute(
            "UPDATE agents.agents SET status = 'disabled' WHERE id = %s", (agent.agent_id,)
        )
    _refused(agent.post("/v1/agent/invocations", json={"tool": "echo"}, params=WAIT))
    assert count_invocations(db, owner.owner) == made


def test_an_expired_token_makes_no_call(bot: tuple[Client, Client], db: Database) -> None:
    """A token that expires between two calls: nothing but the clock changed, so only the
    check's own ``expires_at > now()`` can refuse it."""
    owner, agent = bot
    assert agent.agent_id is not None
    made = count_invocations(db, owner.owner)
    with psycopg.connect(db.url) as conn:
        expired = conn.execute(
            "UPDATE agents.api_tokens SET expires_at = now() - interval '1 second'"
            " WHERE agent_id = %s",
            (agent.agent_id,),
        ).rowcount
    assert expired == 1
    _refused(agent.post("/v1/agent/invocations", json={"tool": "echo"}, params=WAIT))
    assert count_invocations(db, owner.owner) == made


def _remembered_token(owner: Client, api: str, name: str) -> tuple[httpx.Client, str]:
    """A new token of ``bot`` that has made a call (serve remembers it), and its id."""
    made = owner.post("/v1/tokens", json={"agent": "bot", "name": name}).json()
    other = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {made['token']}"})
    done = other.post("/v1/agent/invocations", json={"tool": "echo"}, params=WAIT)
    assert done.json()["status"] == "completed", done.text
    return other, made["id"]


# An unknown tool: the lookup's trip says so. A control character in the reason: refused
# before any trip is made (Registry's _reason), so the check makes a trip of its own.
@pytest.mark.parametrize(
    ("body", "live_answer"),
    [
        ({"tool": "no.such.tool"}, 403),
        ({"tool": "echo", "reason": "a\x01b"}, 422),
        # an exported name, which the door maps to a key by reading the agent's tools
        ({"tool": "no__such_tool"}, 403),
    ],
)
def test_a_refused_token_learns_nothing_of_the_call(
    body: dict[str, Any], live_answer: int, bot: tuple[Client, Client], api: str
) -> None:
    """A call the door would refuse for what it asks is still checked first: a revoked
    token hears 401, not what a live one hears."""
    owner, _ = bot
    live, _ = _remembered_token(owner, api, "live")
    revoked, token_id = _remembered_token(owner, api, "revoked")
    try:
        assert owner.delete(f"/v1/tokens/{token_id}").json() == {"revoked": True}
        _refused(revoked.post("/v1/agent/invocations", json=body, params=WAIT))
        answer = live.post("/v1/agent/invocations", json=body, params=WAIT)
        assert answer.status_code == live_answer, answer.text
    finally:
        live.close()
        revoked.close()


def test_a_live_token_still_calls_after_another_is_revoked(
    bot: tuple[Client, Client], api: str, db: Database
) -> None:
    owner, agent = bot
    other, token_id = _remembered_token(owner, api, "second")
    try:
        assert owner.delete(f"/v1/tokens/{token_id}").json() == {"revoked": True}
        _refused(other.post("/v1/agent/invocations", json={"tool": "echo"}, params=WAIT))
    finally:
        other.close()
    done = agent.post("/v1/agent/invocations", json={"tool": "echo"}, params=WAIT)
    assert done.status_code == 202 and done.json()["status"] == "completed", done.text
