"""A call `serve` hands its worker for a tool at its max_concurrency waits in the queue,
not in one of the worker's slots (tests/dispatch/test_tool_room.py for claimed calls).

Before, every such call took a slot and waited there for the tool: an agent making calls
of a slow, limited tool filled the in-process worker, and every other call made through
the process, any owner's, was left for another worker that a `serve`-only deployment does
not have.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from tests.api.conftest import agent_client, held_read, settings
from tests.api.gates import until
from tests.api.servers import serve_app
from tests.dispatch.upstream import Upstream
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.dispatch.worker import Worker, WorkerSettings

SLOTS = 4


@pytest.fixture(scope="module")
def app(database_url: str, keyring: Keyring) -> FastAPI:
    worker = WorkerSettings(concurrency=SLOTS, lease_seconds=5.0, poll_interval=30.0)
    return create_app(settings(database_url, keyring, worker=worker))


@pytest.fixture(scope="module")
def api(app: FastAPI) -> Iterator[str]:
    with serve_app(app) as url:
        yield url


def leases(database_url: str, ids: list[str]) -> list[tuple[Any, int]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT lease_owner, attempt FROM agents.tool_invocations WHERE id = ANY(%s)"
            " ORDER BY created_at",
            (ids,),
        ).fetchall()
    return [(owner, attempt) for owner, attempt in rows]


def test_calls_of_a_full_tool_wait_in_the_queue_and_other_calls_go_on(
    app: FastAPI, api: str, make_owner: Any, upstream: Upstream, database_url: str
) -> None:
    worker = app.state.toolrelay.handoff.worker
    assert isinstance(worker, Worker)
    assert until(lambda: worker.taking_hand_offs)
    limited_owner = make_owner()
    bot, gate, path = held_read(limited_owner, upstream, api)
    limited = limited_owner.patch("/v1/tools/read", json={"max_concurrency": 1})
    assert limited.status_code == 200, limited.text
    other_owner = make_owner()
    tool = {"name": "quick", "endpoint_url": f"{upstream.base_url}/quick", "http_method": "GET",
            "egress_class": "read_only"}  # fmt: skip
    assert other_owner.put("/v1/tools/quick", json=tool).status_code == 200
    other_bot = agent_client(api, other_owner, "bot")
    assert other_owner.put("/v1/assignments/bot/quick").status_code == 200
    try:
        calls = []
        for _ in range(SLOTS):
            made = bot.post("/v1/agent/invocations", json={"tool": "read", "input": {}})
            assert made.status_code == 202, made.text
            calls.append(made.json()["id"])
        assert until(lambda: upstream.hits[path] == 1)
        # the three not sending were handed back: unclaimed, as if never claimed
        assert until(lambda: leases(database_url, calls)[1:] == [(None, 0)] * (SLOTS - 1))
        assert worker.sending == 1
        quick = other_bot.post(
            "/v1/agent/invocations", json={"tool": "quick", "input": {}}, params={"wait": 10}
        )
        assert quick.status_code in (200, 202), quick.text
        assert quick.json()["status"] == "completed", quick.json()
        assert upstream.hits[path] == 1  # still one at a time
    finally:
        gate.open()
    for call in calls:  # the worker claims each once the tool has room
        done = bot.get(f"/v1/agent/invocations/{call}", params={"wait": 10}).json()
        assert done["status"] == "completed", done
        assert len(done["attempts"]) == 1
    assert upstream.hits[path] == SLOTS
