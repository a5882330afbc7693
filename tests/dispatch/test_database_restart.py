"""A database restart in the middle of a run: workers reconnect and finish everything."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.test_many_workers import invoke_many
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database, migrate
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry

INVOCATIONS = 300
RUN_TIMEOUT = 120.0  # seconds


@pytest.fixture
def private_server() -> Iterator[tuple[Any, str]]:
    """A PostgreSQL of this test's own (the pgserver wheel), so restarting it disturbs no one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    scratch = Path(tempfile.mkdtemp(prefix="toolrelay-restart-"))
    scratch.chmod(0o755)
    server = pgserver.get_server(scratch / "pgdata", cleanup_mode="stop")  # type: ignore[attr-defined]
    url = server.get_uri()
    migrate(url)
    yield server, url
    server.cleanup()
    shutil.rmtree(scratch, ignore_errors=True)


def restart(server: Any) -> None:
    from pgserver._commands import pg_ctl

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user)


async def test_workers_reconnect_after_a_database_restart(
    private_server: tuple[Any, str], upstream: Upstream
) -> None:
    server, url = private_server

    async def slowish(_: web.Request, hit: int) -> web.Response:
        await asyncio.sleep(0.05)
        return web.json_response({"hit": hit})

    upstream.routes["/r"] = slowish
    registry = Registry(Database(url), uuid.uuid4())
    agent, tool = agent_with_tool(
        registry, endpoint_url=f"{upstream.base_url}/r", http_method="GET", egress_class="read_only"
    )
    invoke_many(registry, agent, tool["key"], INVOCATIONS)
    settings = WorkerSettings(concurrency=8, lease_seconds=2.0, drain=True)
    worker = Worker(url, settings, None, LOOPBACK_ONLY)
    task = asyncio.create_task(worker.run())
    while sum(upstream.hits.values()) < INVOCATIONS // 4:
        await asyncio.sleep(0.05)
    await asyncio.to_thread(restart, server)
    restarted_at = sum(upstream.hits.values())
    await asyncio.wait_for(task, RUN_TIMEOUT)
    with registry.db.as_owner(registry.owner) as conn:
        rows = conn.execute(
            "SELECT status, count(*) AS n FROM agents.tool_invocations GROUP BY status"
        ).fetchall()
    assert {r["status"]: r["n"] for r in rows} == {"completed": INVOCATIONS}
    assert restarted_at < INVOCATIONS  # the restart really happened mid-run
    assert len(upstream.by_invocation) == INVOCATIONS
