"""Fixtures for the HTTP API: the real app under uvicorn on loopback (with its in-process
worker), an upstream for it to call, and owners and agents holding tokens."""

from __future__ import annotations

import ipaddress
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.api.gates import Gate
from tests.api.servers import serve_app, threaded_upstream
from tests.dispatch.upstream import Upstream
from toolrelay.api import ApiSettings, create_app
from toolrelay.cli import context
from toolrelay.credentials import Keyring, MasterKey
from toolrelay.db import Database
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import WorkerSettings
from toolrelay.tokens import TokenStore

LOOPBACK_ONLY = EgressPolicy(
    allow_hosts=frozenset(), allow_networks=(ipaddress.ip_network("127.0.0.1/32"),)
)
CLIENT_TIMEOUT = 70.0  # seconds: above the longest long poll


@pytest.fixture(scope="session")
def keyring() -> Keyring:
    return Keyring([MasterKey("api-test", secrets.token_bytes(32))])


def settings(database_url: str, keyring: Keyring | None, **overrides: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "keyring": keyring,
        "egress": LOOPBACK_ONLY,
        "worker": WorkerSettings(concurrency=8, lease_seconds=5.0),
    }
    return ApiSettings(**(values | overrides))


@pytest.fixture(scope="module")
def api(database_url: str, keyring: Keyring) -> Iterator[str]:
    """The base URL of the API, with its dispatcher running in-process."""
    with serve_app(create_app(settings(database_url, keyring))) as url:
        yield url


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with threaded_upstream() as server:
        yield server


@pytest.fixture
def cli_owner(database_url: str, monkeypatch: pytest.MonkeyPatch) -> uuid.UUID:
    """A brand-new owner the CLI acts as (TOOLRELAY_OWNER)."""
    owner = uuid.uuid4()
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("TOOLRELAY_OWNER", str(owner))
    context.database.cache_clear()
    return owner


@dataclass
class Client:
    """An HTTP client holding one bearer token; ``id`` is the owner's or the agent's."""

    http: httpx.Client
    token: str
    owner: uuid.UUID
    agent_id: uuid.UUID | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.http, name)


def client(
    base_url: str, token: str, owner: uuid.UUID, agent_id: uuid.UUID | None = None
) -> Client:
    http = httpx.Client(
        base_url=base_url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=CLIENT_TIMEOUT,
    )
    return Client(http, token, owner, agent_id)


@pytest.fixture
def make_owner(api: str, db: Database) -> Iterator[Callable[[], Client]]:
    """Each call: a brand-new owner with an owner token (made the way the CLI makes one)."""
    made: list[Client] = []

    def make() -> Client:
        owner = uuid.uuid4()
        _, token = TokenStore(db).create(owner, name="test")
        made.append(client(api, token, owner))
        return made[-1]

    yield make
    for c in made:
        c.http.close()


def agent_client(api: str, owner: Client, name: str) -> Client:
    """Create an agent for ``owner`` and an agent token for it, both through the API."""
    agent = owner.post("/v1/agents", json={"name": name})
    assert agent.status_code == 201, agent.text
    token = owner.post("/v1/tokens", json={"agent": name, "name": f"{name} token"})
    assert token.status_code == 201, token.text
    return client(api, token.json()["token"], owner.owner, uuid.UUID(agent.json()["id"]))


def held_read(owner: Client, upstream: Upstream, api: str) -> tuple[Client, Gate, str]:
    """An agent client (`bot`) and its tool `read`, a GET to a path of its own whose
    upstream answers once the gate opens; and that path."""
    gate, path = Gate(), f"/held/{uuid.uuid4().hex}"
    upstream.routes[path] = gate.handler
    tool = {"name": "read", "endpoint_url": f"{upstream.base_url}{path}", "http_method": "GET",
            "egress_class": "read_only"}  # fmt: skip
    assert owner.put("/v1/tools/read", json=tool).status_code == 200
    bot = agent_client(api, owner, "bot")
    assert owner.put("/v1/assignments/bot/read").status_code == 200
    return bot, gate, path
