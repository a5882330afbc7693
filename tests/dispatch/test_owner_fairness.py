"""One owner's flood of calls does not keep another owner's calls waiting.

Workers are shared by every tenant. The claim took the oldest runnable calls, whoever's:
an owner (or its agent, looping) that queued thousands of calls to a slow upstream filled
every slot a worker has, and each slot that freed went to that owner's next call, so
another owner's call waited for the whole flood to be sent (hours, at 30 s a call). Now a
claim takes turns between owners: each owner's calls queued in order, an owner's turn
counted from the calls of it the worker already holds (tests/dispatch/test_tool_room.py is
the same for one tool's ``max_concurrency``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from uuid import UUID, uuid4

import psycopg
from aiohttp import web

from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.store import DispatchStore, open_pool
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]
WITHIN = 10.0  # seconds; a call stuck behind the flood fails the test instead


class Held:
    """An upstream route whose calls wait until released, one at a time or all."""

    def __init__(self) -> None:
        self.arrived: asyncio.Queue[str] = asyncio.Queue()  # every route's arrivals, in order
        self.waiting: list[asyncio.Event] = []
        self.all = asyncio.Event()

    async def slow(self, _: web.Request, _hit: int) -> web.Response:
        gate = asyncio.Event()
        self.waiting.append(gate)
        self.arrived.put_nowait("slow")
        await asyncio.wait([asyncio.ensure_future(gate.wait()), asyncio.ensure_future(self.all.wait())],
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        return web.json_response({"slow": True})

    async def fast(self, _: web.Request, _hit: int) -> web.Response:
        self.arrived.put_nowait("fast")
        return web.json_response({"fast": True})

    def release_one(self) -> None:
        self.waiting.pop(0).set()

    async def next_arrival(self) -> str:
        return await asyncio.wait_for(self.arrived.get(), WITHIN)


def quiet_worker(database_url: str, slots: int) -> Worker:
    """A worker that claims only when told (a slot freed, a notification): no 1 s poll."""
    settings = WorkerSettings(concurrency=slots, lease_seconds=5.0, poll_interval=30.0)
    return Worker(database_url, settings, None, LOOPBACK_ONLY)


@asynccontextmanager
async def sending(worker: Worker, held: Held) -> AsyncIterator[None]:
    """The worker runs in this event loop; at the end every held call is let go, and the
    worker stops (its calls in flight finish)."""
    running = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        held.all.set()
        worker.stop()
        await running


async def started(worker: Worker) -> None:
    """Once the worker takes hand-offs (its start runs in this event loop: yield to it)."""
    while not worker.taking_hand_offs:
        await asyncio.sleep(0)


def flood_and_one(
    make_registry: Callable[[], Registry], upstream: Upstream, held: Held, flood: int
) -> tuple[Registry, list[str], Callable[[], str]]:
    """Owner A's ``flood`` calls of a slow tool, queued; and a way for owner B to make one
    call of a fast tool (queued after all of A's)."""
    upstream.routes["/slow"] = held.slow
    upstream.routes["/fast"] = held.fast
    flooding, other = make_registry(), make_registry()
    agent, tool = agent_with_tool(flooding, endpoint_url=f"{upstream.base_url}/slow")
    calls = [str(flooding.invoke(agent, tool["key"], {})) for _ in range(flood)]
    other_agent, other_tool = agent_with_tool(other, endpoint_url=f"{upstream.base_url}/fast")
    return flooding, calls, lambda: str(other.invoke(other_agent, other_tool["key"], {}))


async def test_a_flood_queued_first_does_not_take_every_slot(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str, drain: Drain
) -> None:
    held = Held()
    _, _, other_call = flood_and_one(make_registry, upstream, held, flood=20)
    other_call()  # queued behind all 20
    worker = quiet_worker(database_url, slots=4)
    async with sending(worker, held):
        # The first claim takes turns: the flood's oldest, then the other owner's, ...
        arrivals = [await held.next_arrival() for _ in range(4)]
        assert "fast" in arrivals, arrivals
        assert arrivals.count("slow") == 3
    await drain()


async def test_a_slot_freed_by_the_flood_goes_to_the_other_owners_call(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str, drain: Drain
) -> None:
    held = Held()
    flooding, calls, other_call = flood_and_one(make_registry, upstream, held, flood=10)
    worker = quiet_worker(database_url, slots=2)
    async with sending(worker, held):
        assert [await held.next_arrival() for _ in range(2)] == ["slow", "slow"]  # all slots
        other_call()  # waits in the queue: the worker has no slot free
        held.release_one()
        # Before: the freed slot went to the flood's third call, the oldest queued.
        assert await held.next_arrival() == "fast"
        # and the flood goes on once the other owner has had its turn
        held.release_one()
        assert await held.next_arrival() == "slow"
    await drain()
    assert all(flooding.get_invocation(c)["status"] == "completed" for c in calls)


async def test_one_owner_alone_still_gets_every_slot(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str, drain: Drain
) -> None:
    """Turns are taken between owners with calls waiting; alone, an owner's calls fill the
    worker as before, in the order they were made."""
    held = Held()
    _, calls, _ = flood_and_one(make_registry, upstream, held, flood=6)
    worker = quiet_worker(database_url, slots=4)
    async with sending(worker, held):
        assert [await held.next_arrival() for _ in range(4)] == ["slow"] * 4
        with psycopg.connect(database_url) as conn:
            claimed = conn.execute(
                "SELECT id::text FROM agents.tool_invocations WHERE id = ANY(%s::uuid[])"
                " AND attempt = 1 ORDER BY id",
                (calls,),
            ).fetchall()
        assert [c for (c,) in claimed] == sorted(calls[:4])  # the oldest four
    await drain()


async def test_an_owner_takes_at_most_half_the_slots_by_hand_off(database_url: str) -> None:
    """``serve`` hands its calls to its worker's free slots (migration 0036). Past half of
    them for one owner, that owner's next calls are made unclaimed and queue, where the
    claim gives every owner its turn: an agent looping through ``serve`` cannot take each
    slot as it frees ahead of another owner's calls waiting in the queue."""
    worker = quiet_worker(database_url, slots=4)
    running = asyncio.create_task(worker.run())
    flooding, other = uuid4(), uuid4()
    try:
        await asyncio.wait_for(started(worker), WITHIN)
        assert worker.reserve(flooding) is not None
        assert worker.reserve(flooding) is not None
        assert worker.reserve(flooding) is None  # half of 4 slots: its third call queues
        assert worker.reserve(other) is not None  # another owner's is still handed over
        assert worker.reserve(None) is not None  # a call of no stated owner: slots only
        worker.adopt(None, flooding)  # one of its calls was not made after all
        assert worker.reserve(flooding) is not None
        for owner in (flooding, flooding, other, None):
            worker.adopt(None, owner)
        assert worker.reserved == 0 and not worker.owner_reserved
    finally:
        worker.stop()
        await running


async def test_a_claim_fills_its_batch_from_owners_with_more_than_their_share(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str, drain: Drain
) -> None:
    """A claim first looks at each owner's share of its batch (8 calls, 4 owners: 2 each),
    then, short of the batch, at more of those that had more: one owner with 10 calls and
    three with one call each fill a claim of 8 (the three, and 5 of the ten in order)."""
    big, *small = make_registry(), make_registry(), make_registry(), make_registry()
    agent, tool = agent_with_tool(big, endpoint_url=f"{upstream.base_url}/a")
    bigs = [str(big.invoke(agent, tool["key"], {})) for _ in range(10)]
    smalls = []
    for registry in small:
        agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/b")
        smalls.append(str(registry.invoke(agent, tool["key"], {})))
    async with open_pool(database_url, max_size=1) as pool:
        claimed = {str(row["id"]) for row in await DispatchStore(pool, "fill-test").claim(8, 5.0)}
    assert claimed == set(smalls) | set(bigs[:5])
    await drain()


def owners_with_calls(
    make_registry: Callable[[], Registry], upstream: Upstream, owners: int, calls: int
) -> dict[str, list[str]]:
    """``owners`` new owners with ``calls`` calls each queued: owner id -> call ids."""
    made: dict[str, list[str]] = {}
    for _ in range(owners):
        registry = make_registry()
        agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/x")
        made[str(registry.owner)] = [
            str(registry.invoke(agent, tool["key"], {})) for _ in range(calls)
        ]
    return made


def forget(database_url: str, made: dict[str, list[str]]) -> None:
    """Delete the test's calls: some are claimed by stores no worker runs, or not due."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM agents.tool_invocations WHERE owner = ANY(%s::uuid[])",
                     (list(made),))  # fmt: skip


async def test_a_claim_visits_a_batchs_worth_of_owners_not_every_one(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    """With many owners' calls queued, a claim of 4 visits about 4 of the owners, not all of
    them: visiting every owner (one probe and one locked row each) cost a claim of 64 with
    1,000 owners queued 7.2 ms against 1.7 ms for one owner (bench/RESULTS.md)."""
    made = owners_with_calls(make_registry, upstream, owners=150, calls=2)
    try:
        async with open_pool(database_url, max_size=1) as pool:
            store = DispatchStore(pool, "walk-test")
            async with pool.connection() as conn, conn.transaction():
                cur = await conn.execute(store.q["claim"], store._claiming(4, 5.0, None))
                assert len(await cur.fetchall()) == 4
                cur = await conn.execute(
                    "SELECT idx_scan FROM pg_stat_xact_user_tables"
                    " WHERE relid = 'agents.tool_invocations'::regclass"
                )
                scans = await cur.fetchone()
        assert scans is not None
        # three for each owner visited (the next owner, has it a call to take now, its
        # calls): 16 in all today; visiting all 150 owners took 305
        assert scans["idx_scan"] <= 5 * 4, scans
    finally:
        forget(database_url, made)


async def test_successive_claims_go_round_every_owner(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    """A worker's claims go on from the owner its last claim stopped at, round to the first
    owner past the last: with 10 owners of 3 calls and claims of 4, every owner has a call
    claimed before any owner has a third, wherever the worker starts."""
    made = owners_with_calls(make_registry, upstream, owners=10, calls=3)
    owner_of = {call: owner for owner, calls in made.items() for call in calls}
    try:
        for start in [*sorted(made), str(uuid4())]:
            held: Counter[str] = Counter()
            async with open_pool(database_url, max_size=1) as pool:
                store = DispatchStore(pool, f"round-{start}")
                store.after = UUID(start)
                for claim in range(1, 8):
                    busy = ({}, [], {UUID(o): n for o, n in held.items()})
                    rows = await store.claim(4, 60.0, busy=busy)
                    held.update(owner_of[str(row["id"])] for row in rows)
                    assert max(held.values()) - min(held[o] for o in made) <= 1, (claim, held)
                assert sum(held.values()) == 28
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(
                    "UPDATE agents.tool_invocations SET attempt = 0, lease_owner = NULL,"
                    " lease_expires_at = NULL WHERE owner = ANY(%s::uuid[])",
                    (list(made),),
                )
    finally:
        forget(database_url, made)


async def test_owners_with_nothing_to_take_now_do_not_hide_one_that_has(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    """The owners a claim visits are counted only when they have a call to take now: owners
    whose calls all wait for a retry (or are in flight) are passed over, however many, and
    a claim of 4 reaches the one owner with a call due, wherever the worker starts."""
    made = owners_with_calls(make_registry, upstream, owners=20, calls=1)
    due = sorted(made)[7]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE agents.tool_invocations SET run_after = now() + interval '1 hour'"
            " WHERE owner = ANY(%s::uuid[]) AND owner <> %s",
            (list(made), due),
        )
    try:
        async with open_pool(database_url, max_size=1) as pool:
            for start in sorted(made):
                store = DispatchStore(pool, "hidden-test")
                store.after = UUID(start)
                async with pool.connection() as conn, conn.transaction(force_rollback=True):
                    cur = await conn.execute(store.q["claim"], store._claiming(4, 5.0, None))
                    assert [str(r["id"]) for r in await cur.fetchall()] == made[due], start
    finally:
        forget(database_url, made)
