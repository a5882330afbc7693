"""An agent's stated reason for a call (issue 16, item 5; migration 0029): stored with the
call through every door, never carried over to the next call on a pooled connection, shown
to approvers on the page (escaped), refused when it is not text a person can read."""

from __future__ import annotations

import psycopg
import pytest

from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.errors import InvalidInput
from toolrelay.registry import Registry

GATED = {"egress_class": "write", "requires_approval": True, "http_method": "POST"}


@pytest.fixture
def bot(registry: Registry, db: Database) -> Registry:
    agent_with_tool(registry, key="notes.create", **GATED)
    return Registry(db, registry.owner, agent_id=registry.get_agent("bot")["id"])


def test_a_reason_is_kept_with_its_call_and_not_the_next(registry: Registry, bot: Registry) -> None:
    first = bot.invoke("bot", "notes.create", {"text": "a"}, reason="  the weekly report  ")
    second = bot.invoke("bot", "notes.create", {"text": "b"})  # warm: the same trip path
    by_mcp = bot.call("notes.create", {"text": "c"}, reason="asked by Ann\nin #ops").invocation_id
    after = bot.call("notes.create", {"text": "d"}).invocation_id
    reasons = [registry.get_invocation(i)["reason"] for i in (first, second, by_mcp, after)]
    assert reasons == ["the weekly report", None, "asked by Ann\nin #ops", None]
    queued = {row["id"]: row["reason"] for row in registry.review_queue()}
    assert queued[first] == "the weekly report"


@pytest.mark.parametrize(
    ("reason", "message"),
    [("x" * 1001, "at most 1000 characters"), ("bell\x07", "control characters")],
)
def test_a_reason_that_is_not_readable_text_is_refused(
    registry: Registry, bot: Registry, reason: str, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        bot.invoke("bot", "notes.create", {"text": "x"}, reason=reason)
    assert registry.list_invocations() == []


def test_sql_sets_it_for_the_transaction_and_the_column_checks_it(
    registry: Registry, db: Database, bot: Registry
) -> None:
    tool = registry.get_tool("notes.create")["id"]
    with db.as_owner(registry.owner, agent_id=bot.agent_id) as conn:
        conn.execute("SET LOCAL toolrelay.call_reason = 'from psql'")
        made = conn.execute(
            'SELECT fn_invoke_tool(%s, %s, \'{"text": "x"}\') AS id', (bot.agent_id, tool)
        ).fetchone()
    assert made is not None and registry.get_invocation(made["id"])["reason"] == "from psql"
    with (
        pytest.raises(psycopg.errors.CheckViolation),
        db.as_owner(registry.owner, agent_id=bot.agent_id) as conn,
    ):
        conn.execute("SELECT set_config('toolrelay.call_reason', %s, true)", ("esc\x1b[2J",))
        conn.execute('SELECT fn_invoke_tool(%s, %s, \'{"text": "x"}\')', (bot.agent_id, tool))
