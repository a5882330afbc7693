"""Calls notify only sleeping workers (migrations 0016, 0018), and no wake-up is lost.

The race: a call looks for sleepers (none), a worker registers, claims once more (the call
is not committed yet) and waits; the call commits without notifying. Each race test drives
the interleaving with explicit transactions on separate connections, in its own database,
and no worker runs: only a notification or the worker's own claim can find the call, never
the poll. Both ways of going to sleep are raced: 0016's fn_dispatch_sleep and 0018's
fn_dispatch_try_sleep (the worker's, with a lock timeout), each against its lockless version.

The end-to-end tests run the real worker with a 30 s poll: a call it was not woken for
would hang the test, not slow it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from uuid import UUID

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.upstream import start_upstream
from tests.pgtest import create_database, drop_database
from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay.db import Database, migrate
from toolrelay.db.connect import _SET_IDENTITY, OWNER_ROLE
from toolrelay.dispatch.worker import STAY_AWAKE, Worker, WorkerSettings
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
NAIVE_TRY = """
CREATE OR REPLACE FUNCTION agents.fn_dispatch_try_sleep(p_worker text) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog AS $$
    INSERT INTO agents.dispatch_sleepers (worker) VALUES (p_worker) ON CONFLICT DO NOTHING;
    SELECT true;
$$;
"""
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
    registry: Registry


@pytest.fixture
def scene(admin_url: str) -> Iterator[Scene]:
    """A database of its own (the protocol switch is database-wide) with one callable tool."""
    url = create_database(admin_url)
    migrate(url)
    db = Database(url)
    try:
        registry = Registry(db, uuid.uuid4())
        agent, tool = agent_with_tool(registry, endpoint_url="http://127.0.0.1:9/echo")
        yield Scene(url, registry.owner, registry.get_agent(agent)["id"], tool["id"], registry)
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


# How a worker goes to sleep: 0016's function, or 0018's with its lock timeout (the one
# the worker runs: it answers whether the worker is registered asleep).
SLEEP = "SELECT agents.fn_dispatch_sleep(%s)"
TRY_SLEEP = "SELECT agents.fn_dispatch_try_sleep(%s)"


def go_to_sleep(scene: Scene, how: str = SLEEP) -> tuple[threading.Thread, dict[str, int]]:
    """The worker's side in a thread: register, commit, claim once more (what it finds)."""
    found: dict[str, int] = {}
    ready = threading.Event()

    def body() -> None:
        with psycopg.connect(scene.url) as conn:
            found["pid"] = conn.info.backend_pid
            ready.set()
            asleep = conn.execute(how, (WORKER,)).fetchone()
            found["asleep"] = int(asleep[0] is not False) if asleep else 1
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


def race(scene: Scene, how: str = SLEEP) -> tuple[str, int, int]:
    """A call looks before the worker registers and commits after it would have re-claimed.
    Returns (how the sleep went, calls the re-claim found, notifications received)."""
    sleepers_only(scene)
    listener = Listener(scene)
    call = start_call(scene)  # looked: no sleeper yet
    thread, found = go_to_sleep(scene, how)
    state = blocked_or_done(scene, thread, found["pid"])
    call.commit()
    thread.join(BLOCK_TIMEOUT)
    assert not thread.is_alive()
    call.close()
    received = listener.collect()
    listener.conn.close()
    return state, found["runnable"], received


@pytest.mark.parametrize("how", [SLEEP, TRY_SLEEP])
def test_a_call_that_looked_before_the_worker_slept_is_found_by_its_last_claim(
    scene: Scene, how: str
) -> None:
    state, runnable, received = race(scene, how)
    # The worker's sleep waited for the open call, so its last claim sees the committed call.
    assert state == "blocked"
    assert runnable == 1 or received >= 1, "wake-up lost: neither claimed nor notified"
    assert runnable == 1


@pytest.mark.parametrize(("how", "naive"), [(SLEEP, NAIVE), (TRY_SLEEP, NAIVE_TRY)])
def test_the_race_loses_the_wake_up_without_the_lock(scene: Scene, how: str, naive: str) -> None:
    """The same interleaving against the protocol minus its lock: the test above would fail."""
    with admin(scene) as conn:
        conn.execute(naive)
    state, runnable, received = race(scene, how)
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


def test_a_sleep_that_cannot_take_the_lock_soon_registers_nothing(scene: Scene) -> None:
    """A call's transaction left open: the worker's sleep gives up after its lock timeout
    (0018: 100 ms) instead of waiting, says so, and leaves no sleeper row (it stays awake)."""
    sleepers_only(scene)
    call = start_call(scene)
    try:
        began = time.monotonic()
        thread, found = go_to_sleep(scene, TRY_SLEEP)
        thread.join(BLOCK_TIMEOUT)
        assert not thread.is_alive()
        assert time.monotonic() - began < BLOCK_TIMEOUT / 2
        assert found["asleep"] == 0
        with admin(scene) as conn:
            assert conn.execute("SELECT count(*) FROM agents.dispatch_sleepers").fetchone() == (0,)
    finally:
        call.close()


def register(scene: Scene, worker: str, seconds: float) -> bool:
    with admin(scene) as conn:
        row = conn.execute("SELECT agents.fn_dispatch_register(%s, %s)", (worker, seconds))
        return bool(row.fetchone()[0])  # type: ignore[index]


def test_the_protocol_is_on_while_a_registration_is_live(scene: Scene) -> None:
    """No registered worker (workers that do not follow the protocol): every call notifies.
    A live registration turns it on; once it lapses, every call notifies again."""
    listener = Listener(scene)
    assert register(scene, "w-live", 0.5) is False  # a new registration
    start_call(scene).commit()
    assert listener.collect() == 0  # on: nobody asleep, no notification
    time.sleep(0.6)
    start_call(scene).commit()
    assert listener.collect() == 1  # lapsed: off again
    listener.conn.close()


def test_a_dead_workers_sleeper_row_costs_extra_notifications_only(scene: Scene) -> None:
    """A worker died asleep: its row makes calls notify though nobody waits (harmless);
    a live worker's registration removes it once the dead one's registration lapsed. A
    sleeper that never registered (0016's protocol used alone) is left alone."""
    listener = Listener(scene)
    with admin(scene) as conn:
        conn.execute("INSERT INTO agents.dispatch_workers VALUES ('ghost', now() - interval '1 s')")
        conn.execute("INSERT INTO agents.dispatch_sleepers (worker) VALUES ('ghost')")
    assert register(scene, "w-live", 60) is False
    assert register(scene, "w-live", 60) is True  # renewed while live
    with admin(scene) as conn:
        left = conn.execute("SELECT worker FROM agents.dispatch_sleepers").fetchall()
    assert left == []  # the lapsed one's row went with its registration
    with admin(scene) as conn:
        conn.execute("INSERT INTO agents.dispatch_sleepers (worker) VALUES ('ghost')")
    start_call(scene).commit()
    assert listener.collect() == 1  # the leftover row: a notification nobody needed
    with admin(scene) as conn:
        conn.execute("DELETE FROM agents.dispatch_workers WHERE worker = 'ghost'")
    register(scene, "w-live", 60)
    with admin(scene) as conn:
        left = conn.execute("SELECT worker FROM agents.dispatch_sleepers").fetchall()
    assert left == [("ghost",)]  # never registered: not ours to remove
    listener.conn.close()


# --- end to end: the worker follows the protocol --------------------------------------

LONG_POLL = 30.0  # the worker's poll: a call it is not woken for waits this long
WOKEN_WITHIN = 5.0  # seconds for a call to complete when the worker is woken for it


async def wait_for(predicate: object, what: str, timeout: float = WOKEN_WITHIN) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.01)


def sleepers(scene: Scene) -> list[str]:
    with admin(scene) as conn:
        return [str(r[0]) for r in conn.execute("SELECT worker FROM agents.dispatch_sleepers")]


@asynccontextmanager
async def running_worker(
    scene: Scene, worker_id: str, stay_awake: float = STAY_AWAKE
) -> AsyncIterator[Worker]:
    settings = WorkerSettings(
        concurrency=4, lease_seconds=30.0, poll_interval=LONG_POLL, worker_id=worker_id,
        stay_awake=stay_awake,
    )  # fmt: skip
    worker = Worker(scene.url, settings, None, LOOPBACK_ONLY)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)


def invoke_and_time(scene: Scene, tool_key: str) -> tuple[UUID, float]:
    return scene.registry.invoke("bot", tool_key, {}), time.monotonic()


async def test_an_idle_worker_is_woken_by_a_call_long_before_its_poll(scene: Scene) -> None:
    upstream, runner = await start_upstream()
    tool = add_tool(scene.registry, key="echo.woken", endpoint_url=f"{upstream.base_url}/w")
    scene.registry.assign("bot", tool["key"])
    try:
        async with running_worker(scene, "w-e2e") as worker:
            for round_ in range(3):  # asleep again after each call
                await wait_for(
                    lambda: worker.asleep and sleepers(scene) == ["w-e2e"], "the worker asleep"
                )
                inv, began = invoke_and_time(scene, tool["key"])
                await wait_for(
                    lambda inv=inv: scene.registry.get_invocation(inv)["status"] == "completed",
                    f"call {round_} completed (the poll is {LONG_POLL:g} s)",
                )
                assert time.monotonic() - began < WOKEN_WITHIN
        assert sleepers(scene) == []  # removed at shutdown
        with admin(scene) as conn:
            assert conn.execute("SELECT count(*) FROM agents.dispatch_workers").fetchone() == (0,)
    finally:
        await runner.cleanup()


async def test_a_dead_sleepers_row_does_not_stop_a_live_worker(scene: Scene) -> None:
    """A dead worker's sleeper row (and lapsed registration) next to a live worker: calls
    still reach the live one at once; the row goes at the live one's first registration."""
    upstream, runner = await start_upstream()
    tool = add_tool(scene.registry, key="echo.ghost", endpoint_url=f"{upstream.base_url}/g")
    scene.registry.assign("bot", tool["key"])
    with admin(scene) as conn:
        conn.execute("INSERT INTO agents.dispatch_workers VALUES ('ghost', now() - interval '1 s')")
        conn.execute("INSERT INTO agents.dispatch_sleepers (worker) VALUES ('ghost')")
    try:
        async with running_worker(scene, "w-live"):
            await wait_for(lambda: sleepers(scene) == ["w-live"], "only the live worker asleep")
            inv, began = invoke_and_time(scene, tool["key"])
            await wait_for(
                lambda: scene.registry.get_invocation(inv)["status"] == "completed",
                "the call completed",
            )
            assert time.monotonic() - began < WOKEN_WITHIN
    finally:
        await runner.cleanup()


# Counts the worker's registrations asleep (each an insert of its sleeper row).
COUNT_REGISTRATIONS = """
CREATE TABLE public.registrations (n bigint NOT NULL);
INSERT INTO public.registrations VALUES (0);
CREATE FUNCTION public.count_registration() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN UPDATE public.registrations SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER count_registration AFTER INSERT ON agents.dispatch_sleepers
    FOR EACH ROW EXECUTE FUNCTION public.count_registration();
"""
STREAM = 20  # calls made one after another, each once the one before it completed
STAYING = 2.0  # the worker's stay_awake in the test: longer than any gap between calls


def registrations(scene: Scene) -> int:
    with admin(scene) as conn:
        row = conn.execute("SELECT n FROM public.registrations").fetchone()
    assert row is not None
    return int(str(row[0]))


@pytest.mark.parametrize("stay_awake", [STAYING, 0.0])
async def test_while_calls_keep_coming_the_worker_looks_again_instead_of_sleeping(
    scene: Scene, stay_awake: float
) -> None:
    """A worker that found calls moments ago looks for more by itself rather than register
    asleep between them (each registration makes every call being made wait for the wake
    lock, and the next call notify: worker.STAY_AWAKE). Each call here is made once the one
    before it completed, when a worker that does not stay awake registers asleep; the first
    call, after a long pause, is not yet "calls keep coming". Once calls stop, it sleeps; a
    call then still wakes it (its poll is 30 s)."""
    upstream, runner = await start_upstream()
    tool = add_tool(scene.registry, key="echo.stream", endpoint_url=f"{upstream.base_url}/s")
    scene.registry.assign("bot", tool["key"])
    with admin(scene) as conn:
        conn.execute(COUNT_REGISTRATIONS)

    def completed(inv: UUID) -> bool:
        return bool(scene.registry.get_invocation(inv)["status"] == "completed")

    try:
        async with running_worker(scene, "w-stream", stay_awake) as worker:
            await wait_for(lambda: worker.asleep and sleepers(scene) == ["w-stream"], "asleep")
            before = registrations(scene)
            for n in range(STREAM):
                inv = await asyncio.to_thread(scene.registry.invoke, "bot", tool["key"], {})
                await wait_for(lambda inv=inv: completed(inv), f"call {n} completed")
            during = registrations(scene) - before
            await wait_for(
                lambda: worker.asleep and sleepers(scene) == ["w-stream"],
                "asleep once calls stopped",
                timeout=STAYING + WOKEN_WITHIN,
            )
            inv, began = invoke_and_time(scene, tool["key"])
            await wait_for(lambda: completed(inv), "a call after the stream completed")
            assert time.monotonic() - began < WOKEN_WITHIN
        if stay_awake:
            assert during <= 1, during
        else:  # one a call, but where the worker's claim came after the next call was made
            assert during >= STREAM // 2, during
    finally:
        await runner.cleanup()


# At the next registration asleep, once: a call of the tool, inserted in the registration's
# own statement, so that the claim pipelined after it (sleep_and_claim) is what finds it.
CALL_AT_REGISTRATION = """
CREATE TABLE public.armed (tool_id uuid);
CREATE FUNCTION public.call_at_registration() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE v_tool uuid;
BEGIN
    DELETE FROM public.armed RETURNING tool_id INTO v_tool;
    IF v_tool IS NOT NULL THEN
        INSERT INTO agents.tool_invocations (owner, tool_id, agent_id, input, status,
                                             approval_status, config_fingerprint)
        SELECT t.owner, t.id, s.agent_id, '{"at": "registration"}', 'running', 'not_required',
               f.fingerprint
          FROM agents.tools_registry t
          JOIN agents.tool_assignments s ON s.tool_id = t.id
          LEFT JOIN agents.tool_fingerprints f ON f.tool_id = t.id
         WHERE t.id = v_tool;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER call_at_registration AFTER INSERT ON agents.dispatch_sleepers
    FOR EACH ROW EXECUTE FUNCTION public.call_at_registration();
"""


async def test_a_call_found_by_the_registrations_claim_counts_as_calls_coming(
    scene: Scene,
) -> None:
    """A worker registering asleep claims once more (sleep_and_claim), and that claim can
    find the next call, made as the worker registered. It counts as calls coming like any
    other claim's find: a worker that then looked at when calls came only by its other
    claims registered asleep again after that call, and the call after it notified (two
    registrations in a stream of three calls made one after another; seen in CI)."""
    upstream, runner = await start_upstream()
    tool = add_tool(scene.registry, key="echo.found", endpoint_url=f"{upstream.base_url}/f")
    scene.registry.assign("bot", tool["key"])
    with admin(scene) as conn:
        conn.execute(COUNT_REGISTRATIONS)
        conn.execute(CALL_AT_REGISTRATION)

    def completed(inv: UUID) -> bool:
        return bool(scene.registry.get_invocation(inv)["status"] == "completed")

    def second_call() -> bool:
        with admin(scene) as conn:
            row = conn.execute(
                "SELECT 1 FROM agents.tool_invocations"
                " WHERE input ->> 'at' = 'registration' AND status = 'completed'"
            ).fetchone()
        return row is not None

    try:
        async with running_worker(scene, "w-found", STAYING) as worker:
            await wait_for(lambda: worker.asleep and sleepers(scene) == ["w-found"], "asleep")
            before = registrations(scene)
            with admin(scene) as conn:
                conn.execute("INSERT INTO public.armed VALUES (%s)", (tool["id"],))
            first = await asyncio.to_thread(scene.registry.invoke, "bot", tool["key"], {})
            await wait_for(lambda: completed(first), "the first call completed")
            # its worker registers asleep (calls had not kept coming yet): the second call
            await wait_for(second_call, "the call found at registration")
            third = await asyncio.to_thread(scene.registry.invoke, "bot", tool["key"], {})
            await wait_for(lambda: completed(third), "the third call completed")
            during = registrations(scene) - before
        assert during == 1, during  # after the first call only
    finally:
        await runner.cleanup()


def test_a_worker_looks_again_only_while_calls_come_closer_together_than_stay_awake() -> None:
    """The rule alone (no database): after calls found less than stay_awake apart, looks
    after 2, 4, 8 ms..., none past stay_awake since the last; calls further apart (a few a
    second) register asleep at once, as before: four empty claims a call would cost more."""
    settings = WorkerSettings(stay_awake=0.02, worker_id="w-rule")
    worker = Worker("postgresql://unused", settings, None, LOOPBACK_ONLY)

    def found(ago: float, gap: float) -> Worker:
        worker._found_at, worker._found_gap = time.monotonic() - ago, gap
        worker._empty_looks = 0
        return worker

    found(0.0, 0.005)
    waits = [worker._stay_awake() for _ in range(3)]
    assert waits == [0.002, 0.004, 0.008]
    worker._found_at -= 0.014  # as if those waits had passed: the next is what is left
    last = worker._stay_awake()
    assert last is not None and 0.005 < last <= 0.006
    assert found(0.021, 0.005)._stay_awake() is None  # nothing found for longer than that
    assert found(0.0, 0.05)._stay_awake() is None  # calls 50 ms apart: sleep between them
    assert found(0.0, float("inf"))._stay_awake() is None  # the first call after a pause
