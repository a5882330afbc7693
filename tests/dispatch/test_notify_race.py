"""Calls notify only sleeping workers (migration 0016), and no wake-up is lost on the way.

The race: a call looks for sleepers (none), a worker registers, claims once more (the call
is not committed yet) and waits; the call commits without notifying. Each test drives the
interleaving with explicit transactions on separate connections, in its own database, and
no worker runs: only a notification or the worker's own claim can find the call, never the
poll.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from uuid import UUID

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.pgtest import create_database, drop_database
from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database, migrate
from toolrelay.db.connect import _SET_IDENTITY, OWNER_ROLE
from toolrelay.registry import Registry

CHANNEL = "toolrelay_runnable"
WORKER = "worker-1"
BLOCK_TIMEOUT = 10.0  # seconds for the worker's sleep to block or finish; a hang fails
# What a claim finds (dispatch.sql claims these, oldest first).
RUNNABLE = (
    "SELECT count(*) FROM agents.tool_invocations"
    " WHERE status = 'running' AND lease_owner IS NULL AND run_after <= now()"
)

# The protocol without its lock: the version the tests must catch.
NAIVE = """
CREATE OR REPLACE FUNCTION agents.wake_needed() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NOT (SELECT w.sleepers_only FROM agents.dispatch_wake w) THEN RETURN true; END IF;
    RETURN EXISTS (SELECT 1 FROM agents.dispatch_sleepers);
END $$;
CREATE OR REPLACE FUNCTION agents.fn_dispatch_sleep(p_worker text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog AS $$
    INSERT INTO agents.dispatch_sleepers (worker) VALUES (p_worker) ON CONFLICT DO NOTHING;
$$;
"""


@dataclass
class Scene:
    url: str
    owner: UUID
    agent_id: UUID
    tool_id: UUID


@pytest.fixture
def scene(admin_url: str) -> Iterator[Scene]:
    """A database of its own (the protocol switch is database-wide) with one callable tool."""
    url = create_database(admin_url)
    migrate(url)
    db = Database(url)
    try:
        registry = Registry(db, uuid.uuid4())
        agent, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/echo")
        yield Scene(url, registry.owner, registry.get_agent(agent)["id"], tool["id"])
    finally:
        db.close()
        drop_database(admin_url, url)


def admin(scene: Scene) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(scene.url, autocommit=True)


def sleepers_only(scene: Scene, on: bool = True) -> None:
    with admin(scene) as conn:
        conn.execute("UPDATE agents.dispatch_wake SET sleepers_only = %s", (on,))


def start_call(scene: Scene) -> psycopg.Connection[tuple[object, ...]]:
    """fn_invoke_tool in a transaction left open: its trigger has run, it has not committed."""
    conn = psycopg.connect(scene.url)
    claims = f'{{"sub": "{scene.owner}", "role": "{OWNER_ROLE}"}}'
    conn.execute(_SET_IDENTITY, (OWNER_ROLE, str(scene.owner), claims))
    conn.execute(
        "SELECT fn_invoke_tool(%s, %s, %s)", (scene.agent_id, scene.tool_id, Jsonb({}))
    ).fetchone()
    return conn


class Listener:
    """The worker's LISTEN connection; counts notifications that reached it."""

    def __init__(self, scene: Scene) -> None:
        self.conn = psycopg.connect(scene.url, autocommit=True)
        self.received = 0
        self.conn.add_notify_handler(self._count)
        self.conn.execute(f"LISTEN {CHANNEL}")

    def _count(self, _notify: psycopg.Notify) -> None:
        self.received += 1

    def collect(self) -> int:
        # A commit signals listeners before it returns; a round trip delivers what is queued.
        self.conn.execute("SELECT 1")
        return self.received


def go_to_sleep(scene: Scene) -> tuple[threading.Thread, dict[str, int]]:
    """The worker's side in a thread: register, commit, claim once more (what it finds)."""
    found: dict[str, int] = {}
    ready = threading.Event()

    def body() -> None:
        with psycopg.connect(scene.url) as conn:
            found["pid"] = conn.info.backend_pid
            ready.set()
            conn.execute("SELECT agents.fn_dispatch_sleep(%s)", (WORKER,))
            conn.commit()
            row = conn.execute(RUNNABLE).fetchone()
            found["runnable"] = int(row[0]) if row else 0

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert ready.wait(BLOCK_TIMEOUT)
    return thread, found


def blocked_or_done(scene: Scene, thread: threading.Thread, pid: int) -> str:
    """Wait (on the thread, or on the server's lock table) until the worker's sleep has
    either finished or is waiting for a lock: the only two states it can reach."""
    with admin(scene) as conn:
        for _ in range(int(BLOCK_TIMEOUT / 0.005)):
            thread.join(0.005)
            if not thread.is_alive():
                return "done"
            waiting = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
            ).fetchone()
            if waiting and waiting[0]:
                return "blocked"
    raise AssertionError("the worker's sleep neither finished nor blocked")


def race(scene: Scene) -> tuple[str, int, int]:
    """A call looks before the worker registers and commits after it would have re-claimed.
    Returns (how the sleep went, calls the re-claim found, notifications received)."""
    sleepers_only(scene)
    listener = Listener(scene)
    call = start_call(scene)  # looked: no sleeper yet
    thread, found = go_to_sleep(scene)
    state = blocked_or_done(scene, thread, found["pid"])
    call.commit()
    thread.join(BLOCK_TIMEOUT)
    assert not thread.is_alive()
    call.close()
    received = listener.collect()
    listener.conn.close()
    return state, found["runnable"], received


def test_a_call_that_looked_before_the_worker_slept_is_found_by_its_last_claim(
    scene: Scene,
) -> None:
    state, runnable, received = race(scene)
    # The worker's sleep waited for the open call, so its last claim sees the committed call.
    assert state == "blocked"
    assert runnable == 1 or received >= 1, "wake-up lost: neither claimed nor notified"
    assert runnable == 1


def test_the_race_loses_the_wake_up_without_the_lock(scene: Scene) -> None:
    """The same interleaving against the protocol minus its lock: the test above would fail."""
    with admin(scene) as conn:
        conn.execute(NAIVE)
    state, runnable, received = race(scene)
    assert state == "done"
    assert (runnable, received) == (0, 0)  # lost: only the poll would find it


def test_a_call_after_the_worker_slept_notifies_it(scene: Scene) -> None:
    sleepers_only(scene)
    listener = Listener(scene)
    thread, found = go_to_sleep(scene)
    thread.join(BLOCK_TIMEOUT)
    assert found["runnable"] == 0
    start_call(scene).commit()
    assert listener.collect() == 1


def test_no_sleeper_no_notification_and_a_woken_worker_is_not_notified(scene: Scene) -> None:
    sleepers_only(scene)
    listener = Listener(scene)
    start_call(scene).commit()
    assert listener.collect() == 0  # nobody waits: the call commits without the NOTIFY lock
    thread, _ = go_to_sleep(scene)
    thread.join(BLOCK_TIMEOUT)
    with admin(scene) as conn:
        conn.execute("SELECT agents.fn_dispatch_wake(%s)", (WORKER,))
    start_call(scene).commit()
    assert listener.collect() == 0


def test_until_a_worker_turns_the_protocol_on_every_call_notifies(scene: Scene) -> None:
    """Workers that do not follow the protocol (today's) are woken as before."""
    listener = Listener(scene)
    for _ in range(2):
        start_call(scene).commit()
        assert listener.collect() >= 1
        listener.received = 0
