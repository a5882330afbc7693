"""Fixtures for dispatcher tests: an upstream on loopback, and a worker that drains."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tests.dispatch.upstream import Upstream, start_upstream
from toolrelay.credentials import Keyring
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import Worker, WorkerSettings

LOOPBACK_ONLY = EgressPolicy(
    allow_hosts=frozenset(), allow_networks=(ipaddress.ip_network("127.0.0.1/32"),)
)
DRAIN_TIMEOUT = 60.0  # seconds; a hung worker fails the test instead of hanging it


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server, runner = await start_upstream()
    yield server
    await runner.cleanup()


@pytest.fixture
def drain(database_url: str) -> Callable[..., Awaitable[Worker]]:
    """Run one worker with --drain semantics until nothing is left to do."""

    async def run(
        egress: EgressPolicy = LOOPBACK_ONLY, keyring: Keyring | None = None, **settings: Any
    ) -> Worker:
        options = {"concurrency": 16, "lease_seconds": 5.0, "drain": True} | settings
        worker = Worker(database_url, WorkerSettings(**options), keyring, egress)
        await asyncio.wait_for(worker.run(), DRAIN_TIMEOUT)
        return worker

    return run
