"""Fixtures for webhooks: a database of their own, a loopback receiver that verifies every
delivery with the standardwebhooks package, and a deliverer driven one pass at a time."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from standardwebhooks import Webhook

from tests.pgtest import create_database, drop_database
from toolrelay.credentials import Keyring, MasterKey
from toolrelay.db import Database, migrate
from toolrelay.dispatch.egress import EgressPolicy, make_connector
from toolrelay.dispatch.http import outbound_session
from toolrelay.dispatch.store import open_pool
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.notify import Deliverer, Webhooks
from toolrelay.registry import Registry

LOOPBACK_ONLY = EgressPolicy(
    allow_hosts=frozenset(), allow_networks=(ipaddress.ip_network("127.0.0.1/32"),)
)
PUBLIC_URL = "https://relay.example.com"
DRAIN_TIMEOUT = 60.0  # seconds


@pytest.fixture(scope="module")
def notify_url(admin_url: str) -> Iterator[str]:
    """A database of this module's own: no other test's worker delivers its rows."""
    url = create_database(admin_url, "toolrelay_notify")
    migrate(url)
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def ndb(notify_url: str) -> Iterator[Database]:
    db = Database(notify_url)
    yield db
    db.close()


@pytest.fixture(scope="module")
def keyring() -> Keyring:
    return Keyring([MasterKey("notify-test", os.urandom(32))])


@pytest.fixture
def make_owner(ndb: Database, keyring: Keyring) -> Callable[[], SimpleNamespace]:
    """A brand-new owner: its registry and its webhooks."""

    def make() -> SimpleNamespace:
        owner = uuid.uuid4()
        return SimpleNamespace(
            id=owner, registry=Registry(ndb, owner), webhooks=Webhooks(ndb, owner, keyring)
        )

    return make


@pytest.fixture
def owner(make_owner: Callable[[], SimpleNamespace]) -> SimpleNamespace:
    return make_owner()


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any


@dataclass
class Receiver:
    """Records every request; ``statuses[path]`` lists the answers to give in turn (the last
    one repeats; default 200). ``secrets[path]`` verifies each delivery on arrival;
    ``cookies[path]`` (name, value) is set on every answer there; ``held[path]``: answers
    there wait until that event is set."""

    base_url: str = ""
    received: list[Received] = field(default_factory=list)
    statuses: dict[str, list[int]] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, tuple[str, str]] = field(default_factory=dict)
    held: dict[str, asyncio.Event] = field(default_factory=dict)  # answer once it is set
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        secret = self.secrets.get(request.path)
        # Every delivery must verify with the reference implementation, not ours.
        parsed = Webhook(secret).verify(body, headers) if secret else None
        self.received.append(Received(request.path, headers, body, parsed))
        self.arrived.set()
        if request.path in self.held:
            await self.held[request.path].wait()
        answers = self.statuses.get(request.path) or [200]
        status = answers.pop(0) if len(answers) > 1 else answers[0]
        where = {"Location": "/elsewhere"} if 300 <= status < 400 else None
        response = web.json_response({"ok": status < 300}, status=status, headers=where)
        if request.path in self.cookies:
            response.set_cookie(*self.cookies[request.path], path="/")
        return response

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    async def until(self, path: str, count: int, limit: float) -> None:
        """Once ``count`` requests have arrived at ``path`` (TimeoutError after ``limit`` s)."""

        async def look() -> None:
            while len(self.at(path)) < count:
                self.arrived.clear()
                if len(self.at(path)) < count:
                    await self.arrived.wait()

        await asyncio.wait_for(look(), limit)

    def events(self, path: str) -> list[str]:
        return [r.json["type"] if "type" in r.json else r.json["text"] for r in self.at(path)]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recv = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recv.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    recv.base_url = f"http://127.0.0.1:{port}"
    yield recv
    await runner.cleanup()


@dataclass
class Traced:
    """What the deliverer's HTTP client attempted: requests started, connections made."""

    requests: int = 0
    connections: int = 0


@dataclass
class Driver:
    deliverer: Deliverer
    traced: Traced

    async def once(self, now: datetime | None = None) -> int:
        return await self.deliverer.deliver_once(now)


@pytest.fixture
async def deliver(notify_url: str, keyring: Keyring) -> AsyncIterator[Driver]:
    traced = Traced()

    async def on_request(*_: Any) -> None:
        traced.requests += 1

    async def on_connection(*_: Any) -> None:
        traced.connections += 1

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request)
    trace.on_connection_create_start.append(on_connection)
    pool = open_pool(notify_url, max_size=2)
    await pool.open(wait=True)
    connector = make_connector(LOOPBACK_ONLY)
    async with outbound_session(connector, trace_configs=[trace]) as session:  # serve's
        yield Driver(Deliverer(pool, keyring, LOOPBACK_ONLY, session, public_url=PUBLIC_URL),
                     traced)  # fmt: skip
    await pool.close()


@pytest.fixture
def drain(notify_url: str) -> Callable[..., Awaitable[Worker]]:
    """A worker with --drain semantics, without a master key: it dispatches, and leaves the
    deliveries to the test's deliverer."""

    async def run(**settings: Any) -> Worker:
        options = {"concurrency": 8, "lease_seconds": 5.0, "drain": True} | settings
        worker = Worker(notify_url, WorkerSettings(**options), None, LOOPBACK_ONLY)
        await asyncio.wait_for(worker.run(), DRAIN_TIMEOUT)
        return worker

    return run
