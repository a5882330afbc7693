"""A tool's configuration fingerprint is computed when the tool is written and kept with
it (agents.tool_fingerprints, migration 0038); the insert and the claim read the kept one.

The fingerprint binds a call, and its approval, to the request configuration it was made
under: the worker refuses (``tool_changed``) an approved call whose tool's configuration
changed since. So the kept value must follow every write of a tool, by any door, and be
the one both sides compare.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]

KEPT_AND_FORMULA = """
SELECT f.fingerprint AS kept, agents.tool_fingerprint(t) AS formula
  FROM agents.tools_registry t LEFT JOIN agents.tool_fingerprints f ON f.tool_id = t.id
 WHERE t.id = %s
"""


def fingerprints(db: Database, tool_id: Any) -> dict[str, Any]:
    with db.as_dispatcher() as conn:
        row = conn.execute(KEPT_AND_FORMULA, (tool_id,)).fetchone()
    assert row is not None
    return dict(row)


def test_every_write_of_a_tool_renews_its_kept_fingerprint(
    registry: Registry, db: Database
) -> None:
    _, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/a")
    first = fingerprints(db, tool["id"])
    assert first["kept"] == first["formula"]

    registry.update_tool(tool["key"], {"endpoint_url": "http://127.0.0.1:9/b"})
    by_api = fingerprints(db, tool["id"])
    assert by_api["kept"] == by_api["formula"] != first["kept"]

    registry.update_tool(tool["key"], {"description": "a label: not part of the request"})
    assert fingerprints(db, tool["id"])["kept"] == by_api["kept"]

    with db.as_owner(registry.owner) as conn:  # an owner's plain UPDATE, no fn_* function
        conn.execute(
            "UPDATE agents.tools_registry SET request_template = %s WHERE id = %s",
            (psycopg.types.json.Jsonb({"query": {"q": "{{input.text}}"}}), tool["id"]),
        )
    by_sql = fingerprints(db, tool["id"])
    assert by_sql["kept"] == by_sql["formula"] != by_api["kept"]


def test_nobody_but_the_dispatcher_reads_the_kept_fingerprints(
    registry: Registry, db: Database
) -> None:
    agent, tool = agent_with_tool(registry)
    agent_id = registry.get_agent(agent)["id"]
    for who in ({}, {"agent_id": agent_id}):
        denied = pytest.raises(psycopg.errors.InsufficientPrivilege)
        with denied, db.as_owner(registry.owner, **who) as conn:
            conn.execute("SELECT * FROM agents.tool_fingerprints").fetchall()
    assert fingerprints(db, tool["id"])["kept"]
    # The dispatcher reads them; it never writes them.
    with pytest.raises(psycopg.errors.InsufficientPrivilege), db.as_dispatcher() as conn:
        conn.execute("DELETE FROM agents.tool_fingerprints")


async def test_the_call_and_the_claim_compare_the_kept_fingerprint(
    registry: Registry, db: Database, upstream: Upstream, drain: Drain
) -> None:
    """A kept value set apart from the formula (what a change of configuration does to it):
    the call made after it carries it, and one made before is refused at claim."""
    agent, tool = agent_with_tool(
        registry, endpoint_url=f"{upstream.base_url}/echo", egress_class="write"
    )
    before = registry.invoke(agent, tool["key"], {"text": "made before"})
    registry.approve(before)
    with db.connect(autocommit=True) as admin:  # the table's owner: nobody else writes it
        admin.execute(
            "UPDATE agents.tool_fingerprints SET fingerprint = 'kept' WHERE tool_id = %s",
            (tool["id"],),
        )
    after = registry.invoke(agent, tool["key"], {"text": "made after"})
    assert registry.get_invocation(after)["config_fingerprint"] == "kept"
    registry.approve(after)
    await drain()
    refused, sent = registry.get_invocation(before), registry.get_invocation(after)
    assert (refused["status"], refused["error_code"]) == ("failed", "tool_changed")
    assert sent["status"] == "completed", sent["error"]
    assert dict(upstream.by_invocation) == {str(after): 1}
