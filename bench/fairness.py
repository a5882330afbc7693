"""Owners taking turns: how long one owner's call waits behind another owner's flood.

``python -m bench.fairness [--baseline-src DIR] [--flood N] [--seconds S]``: owner A queues
N calls of a tool whose upstream answers after S seconds (320 and 1 s by default), then
owner B makes one call of a tool that answers at once; one worker of 64 slots (the
default) sends them. Two cases: B's call made right after A's, before the worker starts
("queued behind"), and B's call made once the worker holds 64 of A's ("slots full"). For
each: B's wait from its creation to its request reaching the upstream, and how long A's
flood took (which turns must not slow). ``--baseline-src``: the same, alternating, with the
toolrelay of another copy of src/ (a commit before migration 0051: the calls claimed in the
order they were made) in the same run. Each round runs in a child process with a fresh
database migrated by that round's code, the upstream and the worker in its event loop.
Loopback only; about 30 s a round at the defaults.
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
REPO = Path(__file__).resolve().parent.parent


async def one_case(url: str, flood: int, delay: float, full_first: bool) -> dict[str, float]:
    from toolrelay.db import Database
    from toolrelay.db.migrate import migrate
    from toolrelay.dispatch.egress import EgressPolicy
    from toolrelay.dispatch.worker import Worker, WorkerSettings
    from toolrelay.registry import Registry, ToolSpec

    migrate(url)
    arrived: dict[str, float] = {}
    slow_seen = asyncio.Event()
    slow_count = 0

    async def slow(_: web.Request) -> web.Response:
        nonlocal slow_count
        slow_count += 1
        if slow_count >= SLOTS:
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

    def owner_with_tool(path: str) -> tuple[Registry, str]:
        registry = Registry(db, uuid.uuid4())
        registry.create_agent("bot")
        spec = ToolSpec(key="t", name="t", endpoint_url=f"http://127.0.0.1:{port}{path}",
                        http_method="GET", egress_class="read_only")  # fmt: skip
        registry.register_tool(spec)
        registry.assign("bot", "t")
        return registry, "t"

    flooding, slow_key = owner_with_tool("/slow")
    other, fast_key = owner_with_tool("/fast")
    flood_ids = [
        await asyncio.to_thread(flooding.invoke, "bot", slow_key, {}) for _ in range(flood)
    ]
    egress = EgressPolicy(allow_hosts=frozenset(), allow_networks=(ipaddress.ip_network("127.0.0.1/32"),))  # fmt: skip
    worker = Worker(url, WorkerSettings(concurrency=SLOTS, lease_seconds=60.0), None, egress)
    made = 0.0
    if not full_first:
        made = time.time()
        await asyncio.to_thread(other.invoke, "bot", fast_key, {})
    started = time.time()
    running = asyncio.create_task(worker.run())
    if full_first:
        await asyncio.wait_for(slow_seen.wait(), 60)
        made = time.time()
        await asyncio.to_thread(other.invoke, "bot", fast_key, {})
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
        for case, full_first in (("queued behind", False), ("slots full", True)):
            url = pg.database("fairness")
            out[case] = asyncio.run(one_case(url, flood, delay, full_first))
    return out


def child(src: Path | None, flood: int, delay: float) -> dict[str, dict[str, float]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [*([str(src)] if src else []), str(REPO), env.get("PYTHONPATH", "")]
    )
    argv = python_module("bench.fairness", "measure", str(flood), str(delay))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fairness child failed: {done.stderr[-2000:]}")
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(baseline: Path | None, flood: int, delay: float) -> None:
    codes = {"this code": None} | ({"baseline": baseline} if baseline else {})
    runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in codes}
    for _ in range(ROUNDS):
        for name, src in codes.items():
            runs[name].append(child(src, flood, delay))
    rows = []
    for name, results in runs.items():
        for case in ("queued behind", "slots full"):
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
    if args[:1] == ["measure"]:
        print(json.dumps(measure(int(args[1]), float(args[2]))))
    else:
        base = Path(args[args.index("--baseline-src") + 1]) if "--baseline-src" in args else None
        n = int(args[args.index("--flood") + 1]) if "--flood" in args else 320
        s = float(args[args.index("--seconds") + 1]) if "--seconds" in args else 1.0
        main(base, n, s)
