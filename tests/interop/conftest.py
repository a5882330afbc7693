"""Fixtures for exports and imports: the CLI acting as a fresh owner, a loopback upstream,
and a worker that drains (dispatching the imported tools for real)."""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner, Result

from tests.dispatch.upstream import Upstream, start_upstream
from toolrelay.cli import context
from toolrelay.cli.main import app
from toolrelay.credentials import Keyring, MasterKey
from toolrelay.db import Database
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry

LOOPBACK_ONLY = EgressPolicy(
    allow_hosts=frozenset(), allow_networks=(ipaddress.ip_network("127.0.0.1/32"),)
)
DRAIN_TIMEOUT = 60.0
runner = CliRunner()


@dataclass
class Owner:
    id: uuid.UUID
    registry: Registry

    def cli(self, *args: str) -> Result:
        return runner.invoke(app, list(args))


@pytest.fixture
def owner(db: Database, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Owner:
    """A brand-new owner; the CLI acts as them."""
    ident = uuid.uuid4()
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("TOOLRELAY_OWNER", str(ident))
    context.database.cache_clear()
    return Owner(ident, Registry(db, ident))


@pytest.fixture(scope="session")
def interop_keyring() -> Keyring:
    return Keyring([MasterKey("interop-test", secrets.token_bytes(32))])


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server, site = await start_upstream()
    yield server
    await site.cleanup()


@pytest.fixture
def drain(database_url: str, interop_keyring: Keyring) -> Callable[[], Awaitable[Worker]]:
    """Run one worker (loopback egress allowed) until nothing is left to do."""

    async def run() -> Worker:
        settings = WorkerSettings(concurrency=8, lease_seconds=5.0, drain=True)
        worker = Worker(database_url, settings, interop_keyring, LOOPBACK_ONLY)
        await asyncio.wait_for(worker.run(), DRAIN_TIMEOUT)
        return worker

    return run
