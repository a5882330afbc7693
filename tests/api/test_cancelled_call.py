"""A call whose request is cancelled while its insert is on the wire is still handed to
serve's worker (dispatch/handoff.py ``HandOff.make``).

The door inserts the call already claimed for its in-process worker (migration 0036) and
tells the worker once the insert returns. A request cancelled in between (a client gone,
a shutdown; asyncio's cancel or anyio's) used to skip the telling: the committed call sat
claimed for a worker that never heard of it until its lease ran out. Here the database's
answer to the insert is held on the wire (tests/dispatch/heldpipe.py) after it committed,
the request is cancelled, and the call must still be sent at once, by that worker, once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import psycopg
import pytest

from tests.api.conftest import settings
from tests.api.gates import until_async
from tests.api.test_claim_at_invoke import registry_with_read, run_until
from tests.dispatch.heldpipe import held_pipe
from tests.dispatch.upstream import Upstream
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.tokens import TokenStore

LEASE = 120.0  # seconds: a call left to its lease is not done within SENT_WITHIN
SENT_WITHIN = 15.0  # seconds from the cancel to the call done
SHUTDOWN_GRACE = 2.0  # seconds a shutdown that does not wait takes at most, with margin
STUCK_BOUND = 1.0  # seconds a shutdown waits for calls still being made, in the last test


def agent_of(db: Database, upstream: Upstream) -> tuple[str, str, str]:
    """A new owner's agent with `read`, a GET to a path of its own: (token, path, owner)."""
    agent, path = registry_with_read(db, upstream)
    assert agent.agent_id is not None
    _, token = TokenStore(db).create(agent.owner, agent.agent_id, name="bot")
    return token, path, str(agent.owner)


async def taking_hand_offs(app: Any) -> Worker:
    """serve's worker, once it takes hand-offs (before, calls are made unclaimed and any
    worker's claim takes them: not the case tried here)."""
    worker = app.state.toolrelay.handoff.worker
    assert isinstance(worker, Worker)
    assert await until_async(lambda: worker.taking_hand_offs)
    return worker


async def released_and_sent(pipe: Any, database_url: str, owner: str, worker_id: str) -> None:
    """The cancelled call is committed, claimed for ``worker_id``; once the database's
    answer is let through, it is sent well within its lease."""
    [(status, _, lease_owner)] = await asyncio.to_thread(calls_of, database_url, owner)
    assert (status, lease_owner) == ("running", worker_id)  # committed
    cancelled_at = time.monotonic()
    pipe.release()
    while (await asyncio.to_thread(calls_of, database_url, owner))[0][0] == "running":
        assert time.monotonic() - cancelled_at < SENT_WITHIN, "left to its lease"
        await asyncio.sleep(0.02)


def calls_of(database_url: str, owner: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT status, attempt, lease_owner FROM agents.tool_invocations WHERE owner = %s",
            (owner,),
        ).fetchall()


@pytest.fixture
async def piped(database_url: str) -> AsyncIterator[Any]:
    async with held_pipe(database_url, b"fn_invoke_tool") as made:
        yield made


async def cancel_natively(request: Callable[[], Any], held: asyncio.Event) -> None:
    task = asyncio.ensure_future(request())
    await held.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def cancel_by_scope(request: Callable[[], Any], held: asyncio.Event) -> None:
    """As the MCP SDK cancels a request's handler: its anyio cancel scope."""
    async with anyio.create_task_group() as group:
        group.start_soon(request)
        await held.wait()
        group.cancel_scope.cancel()


@pytest.mark.parametrize("cancel", [cancel_natively, cancel_by_scope])
async def test_a_call_cancelled_after_its_insert_committed_is_sent_at_once(
    cancel: Callable[..., Any],
    piped: Any,
    database_url: str,
    db: Database,
    keyring: Keyring,
    upstream: Upstream,
) -> None:
    pipe, piped_url = piped
    token, path, owner = await asyncio.to_thread(agent_of, db, upstream)
    worker = WorkerSettings(concurrency=4, lease_seconds=LEASE, poll_interval=LEASE)
    app = create_app(settings(piped_url, keyring, worker=worker))
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://toolrelay", headers=headers) as c,
    ):
        in_process = await taking_hand_offs(app)

        async def request() -> None:
            await c.post("/v1/agent/invocations", json={"tool": "read", "input": {}})

        await cancel(request, pipe.held)
        await released_and_sent(pipe, database_url, owner, in_process.settings.worker_id)
        assert in_process.reserved == 0
    [(status, attempt, _)] = await asyncio.to_thread(calls_of, database_url, owner)
    assert (status, attempt) == ("completed", 1)  # by the worker it was made for, at once
    assert upstream.hits[path] == 1


async def cancelled_under_lifespan(
    app: Any, token: str, pipe: Any
) -> tuple[asyncio.Event, asyncio.Future[None]]:
    """The app's lifespan running in a task of its own (its scopes are entered and left in
    one task) and a call to it cancelled once the insert's answer is held: the event that
    begins its shutdown, and the task."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def serving() -> None:
        async with app.router.lifespan_context(app):
            started.set()
            await stop.wait()

    life = asyncio.ensure_future(serving())
    await started.wait()
    await taking_hand_offs(app)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://toolrelay", headers=headers
    ) as c:

        async def request() -> None:
            await c.post("/v1/agent/invocations", json={"tool": "read", "input": {}})

        await cancel_natively(request, pipe.held)
    return stop, life


async def test_a_shutdown_waits_for_the_call_of_a_cancelled_request(
    piped: Any, database_url: str, db: Database, keyring: Keyring, upstream: Upstream
) -> None:
    """The request is cancelled (as uvicorn cancels what is left at a shutdown) while its
    insert is answered late; the shutdown begins. The call is still handed to the worker
    before it stops, not left claimed for a worker that is gone until its lease runs out."""
    pipe, piped_url = piped
    token, path, owner = await asyncio.to_thread(agent_of, db, upstream)
    worker = WorkerSettings(concurrency=4, lease_seconds=LEASE, poll_interval=LEASE)
    app = create_app(settings(piped_url, keyring, worker=worker))
    stop, life = await cancelled_under_lifespan(app, token, pipe)
    stop.set()  # the shutdown begins
    # A shutdown that does not wait is over long before this; one that waits is still on.
    await asyncio.wait({life}, timeout=SHUTDOWN_GRACE)
    pipe.release()
    await asyncio.wait_for(life, SENT_WITHIN)
    # Sent before the worker stopped, or given back to any worker: never left claimed for
    # the stopped one until its lease runs out. The next worker sends it at once.
    restarted = time.monotonic()
    await run_until(database_url, lambda: calls_of(database_url, owner)[0][0] != "running")
    assert time.monotonic() - restarted < SENT_WITHIN, "left to its lease"
    [(status, attempt, _)] = await asyncio.to_thread(calls_of, database_url, owner)
    assert (status, attempt) == ("completed", 1)  # attempt 1: no lease ran out
    assert upstream.hits[path] == 1


async def test_a_shutdown_does_not_wait_forever_for_a_call_the_database_never_answers(
    piped: Any,
    database_url: str,
    db: Database,
    keyring: Keyring,
    upstream: Upstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The insert's answer never comes (held until the test ends): the shutdown waits for
    that call no longer than its bound, then goes on."""
    monkeypatch.setattr("toolrelay.api.app.WORKER_STOP_TIMEOUT", STUCK_BOUND)
    pipe, piped_url = piped
    token, _, _ = await asyncio.to_thread(agent_of, db, upstream)
    app = create_app(settings(piped_url, keyring))
    stop, life = await cancelled_under_lifespan(app, token, pipe)
    stop.set()
    began = time.monotonic()
    await asyncio.wait_for(life, SENT_WITHIN)  # not held by the call that never returns
    assert time.monotonic() - began < SENT_WITHIN
