"""`GET /v1/agent/invocations/{id}?wait=N` wakes on the outcome, not on a poll.

The app here polls only every 30 s while nobody listens, so an answer within a second
can only come from the outcome's NOTIFY (the worker's `finish`, or migration 0017's trigger
on a decision)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI

from tests.api.conftest import Client, agent_client, settings
from tests.api.gates import Gate, until, until_async
from tests.api.servers import serve_app
from tests.dispatch.upstream import Upstream
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.dispatch.outcomes import Outcomes
from toolrelay.registry import Registry

SLOW_POLL = 30.0  # seconds: far above every bound below
WAKE_LIMIT = 1.0  # seconds from the outcome to the answer


@pytest.fixture(scope="module")
def app(database_url: str, keyring: Keyring) -> FastAPI:
    return create_app(settings(database_url, keyring, wait_poll_seconds=SLOW_POLL))


@pytest.fixture(scope="module")
def api(app: FastAPI) -> Iterator[str]:  # the conftest's owners and agents talk to this app
    with serve_app(app) as url:
        yield url


@dataclass
class World:
    owner: Client
    bot: Client
    gate: Gate
    outcomes: Outcomes


@pytest.fixture
def world(api: str, app: FastAPI, make_owner: Any, upstream: Upstream) -> Iterator[World]:
    owner, gate = make_owner(), Gate()
    path = f"/held/{uuid.uuid4().hex}"
    upstream.routes[path] = gate.handler
    url = f"{upstream.base_url}{path}"
    for key, method, egress in (("read", "GET", "read_only"), ("write", "POST", "write")):
        body = {"name": key, "endpoint_url": url, "http_method": method, "egress_class": egress}
        assert owner.put(f"/v1/tools/{key}", json=body).status_code == 200
    bot = agent_client(api, owner, "bot")
    for key in ("read", "write"):
        assert owner.put(f"/v1/assignments/bot/{key}").status_code == 200
    yield World(owner, bot, gate, app.state.toolrelay.outcomes)
    gate.open()  # never leave a request held


def invoke(bot: Client, key: str) -> str:
    response = bot.post("/v1/agent/invocations", json={"tool": key, "input": {}})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def wait_on(pool: ThreadPoolExecutor, world: World, invocation_id: str) -> Any:
    """``?wait=10`` in another thread, returned once the app's waiter is registered."""
    future = pool.submit(
        lambda: world.bot.get(f"/v1/agent/invocations/{invocation_id}", params={"wait": 10})
    )
    assert until(lambda: world.outcomes.waiting(uuid.UUID(invocation_id)))
    return future


def test_a_read_answers_within_a_second_of_the_upstream(world: World) -> None:
    invocation_id = invoke(world.bot, "read")
    with ThreadPoolExecutor(1) as pool:
        future = wait_on(pool, world, invocation_id)
        world.gate.open()
        body = future.result().json()
    assert world.gate.answered_at is not None
    assert time.monotonic() - world.gate.answered_at < WAKE_LIMIT
    assert body["status"] == "completed", body


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_pending_calls_wait_ends_right_after_the_decision(world: World, decision: str) -> None:
    invocation_id = invoke(world.bot, "write")
    world.gate.open()  # once approved, the upstream answers at once
    with ThreadPoolExecutor(1) as pool:
        future = wait_on(pool, world, invocation_id)
        decided = world.owner.post(f"/v1/invocations/{invocation_id}/{decision}")
        assert decided.status_code == 200, decided.text
        decided_at = time.monotonic()
        body = future.result().json()
    assert time.monotonic() - decided_at < WAKE_LIMIT
    assert body["status"] == ("completed" if decision == "approve" else "rejected"), body


class Recording(Outcomes):
    """Outcomes that also tell the test which ids its listener was told about."""

    def __init__(self, url: str) -> None:
        super().__init__(url, fallback_poll=SLOW_POLL)
        self.told: set[str] = set()

    def wake(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        self.told.update(ids)
        super().wake(ids)


async def test_an_outcome_landing_during_the_first_read_is_not_lost(
    world: World, database_url: str, db: Database
) -> None:
    """The outcome's NOTIFY arrives after the waiter's first read saw 'running' but before
    it waits: the waiter must still wake at once (it registered before reading)."""
    invocation_id = invoke(world.bot, "read")
    registry = Registry(db, world.owner.owner)
    outcomes = Recording(database_url)
    reads: list[str] = []

    async def read() -> dict[str, Any]:
        assert await until_async(lambda: outcomes.listening)
        row = await asyncio.to_thread(registry.get_invocation, invocation_id)
        reads.append(row["status"])
        if len(reads) == 1:  # the outcome lands now, after this read's snapshot
            world.gate.open()
            assert await until_async(lambda: invocation_id in outcomes.told)
        return row

    try:
        row = await outcomes.wait_for(
            uuid.UUID(invocation_id), read, lambda r: r["status"] == "completed", 10.0
        )
        told_at = time.monotonic()
    finally:
        await outcomes.close()
    assert reads == ["running", "completed"]
    assert row["status"] == "completed"
    assert world.gate.answered_at is not None and told_at - world.gate.answered_at < WAKE_LIMIT


async def test_a_waiter_that_skips_its_first_read_still_sees_an_outcome_told_before(
    world: World, database_url: str, db: Database
) -> None:
    """MCP's tools/call skips the first read of the call it just made when the listener has
    listened since before: an outcome told before the waiter registers must not be lost."""
    registry = Registry(db, world.owner.owner)
    outcomes = Recording(database_url)
    reads: list[str] = []

    async def read() -> dict[str, Any]:
        row = await asyncio.to_thread(registry.get_invocation, invocation_id)
        reads.append(row["status"])
        return row

    try:
        outcomes.mark()  # starts the listener
        assert await until_async(lambda: outcomes.listening)
        mark = outcomes.mark()
        invocation_id = await asyncio.to_thread(invoke, world.bot, "read")
        world.gate.open()
        assert await until_async(lambda: invocation_id in outcomes.told)
        started = time.monotonic()
        row = await outcomes.wait_for(
            uuid.UUID(invocation_id),
            read,
            lambda r: r["status"] == "completed",
            10.0,
            unread_since=mark,
        )
    finally:
        await outcomes.close()
    assert time.monotonic() - started < WAKE_LIMIT
    assert reads == ["completed"] and row["status"] == "completed"
