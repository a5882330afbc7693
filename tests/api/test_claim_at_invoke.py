"""A call made through `serve` is claimed for its in-process worker as it is inserted
(migration 0036, dispatch/handoff.py): no NOTIFY, no claim UPDATE, still a durable claim.

What could go wrong, each tried here: the call notifies anyway (the cluster-wide lock the
hand-off exists to avoid); the worker claims it again (a second UPDATE); a full worker is
handed more than it has slots for; a call waiting for approval is claimed; a process that
dies holding a handed call strands it or has it sent twice; an agent asks for a lease of a
year, or for one that is not a number."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from tests.api.conftest import agent_client, held_read, settings
from tests.api.gates import until
from tests.api.servers import serve_app
from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.upstream import Upstream
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry, ToolSpec

SENTINEL = "claim-at-invoke-test"


@pytest.fixture(scope="module")
def app(database_url: str, keyring: Keyring) -> FastAPI:
    # one slot: the second call while the first is held finds the worker full
    worker = WorkerSettings(concurrency=1, lease_seconds=5.0, poll_interval=0.05)
    return create_app(settings(database_url, keyring, worker=worker))


@pytest.fixture(scope="module")
def api(app: FastAPI) -> Iterator[str]:
    with serve_app(app) as url:
        yield url


def in_process_worker(app: FastAPI) -> Worker:
    worker = app.state.toolrelay.handoff.worker
    assert worker is not None, "serve's worker is running"
    assert isinstance(worker, Worker)
    # Until it has started, calls are made unclaimed (and notify): not what is tried here.
    assert until(lambda: worker.taking_hand_offs)
    return worker


@contextmanager
def runnable_notes(database_url: str) -> Iterator[Any]:
    """LISTEN on the runnable channel, with a sleeper registered so that every unclaimed
    call notifies (migration 0018's rule), whatever the in-process worker is doing."""
    sleeper = f"test-sleeper-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("LISTEN toolrelay_runnable")
        conn.execute("INSERT INTO agents.dispatch_sleepers (worker) VALUES (%s)", (sleeper,))
        try:
            yield conn
        finally:
            conn.execute("DELETE FROM agents.dispatch_sleepers WHERE worker = %s", (sleeper,))


def notes_before_sentinel(conn: Any) -> list[str]:
    """Every notification on the channel up to a sentinel sent now: delivered in commit
    order, so whatever the calls sent before arrives first."""
    conn.execute("SELECT pg_notify('toolrelay_runnable', %s)", (SENTINEL,))
    seen = []
    for note in conn.notifies(timeout=10):
        if note.payload == SENTINEL:
            return seen
        seen.append(note.payload)
    raise AssertionError("the sentinel notification never arrived")


def row_of(database_url: str, invocation_id: str) -> dict[str, Any]:
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute(
            "SELECT status, attempt, lease_owner, lease_expires_at - created_at AS lease,"
            " updated_at = created_at AS never_updated"
            " FROM agents.tool_invocations WHERE id = %s",
            (invocation_id,),
        ).fetchone()
    assert row is not None
    return row


def test_a_call_made_here_is_claimed_as_inserted_and_wakes_nobody(
    app: FastAPI, api: str, make_owner: Any, upstream: Upstream, database_url: str
) -> None:
    worker = in_process_worker(app)
    bot, gate, _ = held_read(make_owner(), upstream, api)
    with runnable_notes(database_url) as notes:
        try:
            made = bot.post("/v1/agent/invocations", json={"tool": "read", "input": {}})
            assert made.status_code == 202, made.text
            call = made.json()
            # held at the upstream: sent by this worker, and never claimed by an UPDATE
            assert until(lambda: worker.sending == 1)
            row = row_of(database_url, call["id"])
            assert row["lease_owner"] == worker.settings.worker_id
            assert (row["status"], row["attempt"], row["never_updated"]) == ("running", 1, True)
            assert row["lease"].total_seconds() == pytest.approx(5.0)
            assert notes_before_sentinel(notes) == []  # the insert notified nobody
        finally:
            gate.open()
        done = bot.get(f"/v1/agent/invocations/{call['id']}", params={"wait": 10}).json()
    assert done["status"] == "completed", done
    assert done["attempt"] == 1
    assert len(done["attempts"]) == 1  # the attempt row, as for any claimed call


def test_a_full_worker_is_handed_nothing_more_and_the_call_notifies(
    app: FastAPI, api: str, make_owner: Any, upstream: Upstream, database_url: str
) -> None:
    worker = in_process_worker(app)
    bot, gate, _ = held_read(make_owner(), upstream, api)
    with runnable_notes(database_url) as notes:
        try:
            first = bot.post("/v1/agent/invocations", json={"tool": "read", "input": {}}).json()
            assert until(lambda: worker.sending == 1)  # its one slot is taken
            second = bot.post("/v1/agent/invocations", json={"tool": "read", "input": {}}).json()
            row = row_of(database_url, second["id"])
            assert (row["lease_owner"], row["attempt"]) == (None, 0)  # made unclaimed
            assert worker.reserved == 0 and worker.sending == 1
            assert notes_before_sentinel(notes) == [""]  # and it notified, as any call
        finally:
            gate.open()
        with ThreadPoolExecutor(2) as pool:
            waits = [
                pool.submit(bot.get, f"/v1/agent/invocations/{c['id']}", params={"wait": 10})
                for c in (first, second)
            ]
            answers = [w.result().json() for w in waits]
    assert [a["status"] for a in answers] == ["completed", "completed"], answers
    assert worker.reserved == 0


def test_a_call_that_waits_for_approval_is_not_claimed(
    app: FastAPI, api: str, make_owner: Any, upstream: Upstream, database_url: str
) -> None:
    worker = in_process_worker(app)
    owner = make_owner()
    tool = {"name": "write", "endpoint_url": f"{upstream.base_url}/w", "http_method": "POST",
            "egress_class": "write"}  # fmt: skip
    assert owner.put("/v1/tools/write", json=tool).status_code == 200
    bot = agent_client(api, owner, "bot")
    assert owner.put("/v1/assignments/bot/write").status_code == 200
    call = bot.post("/v1/agent/invocations", json={"tool": "write", "input": {}}).json()
    assert call["status"] == "pending"
    row = row_of(database_url, call["id"])
    assert (row["lease_owner"], row["attempt"], row["lease"]) == (None, 0, None)
    assert until(lambda: worker.reserved == 0)  # the reservation was given back


# --- the database side, without serve ---------------------------------------------------------


def registry_with_read(db: Database, upstream: Upstream) -> tuple[Registry, str]:
    """A new owner's agent `bot` with `read`, a GET to a path of its own (echoed)."""
    owner, path = uuid.uuid4(), f"/echo-{uuid.uuid4().hex}"
    registry = Registry(db, owner)
    registry.register_tool(
        ToolSpec(key="read", name="read", endpoint_url=f"{upstream.base_url}{path}",
                 http_method="GET", egress_class="read_only")
    )  # fmt: skip
    agent_id = registry.create_agent("bot")
    registry.assign("bot", "read")
    return Registry(db, owner, agent_id=agent_id), path


async def run_until(database_url: str, finished: Callable[[], bool]) -> None:
    """A worker of its own until ``finished()`` (bounded), then stopped."""
    worker = Worker(database_url, WorkerSettings(poll_interval=0.05), None, LOOPBACK_ONLY)
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(finished):
            assert time.monotonic() < deadline, "the call never finished"
            assert not task.done(), "the worker stopped"
            await asyncio.sleep(0.02)
    finally:
        worker.stop()
        await task


def test_a_handed_call_whose_process_died_is_claimed_again_and_sent_once(
    db: Database, upstream: Upstream, database_url: str
) -> None:
    """Claimed for a worker that never takes it (its process died): once the lease runs
    out, a worker claims it (attempt 2) and sends it, once."""
    agent, path = registry_with_read(db, upstream)
    invocation = agent.invoke("bot", "read", {}, claim=("dead-process:1:abc", 0.5))
    row = row_of(database_url, str(invocation))
    assert (row["lease_owner"], row["attempt"]) == ("dead-process:1:abc", 1)
    asyncio.run(
        run_until(database_url, lambda: agent.get_invocation(invocation)["status"] != "running")
    )
    done = agent.get_invocation(invocation)
    assert (done["status"], done["attempt"]) == ("completed", 2), done
    assert upstream.hits[path] == 1
    assert [a["attempt"] for a in Registry(db, agent.owner).attempts_of(invocation)] == [2]


def test_an_agent_cannot_hold_its_call_for_long_or_pass_a_bad_lease(
    db: Database, upstream: Upstream, database_url: str
) -> None:
    agent, _ = registry_with_read(db, upstream)
    made = []
    try:
        for lease, seconds in ((1e9, 300), (-5.0, 30), (float("nan"), 300), (float("inf"), 300)):
            made.append(agent.invoke("bot", "read", {}, claim=("someone", lease)))
            lease_made = row_of(database_url, str(made[-1]))["lease"]
            assert lease_made.total_seconds() == pytest.approx(seconds)
    finally:  # held by nobody for minutes: a later test's --drain would wait them out
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DELETE FROM agents.tool_invocations WHERE id = ANY(%s)", (made,))
    before = len(agent.list_invocations())
    refused = pytest.raises(psycopg.errors.InvalidParameterValue, match="claim_lease")
    with refused, db.as_owner(agent.owner, agent.agent_id) as conn:  # SQL as the agent
        conn.execute("SET LOCAL toolrelay.claim_worker = 'someone'")
        conn.execute("SET LOCAL toolrelay.claim_lease = 'a year'")
        conn.execute(
            "SELECT fn_invoke_tool(%s, (SELECT id FROM agents.tools_registry"
            " WHERE key = 'read' AND owner = %s), '{}')",
            (agent.agent_id, agent.owner),
        )
    assert len(agent.list_invocations()) == before  # nothing half-written


def test_invoke_with_wait_answers_with_the_handed_row_and_reads_nothing(
    app: FastAPI, api: str, make_owner: Any, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POST ?wait: the worker hands over the row it wrote (dispatch/worker.py _outcome_row),
    and it is the answer field for field, as a read of the call gives it afterwards."""
    owner = make_owner()
    tool = {"name": "echo", "endpoint_url": f"{upstream.base_url}/echo-{uuid.uuid4().hex}",
            "http_method": "POST", "egress_class": "read_only"}  # fmt: skip
    assert owner.put("/v1/tools/echo", json=tool).status_code == 200
    bot = agent_client(api, owner, "bot")
    assert owner.put("/v1/assignments/bot/echo").status_code == 200
    call = {"tool": "echo", "input": {"text": "hi"}, "reason": "to compare"}
    assert bot.post("/v1/agent/invocations", params={"wait": 10}, json=call).status_code == 202
    outcomes = app.state.toolrelay.outcomes
    assert until(lambda: outcomes.listening)  # else the wait reads once before it waits
    reads: list[Any] = []
    read = Registry.get_invocation

    def counted(self: Registry, *args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(Registry, "get_invocation", counted)
    answer = bot.post("/v1/agent/invocations", params={"wait": 10}, json=call).json()
    assert reads == []
    monkeypatch.undo()
    assert answer["status"] == "completed", answer
    shown = bot.get(f"/v1/agent/invocations/{answer['id']}").json()
    assert answer == {key: shown[key] for key in answer}
    assert (answer["tool_key"], answer["agent_name"], answer["reason"]) == (
        "echo",
        "bot",
        "to compare",
    )
