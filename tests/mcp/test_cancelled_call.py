"""tools/call cancelled by the agent's client while its insert is on the wire: the call is
still handed to serve's worker and sent at once (dispatch/handoff.py ``HandOff.make``).

The official SDK client cancels a call its caller gave up on with a courtesy
``notifications/cancelled``, and the SDK server then cancels the handler. Here the
database's answer to the insert is held on the wire after it committed
(tests/dispatch/heldpipe.py) while that happens; tests/api/test_cancelled_call.py does the
same at /v1's door."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from tests.api.conftest import settings
from tests.api.gates import until_async
from tests.api.test_cancelled_call import (
    LEASE,
    agent_of,
    calls_of,
    released_and_sent,
    taking_hand_offs,
)
from tests.dispatch.heldpipe import held_pipe
from tests.dispatch.upstream import Upstream
from tests.mcp.conftest import http_client
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.dispatch.worker import WorkerSettings


@pytest.fixture
async def piped(database_url: str) -> AsyncIterator[Any]:
    async with held_pipe(database_url, b"fn_invoke_tool") as made:
        yield made


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_tools_call_cancelled_after_its_insert_committed_is_sent_at_once(
    mode: str, piped: Any, database_url: str, db: Database, mcp_keyring: Keyring,
    upstream: Upstream,
) -> None:  # fmt: skip
    pipe, piped_url = piped
    token, path, owner = await asyncio.to_thread(agent_of, db, upstream)
    worker = WorkerSettings(concurrency=4, lease_seconds=LEASE, poll_interval=LEASE)
    app = create_app(settings(piped_url, mcp_keyring, worker=worker))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        assert await until_async(lambda: server.started)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        in_process = await taking_hand_offs(app)
        async with http_client(url, token, mode=mode) as client:
            call = asyncio.ensure_future(client.call_tool("read", {}))
            await pipe.held.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await released_and_sent(pipe, database_url, owner, in_process.settings.worker_id)
        assert in_process.reserved == 0
    finally:
        server.should_exit = True
        await serving
    [(status, attempt, _)] = await asyncio.to_thread(calls_of, database_url, owner)
    assert (status, attempt) == ("completed", 1)
    assert upstream.hits[path] == 1
