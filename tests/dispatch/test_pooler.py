"""The registry and the dispatcher behind PgBouncer in transaction-pooling mode."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from aiohttp import web

from tests.dispatch import pgbouncer
from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.upstream import Upstream
from tests.pgtest import own_database_url  # noqa: F401 (fixtures)
from tests.registry.helpers import agent_with_tool
from toolrelay import errors
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database
from toolrelay.db.connect import owner_identity
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry, ToolSpec
from toolrelay.tokens import TokenStore

# A database of its own (own_database_url, imported above): the drains take everything
# runnable, and other tests leave calls behind (to hosts that never answer, with retries)
# that made one drain here 50 s long.
RUN_TIMEOUT = 60.0  # seconds

pytestmark = pytest.mark.skipif(
    not pgbouncer.available(), reason="pgbouncer is not installed (apt-get install pgbouncer)"
)


@pytest.fixture
def pooled_url(database_url: str) -> Iterator[str]:
    with pgbouncer.pgbouncer(database_url, pool_size=2) as url:
        yield url


async def drain_pooled(url: str, keyring: Keyring | None = None) -> None:
    settings = WorkerSettings(
        concurrency=8, lease_seconds=5, drain=True, pooler=True, poll_interval=0.05
    )
    await asyncio.wait_for(Worker(url, settings, keyring, LOOPBACK_ONLY).run(), RUN_TIMEOUT)


def test_identity_does_not_leak_between_transactions(pooled_url: str) -> None:
    db = Database(pooled_url)
    alice = Registry(db, uuid.uuid4())
    alice.create_agent("a")
    for _ in range(4):  # with 2 server connections, later transactions reuse earlier ones
        with psycopg.connect(pooled_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT current_user, current_setting('request.jwt.claim.sub', true)"
            ).fetchone()
        assert row is not None and row[0] != "authenticated" and not row[1]


async def test_gated_write_flow_through_the_pooler(pooled_url: str, upstream: Upstream) -> None:
    keyring = Keyring.parse(generate_master_key())
    db = Database(pooled_url)
    registry = Registry(db, uuid.uuid4())
    cred = CredentialStore(db, keyring).add(registry.owner, "api_key", "k", "pooled-secret-1")
    agent, tool = agent_with_tool(
        registry,
        endpoint_url=f"{upstream.base_url}/w",
        http_method="POST",
        egress_class="write",
        auth_method="api_key",
        credential_ref=cred,
    )
    inv = registry.invoke(agent, tool["key"], {"text": "hi"})
    registry.approve(inv)
    await drain_pooled(pooled_url, keyring)
    got = registry.get_invocation(inv)
    assert got["status"] == "completed", got["error"]
    assert upstream.seen[-1].headers["Authorization"] == "pooled-secret-1"
    assert upstream.by_invocation == {str(inv): 1}
    for _ in range(4):  # the worker left no session state (SET ROLE) on any server connection
        with psycopg.connect(pooled_url, autocommit=True) as conn:
            row = conn.execute("SELECT current_user").fetchone()
        assert row is not None and row[0] != "service_role"


async def test_retries_and_recovery_through_the_pooler(pooled_url: str, upstream: Upstream) -> None:
    async def flaky(_: web.Request, hit: int) -> web.Response:
        return web.json_response({}, status=503) if hit == 1 else web.json_response({"hit": hit})

    upstream.routes["/r"] = flaky
    db = Database(pooled_url)
    registry = Registry(db, uuid.uuid4())
    agent, read = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/r")
    read_inv = registry.invoke(agent, read["key"], {})
    write = registry.register_tool(
        ToolSpec(key="w.post", name="w", endpoint_url=f"{upstream.base_url}/w",
                 http_method="POST", egress_class="read_only")
    )  # fmt: skip
    registry.assign(agent, write["key"])
    lost = registry.invoke(agent, write["key"], {})
    with psycopg.connect(pooled_url, autocommit=True) as conn:  # a dead worker's sent write
        conn.execute(
            "UPDATE agents.tool_invocations SET attempt = 1, lease_owner = 'dead',"
            " lease_expires_at = now() - interval '1 s', sent_at = now() WHERE id = %s",
            (lost,),
        )
    await drain_pooled(pooled_url)
    assert registry.get_invocation(read_inv)["output"] == {"hit": 2}
    got = registry.get_invocation(lost)
    assert (got["status"], got["error_code"]) == ("failed", "outcome_unknown")
    assert upstream.hits["/w"] == 0


def test_one_trip_transactions_through_the_pooler(pooled_url: str) -> None:
    """Database.trips sends BEGIN ... COMMIT as one string: the agent's path works through
    transaction pooling, and a failed trip leaves no identity or open transaction behind."""
    db = Database(pooled_url)
    try:
        owner = Registry(db, uuid.uuid4())
        agent, tool = agent_with_tool(owner)
        agent_id = owner.get_agent(agent)["id"]
        token = TokenStore(db).create(owner.owner, agent_id, name="pooled")[1]
        caller = TokenStore(db).lookup(token)
        assert caller is not None and caller.agent_id == agent_id
        as_agent = Registry(db, owner.owner, agent_id=agent_id)
        made = as_agent.call(tool["key"], {"text": "pooled"})
        assert made.invocation_id is not None
        assert as_agent.get_invocation(made.invocation_id, agent=str(agent_id))["status"]
        with pytest.raises(errors.InvalidInput):
            as_agent.call(tool["key"], {"text": 1})
        with db.trips() as trips, pytest.raises(psycopg.errors.DivisionByZero):
            trips.run(owner_identity(owner.owner, agent_id), [("SELECT 1 / %(z)s", {"z": 0})])
        for _ in range(4):  # both server connections: plain again
            with psycopg.connect(pooled_url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT current_user, current_setting('request.jwt.claims', true)"
                ).fetchone()
            assert row is not None and row[0] != "authenticated" and not row[1]
        assert len(owner.list_invocations()) == 1
    finally:
        db.close()
