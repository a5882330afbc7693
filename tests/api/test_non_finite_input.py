"""A number JSON cannot carry in a call's input is refused at the door naming the problem.

Python's JSON parser reads ``NaN``, ``Infinity`` and ``1e400`` (as infinity); PostgreSQL's
jsonb holds none of them. The insert failed and the agent read PostgreSQL's words,
"invalid input syntax for type json", which name neither the value nor where it was.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.api.conftest import Client, agent_client
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import count_invocations
from toolrelay.db import Database


@pytest.fixture
def agent(make_owner: Callable[[], Client], upstream: Upstream, api: str) -> Client:
    owner = make_owner()
    tool = {"name": "Echo", "endpoint_url": f"{upstream.base_url}/echo", "http_method": "POST",
            "egress_class": "read_only"}  # fmt: skip
    assert owner.put("/v1/tools/echo", json=tool).status_code == 200
    bot = agent_client(api, owner, "bot")
    assert owner.put("/v1/assignments/bot/echo").status_code == 200
    return bot


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "[-1e999]"])
def test_a_number_json_cannot_carry_is_named(agent: Client, db: Database, number: str) -> None:
    answer = agent.post(
        "/v1/agent/invocations",
        content='{"tool": "echo", "input": {"amount": ' + number + "}}",
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_input"
    assert "NaN" in error["message"] and "Infinity" in error["message"], error["message"]
    assert count_invocations(db, agent.owner) == 0
