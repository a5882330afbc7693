"""`serve` hands the in-process worker's outcomes to its waiters directly: with no LISTEN
at all (a transaction pooler, no --listen-url) and a 30 s fallback poll, `?wait` still
answers right after the upstream does."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi import FastAPI

from tests.api.conftest import held_read, settings
from tests.api.gates import until
from tests.api.servers import serve_app
from tests.dispatch.upstream import Upstream
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.dispatch.worker import WorkerSettings

SLOW_POLL = 30.0  # seconds
WAKE_LIMIT = 1.0  # seconds from the upstream's answer to the agent's


@pytest.fixture(scope="module")
def app(database_url: str, keyring: Keyring) -> FastAPI:
    # pooler mode without a listen URL: neither the worker nor the waiters LISTEN
    worker = WorkerSettings(concurrency=8, lease_seconds=5.0, pooler=True, poll_interval=0.05)
    return create_app(settings(database_url, keyring, worker=worker, wait_poll_seconds=SLOW_POLL))


@pytest.fixture(scope="module")
def api(app: FastAPI) -> Iterator[str]:
    with serve_app(app) as url:
        yield url


def test_the_in_process_worker_wakes_the_waiter_without_notify(
    app: FastAPI, make_owner: Any, upstream: Upstream, api: str
) -> None:
    outcomes = app.state.toolrelay.outcomes
    assert outcomes.url is None  # nobody listens in this app
    bot, gate, path = held_read(make_owner(), upstream, api)
    invocation = bot.post("/v1/agent/invocations", json={"tool": "read", "input": {}}).json()
    try:
        with ThreadPoolExecutor(1) as pool:
            path = f"/v1/agent/invocations/{invocation['id']}"
            future = pool.submit(lambda: bot.get(path, params={"wait": 10}))
            assert until(lambda: outcomes.waiting(uuid.UUID(invocation["id"])))
            gate.open()
            body = future.result().json()
    finally:
        gate.open()
    assert gate.answered_at is not None
    assert time.monotonic() - gate.answered_at < WAKE_LIMIT
    assert body["status"] == "completed", body


def test_invoke_with_wait_holds_the_answer_until_the_outcome(
    make_owner: Any, upstream: Upstream, api: str
) -> None:
    """POST ?wait: the call's answer is its outcome, in one request (the upstream is held,
    and the POST has not answered while it is)."""
    bot, gate, path = held_read(make_owner(), upstream, api)
    call = {"tool": "read", "input": {}}
    try:
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(
                lambda: bot.post("/v1/agent/invocations", params={"wait": 10}, json=call)
            )
            assert until(lambda: any(s.path == path for s in upstream.seen))
            assert not future.done()  # held with the upstream
            gate.open()
            response = future.result()
    finally:
        gate.open()
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "completed", response.json()
    assert gate.answered_at is not None
    assert time.monotonic() - gate.answered_at < WAKE_LIMIT
