"""Owners taking turns: how long one owner's call waits behind another owner's flood.

``python -m bench.fairness [--baseline-src DIR] [--flood N] [--seconds S]``: owner A queues
N calls of a tool whose upstream answers after S seconds (320 and 1 s by default), then
owner B makes one call of a tool that answers at once; one worker of 64 slots (the
default) sends them. Two cases: B's call made right after A's, before the worker starts
("queued behind"), and B's call made once the worker holds 64 of A's ("slots full"). For
each: B's wait from its creation to its request reaching the upstream, and how long A's
flood took (which turns must not slow). A third case: A's calls hold all but 4 slots when
B's call is made (a worker with calls in flight claimed once a quarter of its slots were
free, so B waited for A's calls to end). ``--baseline-src``: the same, alternating, with the
toolrelay of another copy of src/ (a commit before migration 0051: the calls claimed in the
order they were made) in the same run. Each round runs in a child process with a fresh
database migrated by that round's code, the upstream and the worker in its event loop.
Loopback only; about 30 s a round at the defaults.

``python -m bench.fairness --claim-cost [--baseline-src DIR]``: what one claim of 64 costs
as owners with calls queued grow (1 owner of 4,000 calls to 1,000 owners of 4), as a worker
runs it (its connection settings, the generic plan), each claim's calls put back so that
the next sees the same queue; the median of 20 after 5 to settle, in a fresh database for
each shape, alternating with the baseline's code when given.

``python -m bench.fairness --full-tool [--baseline-src DIR]``: the same claim among 64
owners while another owner has 0 to 100,000 calls queued for a tool with no room in the
worker (a ``max_concurrency`` of 1, held), and one call of another tool behind them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.procs import python_module
from bench.setup import scratch_server
from bench.tables import print_table

ROUNDS = 2  # per code, alternating
SLOTS = 64
SHAPES = ((1, 4000), (10, 400), (64, 63), (200, 20), (1000, 4))  # owners x calls queued each
FLOODS = (0, 1000, 10000, 100000)  # calls queued of a tool with no room
SETTLE, CLAIMS = 5, 20  # psycopg prepares at the fifth run
REPO = Path(__file__).resolve().parent.parent


def cases(flood: int) -> list[tuple[str, int, int | None]]:
    """(case, A's calls, B's call made once the worker holds this many of them)."""
    return [("queued behind", flood, None), ("slots full", flood, SLOTS),
            (f"{SLOTS - 4} of {SLOTS} slots held", SLOTS - 4, SLOTS - 4)]  # fmt: skip


def owner_with_tool(db: Any, url: str) -> Any:
    """A new owner (its Registry) with agent "bot" assigned tool "t", a GET of ``url``."""
    from toolrelay.registry import Registry, ToolSpec

    registry = Registry(db, uuid.uuid4())
    registry.create_agent("bot")
    registry.register_tool(ToolSpec(key="t", name="t", endpoint_url=url, http_method="GET",
                                    egress_class="read_only"))  # fmt: skip
    registry.assign("bot", "t")
    return registry


def alternate(baseline: Path | None, *args: str) -> dict[str, list[Any]]:
    """Each code's results of ``ROUNDS`` child runs of ``args``, this code and the
    baseline's taking turns."""
    codes = {"this code": None} | ({"baseline": baseline} if baseline else {})
    runs: dict[str, list[Any]] = {name: [] for name in codes}
    for _ in range(ROUNDS):
        for name, src in codes.items():
            runs[name].append(child(src, *args))
    return runs


async def one_case(url: str, flood: int, delay: float, held: int | None) -> dict[str, float]:
    """B's wait and A's flood's duration; B's call made once the worker holds ``held`` of
    A's calls (None: before the worker starts)."""
    from toolrelay.db import Database
    from toolrelay.db.migrate import migrate
    from toolrelay.dispatch.egress import EgressPolicy
    from toolrelay.dispatch.worker import Worker, WorkerSettings

    migrate(url)
    arrived: dict[str, float] = {}
    slow_seen = asyncio.Event()
    slow_count = 0

    async def slow(_: web.Request) -> web.Response:
        nonlocal slow_count
        slow_count += 1
        if slow_count == held:
            slow_seen.set()
        await asyncio.sleep(delay)
        return web.json_response({"ok": True})

    async def fast(_: web.Request) -> web.Response:
        arrived["fast"] = time.time()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/slow", slow)
    app.router.add_get("/fast", fast)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    db = Database(url)
    flooding = owner_with_tool(db, f"http://127.0.0.1:{port}/slow")
    other = owner_with_tool(db, f"http://127.0.0.1:{port}/fast")
    flood_ids = [await asyncio.to_thread(flooding.invoke, "bot", "t", {}) for _ in range(flood)]
    egress = EgressPolicy(allow_hosts=frozenset(), allow_networks=(ipaddress.ip_network("127.0.0.1/32"),))  # fmt: skip
    worker = Worker(url, WorkerSettings(concurrency=SLOTS, lease_seconds=60.0), None, egress)
    made = 0.0
    if held is None:
        made = time.time()
        await asyncio.to_thread(other.invoke, "bot", "t", {})
    started = time.time()
    running = asyncio.create_task(worker.run())
    if held is not None:
        await asyncio.wait_for(slow_seen.wait(), 60)
        made = time.time()
        await asyncio.to_thread(other.invoke, "bot", "t", {})
    while True:  # until the flood is recorded
        rows = await asyncio.to_thread(_unfinished, db, [str(i) for i in flood_ids])
        if rows == 0 and "fast" in arrived:
            break
        await asyncio.sleep(0.1)
    flood_s = time.time() - started
    worker.stop()
    await running
    await runner.cleanup()
    return {"wait_s": arrived["fast"] - made, "flood_s": flood_s}


def _unfinished(db: Any, ids: list[str]) -> int:
    with db.connect(autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM agents.tool_invocations"
            " WHERE id = ANY(%s::uuid[]) AND finished_at IS NULL",
            (ids,),
        ).fetchone()
    return int(row["n"])


def measure(flood: int, delay: float) -> dict[str, dict[str, float]]:
    """In a child: both cases, each on a fresh database; JSON on stdout's last line."""
    out = {}
    with scratch_server("toolrelay-fairness-") as pg:
        for case, calls, held in cases(flood):
            url = pg.database("fairness")
            out[case] = asyncio.run(one_case(url, calls, delay, held))
    return out


async def claim_ms(url: str, owners: int, calls: int) -> float:
    """The median time of one claim of 64 with ``owners`` x ``calls`` queued. The store's
    private ``_claiming`` builds its parameters: so do baselines back to 0051."""
    from toolrelay.db import Database
    from toolrelay.db.migrate import migrate

    migrate(url)
    db = Database(url)
    for _ in range(owners):
        invoke_n(owner_with_tool(db, "http://127.0.0.1:9/x"), "t", calls)
    return await timed_claims(db, url, None)


def invoke_n(registry: Any, tool_key: str, n: int) -> None:
    """``n`` calls of the owner's tool by agent "bot", made in one statement."""
    with registry.db.as_owner(registry.owner) as owner:
        owner.execute(
            "SELECT fn_invoke_tool(a.id, t.id, jsonb_build_object('n', g))"
            " FROM agents.agents a, agents.tools_registry t, generate_series(1, %s) g"
            " WHERE t.key = %s",
            (n, tool_key),
        )


async def timed_claims(db: Any, url: str, busy: Any) -> float:
    """The median time of one claim of 64 as a worker runs it (its connection settings,
    prepared at the fifth run: the generic plan), after ``SETTLE``. Each claim's calls are
    put back as they were, in a statement of their own: a claim rolled back would not do,
    psycopg forgets its prepared statements at a rollback (each run planned anew)."""
    from toolrelay.dispatch.store import DispatchStore, open_pool

    with db.connect(autocommit=True) as admin:
        admin.execute("ANALYZE agents.tool_invocations")
    times = []
    async with open_pool(url, max_size=1) as pool:
        store = DispatchStore(pool, "claim-cost")
        for _ in range(SETTLE + CLAIMS):
            async with pool.connection() as conn:
                began = time.perf_counter()
                cur = await conn.execute(store.q["claim"], store._claiming(SLOTS, 60.0, busy))
                claimed = [row["id"] for row in await cur.fetchall()]
                times.append(time.perf_counter() - began)
                await conn.execute(
                    "UPDATE agents.tool_invocations SET attempt = attempt - 1,"
                    " lease_owner = NULL, lease_expires_at = NULL WHERE id = ANY(%s)",
                    (claimed,),
                )
            assert len(claimed) == SLOTS, len(claimed)
    return statistics.median(times[SETTLE:]) * 1000


async def full_tool_ms(url: str, queued: int) -> float:
    """The median time of one claim of 64 while owner A has ``queued`` calls of a tool with
    no room in this worker (its ``max_concurrency`` held) and one call of another tool
    behind them, among 64 other owners with 4 calls each."""
    from toolrelay.db import Database
    from toolrelay.db.migrate import migrate
    from toolrelay.registry import ToolSpec

    migrate(url)
    db = Database(url)
    flooding = owner_with_tool(db, "http://127.0.0.1:9/x")
    full = flooding.register_tool(ToolSpec(key="one", name="one", http_method="GET",
                                           endpoint_url="http://127.0.0.1:9/y",
                                           egress_class="read_only", max_concurrency=1))  # fmt: skip
    flooding.assign("bot", "one")
    invoke_n(flooding, "one", queued)
    invoke_n(flooding, "t", 1)
    for _ in range(SLOTS):
        invoke_n(owner_with_tool(db, "http://127.0.0.1:9/x"), "t", 4)
    return await timed_claims(db, url, ({full["id"]: 1}, [full["id"]], {}))


def measure_full_tool() -> dict[str, float]:
    """In a child: each flood on a fresh database; JSON on stdout's last line."""
    out = {}
    with scratch_server("toolrelay-full-tool-") as pg:
        for queued in FLOODS:
            url = pg.database("fulltool")
            out[str(queued)] = asyncio.run(full_tool_ms(url, queued))
    return out


def measure_claims() -> dict[str, float]:
    """In a child: each shape on a fresh database; JSON on stdout's last line."""
    out = {}
    with scratch_server("toolrelay-claim-cost-") as pg:
        for owners, calls in SHAPES:
            url = pg.database("claimcost")
            out[f"{owners} x {calls}"] = asyncio.run(claim_ms(url, owners, calls))
    return out


def child(src: Path | None, *args: str) -> Any:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [*([str(src)] if src else []), str(REPO), env.get("PYTHONPATH", "")]
    )
    argv = python_module("bench.fairness", *args)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fairness child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def claim_cost(baseline: Path | None) -> None:
    runs = alternate(baseline, "measure-claims")
    rows = [[f"{owners} x {calls}"] + [" / ".join(f"{r[f'{owners} x {calls}']:.2f}" for r in runs[name])
             for name in runs] for owners, calls in SHAPES]  # fmt: skip
    title = (f"one claim of {SLOTS}, generic plan, ms (median of {CLAIMS}; each round);"
             f" {ROUNDS} rounds each, alternating")  # fmt: skip
    print_table(["owners x calls queued", *runs], rows, title)


def full_tool(baseline: Path | None) -> None:
    runs = alternate(baseline, "measure-full-tool")
    rows = [[f"{queued:,}"] + [" / ".join(f"{r[str(queued)]:.2f}" for r in runs[name])
             for name in runs] for queued in FLOODS]  # fmt: skip
    title = (f"one claim of {SLOTS} among {SLOTS} owners, generic plan, ms (median of"
             f" {CLAIMS}; each round), while another owner has calls queued of a tool with"
             f" no room; {ROUNDS} rounds each, alternating")  # fmt: skip
    print_table(["calls queued of the full tool", *runs], rows, title)


def main(baseline: Path | None, flood: int, delay: float) -> None:
    runs = alternate(baseline, "measure", str(flood), str(delay))
    rows = []
    for name, results in runs.items():
        for case, _, _ in cases(flood):
            waits = [r[case]["wait_s"] for r in results]
            floods = [r[case]["flood_s"] for r in results]
            rows.append([name, case, " / ".join(f"{w:.3f}" for w in waits),
                         f"{statistics.median(floods):.2f}"])  # fmt: skip
    title = (f"owner A: {flood} calls of a {delay:g} s upstream; owner B: one call;"
             f" one worker of {SLOTS} slots; {ROUNDS} rounds each, alternating")  # fmt: skip
    print_table(["code", "B's call made", "B's wait s (each round)", "A's flood s (median)"],
                rows, title)  # fmt: skip


if __name__ == "__main__":
    args = sys.argv[1:]
    base = Path(args[args.index("--baseline-src") + 1]) if "--baseline-src" in args else None
    if args[:1] == ["measure"]:
        print(json.dumps(measure(int(args[1]), float(args[2]))))
    elif args[:1] == ["measure-claims"]:
        print(json.dumps(measure_claims()))
    elif args[:1] == ["measure-full-tool"]:
        print(json.dumps(measure_full_tool()))
    elif "--full-tool" in args:
        full_tool(base)
    elif "--claim-cost" in args:
        claim_cost(base)
    else:
        n = int(args[args.index("--flood") + 1]) if "--flood" in args else 320
        s = float(args[args.index("--seconds") + 1]) if "--seconds" in args else 1.0
        main(base, n, s)
