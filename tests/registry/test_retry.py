"""Retry: a failed, rejected or expired call made again by a human owner — through the SQL
function, the Registry, the CLI and the HTTP API — as a new call linked to the first, under
every rule of a new call (gated again, assignment, schema)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from tests.api.conftest import settings
from tests.api.servers import serve_app
from tests.dispatch.conftest import LOOPBACK_ONLY, drain, upstream
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool, count_invocations
from toolrelay import errors
from toolrelay.api import create_app
from toolrelay.cli import context
from toolrelay.cli.main import app as cli_app
from toolrelay.db import Database
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry
from toolrelay.tokens import TokenStore

__all__ = ["drain", "upstream"]  # the dispatcher's fixtures

Drain = Callable[..., Awaitable[Worker]]
DEFAULT_EGRESS = EgressPolicy.from_env({})  # loopback refused: the allow-list not fixed yet
runner = CliRunner()


def read_tool(registry: Registry, upstream: Upstream, **fields: Any) -> tuple[str, str]:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/echo", **fields)
    return agent, tool["key"]


def rejected_call(registry: Registry, upstream: Upstream) -> UUID:
    agent, tool = read_tool(registry, upstream, requires_approval=True)
    inv = registry.invoke(agent, tool, {"text": "again"})
    registry.reject(inv, "not now")
    return inv


# --- the Registry and the worker -------------------------------------------------------------


async def test_egress_blocked_call_retried_after_the_allow_list_is_fixed_completes(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = read_tool(registry, upstream)
    first = registry.invoke(agent, tool, {"text": "hi"})
    await drain(egress=DEFAULT_EGRESS)
    failed = registry.get_invocation(first)
    assert (failed["status"], failed["error_code"]) == ("failed", "egress_blocked")

    retry = registry.retry(first)  # the owner fixed the allow-list (the worker's, below)
    await drain(egress=LOOPBACK_ONLY)
    done = registry.get_invocation(retry)
    assert (done["status"], done["output"]["query"]) == ("completed", {"text": "hi"})
    assert done["retry_of"] == first and done["input"] == failed["input"]
    assert (done["agent_id"], done["tool_id"]) == (failed["agent_id"], failed["tool_id"])
    assert registry.get_invocation(first)["retried_by"] == retry  # the link, both ways
    assert done["retried_by"] is None
    assert upstream.by_invocation == {str(retry): 1}


async def test_retry_is_gated_again_when_the_tool_is_gated_now(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = read_tool(registry, upstream)
    first = registry.invoke(agent, tool, {"text": "x"})
    await drain(egress=DEFAULT_EGRESS)
    registry.update_tool(tool, {"requires_approval": True})
    retry = registry.retry(first)
    got = registry.get_invocation(retry)
    assert (got["status"], got["approval_status"]) == ("pending", "pending")
    await drain(egress=LOOPBACK_ONLY)
    assert registry.get_invocation(retry)["status"] == "pending"  # nothing sent unapproved
    assert upstream.seen == []
    registry.approve(retry)
    await drain(egress=LOOPBACK_ONLY)
    assert registry.get_invocation(retry)["status"] == "completed"


def test_a_rejected_call_of_a_gated_tool_is_pending_again(
    registry: Registry, upstream: Upstream
) -> None:
    first = rejected_call(registry, upstream)
    retry = registry.retry(first)
    got = registry.get_invocation(retry)
    assert (got["status"], got["approval_status"], got["retry_of"]) == ("pending", "pending", first)
    assert got["input"] == {"text": "again"}


def test_only_a_finished_call_that_did_not_complete_can_be_retried(
    registry: Registry, upstream: Upstream, db: Database
) -> None:
    agent, tool = read_tool(registry, upstream, requires_approval=True)
    pending = registry.invoke(agent, tool, {})
    running = registry.invoke(agent, tool, {})
    registry.approve(running)
    completed = registry.invoke(agent, tool, {})
    with db.connect(autocommit=True) as conn:  # as the dispatcher leaves one
        conn.execute(
            "UPDATE agents.tool_invocations SET status = 'completed', finished_at = now()"
            " WHERE id = %s",
            (completed,),
        )
    for inv, status in ((pending, "pending"), (running, "running"), (completed, "completed")):
        with pytest.raises(errors.InvalidState, match=f"cannot be retried: it is {status}"):
            registry.retry(inv)
    registry.reject(pending)
    retry = registry.retry(pending)
    with pytest.raises(errors.InvalidState, match=f"already retried as {retry}"):
        registry.retry(pending)  # a double click makes one new call
    with pytest.raises(errors.NotFound):
        registry.retry(uuid.uuid4())
    with pytest.raises(errors.InvalidArgument, match="not an invocation id"):
        registry.retry("nope")


def test_agent_identity_cannot_retry(registry: Registry, upstream: Upstream, db: Database) -> None:
    first = rejected_call(registry, upstream)
    bot = registry.get_agent("bot")["id"]
    before = count_invocations(db, registry.owner)
    with pytest.raises(errors.PermissionDenied, match="only a human owner"):
        Registry(db, registry.owner, agent_id=bot).retry(first)
    with (  # whichever door: plain SQL with the agent's claims
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="only a human owner"),
        db.as_owner(registry.owner, agent_id=bot) as conn,
    ):
        conn.execute("SELECT fn_retry_tool_invocation(%s)", (first,))
    assert count_invocations(db, registry.owner) == before


def test_another_owner_cannot_see_or_retry_the_call(
    registry: Registry, make_registry: Callable[[], Registry], upstream: Upstream
) -> None:
    first = rejected_call(registry, upstream)
    with pytest.raises(errors.NotFound):
        make_registry().retry(first)


def test_retry_goes_through_every_rule_of_a_new_call_and_writes_nothing_when_refused(
    registry: Registry, upstream: Upstream, db: Database
) -> None:
    first = rejected_call(registry, upstream)
    tool = registry.get_invocation(first)["tool_key"]
    before = count_invocations(db, registry.owner)
    registry.update_tool(tool, {"schema_input": {"type": "object", "required": ["id"]}})
    with pytest.raises(errors.InvalidInput, match="id"):
        registry.retry(first)  # validated against the schema as it is now
    registry.update_tool(tool, {"schema_input": {}})
    registry.set_tool_status(tool, "disabled")
    with pytest.raises(errors.ToolInactive, match="disabled"):
        registry.retry(first)
    registry.set_tool_status(tool, "active")
    registry.revoke("bot", tool)
    with pytest.raises(errors.NotAssigned):
        registry.retry(first)
    assert count_invocations(db, registry.owner) == before


def test_retrying_a_call_whose_tool_or_agent_was_deleted_says_so(
    make_registry: Callable[[], Registry], upstream: Upstream, db: Database
) -> None:
    for table, what in (("tools_registry", "tool"), ("agents", "agent")):
        registry = make_registry()
        first = rejected_call(registry, upstream)
        row = registry.get_invocation(first)
        with db.as_owner(registry.owner) as conn:
            conn.execute(f"DELETE FROM agents.{table} WHERE id = %s", (row[f"{what}_id"],))
        name = row["tool_key"] if what == "tool" else row["agent_name"]
        with pytest.raises(errors.ToolInactive, match=f"its {what} {name} was deleted"):
            registry.retry(first)


def test_the_sql_function_as_psql_calls_it(
    registry: Registry, upstream: Upstream, db: Database
) -> None:
    first = rejected_call(registry, upstream)
    with db.as_owner(registry.owner) as conn:
        row = conn.execute("SELECT fn_retry_tool_invocation(%s) AS id", (first,)).fetchone()
        assert row is not None
        linked = conn.execute(
            "SELECT retry_of, input, status FROM agents.tool_invocations WHERE id = %s",
            (row["id"],),
        ).fetchone()
    assert linked == {"retry_of": first, "input": {"text": "again"}, "status": "pending"}


def test_deleting_the_first_call_keeps_its_retry(
    registry: Registry, upstream: Upstream, db: Database
) -> None:
    first = rejected_call(registry, upstream)
    retry = registry.retry(first)
    with db.connect(autocommit=True) as conn:  # as retention pruning does
        conn.execute("DELETE FROM agents.tool_invocations WHERE id = %s", (first,))
    assert registry.get_invocation(retry)["retry_of"] is None


# --- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def cli_registry(database_url: str, db: Database, monkeypatch: pytest.MonkeyPatch) -> Registry:
    owner = uuid.uuid4()
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("TOOLRELAY_OWNER", str(owner))
    context.database.cache_clear()
    return Registry(db, owner)


def test_cli_retry_prints_the_new_id_and_show_links_both_ways(
    cli_registry: Registry, upstream: Upstream
) -> None:
    first = rejected_call(cli_registry, upstream)
    result = runner.invoke(cli_app, ["invocations", "retry", str(first)])
    assert result.exit_code == 0, result.output
    retry = UUID(result.stdout.strip())
    shown = runner.invoke(cli_app, ["invocations", "show", str(retry), "-o", "json"])
    assert shown.exit_code == 0, shown.output
    new = json.loads(shown.stdout)
    assert (new["retry_of"], new["status"]) == (str(first), "pending")
    old = json.loads(runner.invoke(cli_app, ["invocations", "show", str(first)]).stdout)
    assert old["retried_by"] == str(retry)
    again = runner.invoke(cli_app, ["invocations", "retry", str(retry)])
    assert again.exit_code == 1
    assert again.stderr.strip() == (
        f"error: invocation {retry} cannot be retried: it is pending; only a failed, rejected"
        " or expired call can be (a completed one happened: invoke again to repeat it)"
    )


# --- the HTTP API ------------------------------------------------------------------------------


@pytest.fixture
def api_url(database_url: str) -> Iterator[str]:
    """The API without its in-process worker: the test's drain dispatches."""
    with serve_app(create_app(settings(database_url, None, run_worker=False))) as url:
        yield url


def bearer(api_url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"})


async def test_api_retry_makes_a_linked_call_and_refuses_agents_and_unfinished_calls(
    api_url: str, registry: Registry, upstream: Upstream, db: Database, drain: Drain
) -> None:
    agent, tool = read_tool(registry, upstream)
    first = registry.invoke(agent, tool, {"text": "api"})
    await drain(egress=DEFAULT_EGRESS)
    tokens = TokenStore(db)
    bot = registry.get_agent(agent)["id"]
    with (
        bearer(api_url, tokens.create(registry.owner, name="owner")[1]) as owner,
        bearer(api_url, tokens.create(registry.owner, bot, name="bot")[1]) as as_agent,
    ):
        refused = as_agent.post(f"/v1/invocations/{first}/retry")
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "permission_denied")

        made = owner.post(f"/v1/invocations/{first}/retry")
        assert made.status_code == 201, made.text
        body = made.json()
        assert made.headers["Location"] == f"/v1/invocations/{body['id']}"
        assert (body["retry_of"], body["input"], body["status"]) == (str(first), {"text": "api"},
                                                                     "running")  # fmt: skip
        again = owner.post(f"/v1/invocations/{body['id']}/retry")
        assert (again.status_code, again.json()["error"]["code"]) == (409, "invalid_state")

        await drain(egress=LOOPBACK_ONLY)
        done = owner.get(f"/v1/invocations/{body['id']}").json()
        assert done["status"] == "completed"
        assert done["attempts"][0]["request_method"] == "GET"
        original = owner.get(f"/v1/invocations/{first}").json()
        assert (original["retried_by"], original["retry_of"]) == (body["id"], None)
        listed = owner.get("/v1/invocations", params={"limit": 5}).json()["items"]
        assert {i["id"]: i["retry_of"] for i in listed}[body["id"]] == str(first)
