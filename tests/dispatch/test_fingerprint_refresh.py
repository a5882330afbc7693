"""A column a later migration adds to the tools changes every tool's kept fingerprint
(migration 0038, db/migrate.py), as it changed the one computed at every claim before:
a call approved before that migration is refused (``tool_changed``), not sent."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.dispatch.test_fingerprints import fingerprints
from tests.dispatch.upstream import Upstream
from tests.pgtest import own_database_url, own_db  # noqa: F401 (fixtures: the schema changes)
from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database, migrate
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]


async def test_a_column_added_by_a_later_migration_fails_the_calls_made_before(
    registry: Registry, db: Database, database_url: str, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = agent_with_tool(
        registry, endpoint_url=f"{upstream.base_url}/echo", egress_class="write"
    )
    made = registry.invoke(agent, tool["key"], {"text": "approved before"})
    registry.approve(made)
    before = fingerprints(db, tool["id"])
    with db.connect(autocommit=True) as admin:  # what a later migration's ALTER does
        admin.execute("ALTER TABLE agents.tools_registry ADD COLUMN extra text DEFAULT 'x'")
    assert fingerprints(db, tool["id"])["kept"] == before["kept"]
    migrate(database_url)  # every run ends with the kept values made to agree
    after = fingerprints(db, tool["id"])
    assert after["kept"] == after["formula"] != before["kept"]
    await drain()
    call = registry.get_invocation(made)
    assert (call["status"], call["error_code"]) == ("failed", "tool_changed")
    assert upstream.seen == []
