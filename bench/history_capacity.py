"""Inputs of the capacity model (``python -m bench.history``, part 3).

- **Lifecycle by step.** One invocation's life as the dispatcher lives it, each step its own
  autocommit transaction as the worker runs it: create (``fn_invoke_tool`` as the owner),
  ``claim``, ``mark_sent``, ``finish`` (with its attempt row), from the measured copy of
  ``dispatch.sql``. Once with batches of 1 (an agent's single call, dispatched alone) and once
  with batches of 64 (a worker's full claim). Per step: WAL bytes (pg_current_wal_insert_lsn
  before/after, median over batches: other sessions on the server write WAL too) and the
  backend's CPU (from /proc, 10 ms ticks, summed over every batch).
- **Commit latency.** Sequential one-row INSERTs in autocommit: what one durable commit
  (WAL flush) costs on this machine.
- **The NOTIFY ceiling.** ``fn_invoke_tool`` as fast as C connections can call it, each call
  its own transaction, with the ``tool_invocations_notify`` trigger on and then off (in the
  scratch database only). pg_stat_activity is sampled every 20 ms for what the callers wait
  on: a NOTIFYing transaction holds a cluster-wide lock from its pre-commit to the end of its
  commit, WAL flush included, which shows as ``Lock:object``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from bench.context import Context
from bench.history_probe import backend_cpu_s, lsn_bytes, table_stats
from bench.latency import IDENTITY_SQL, INVOKE_SQL, percentiles
from bench.setup import Fixture, admin
from toolrelay.db.connect import OWNER_ROLE

US = 1e6
MS = 1000.0
WAIT_POLL_S = 0.02
STATS_FLUSH_S = 0.5  # closed backends have flushed their table statistics by then
LIFECYCLE_WORKER = "history-lifecycle"
CREATE_SQL = (
    "SELECT count(fn_invoke_tool(%(agent)s, %(tool)s, jsonb_build_object('n', g))) AS n"
    " FROM generate_series(1, %(batch)s::int) AS g"
)
WAITS_SQL = """
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS what, count(*) AS n
  FROM pg_stat_activity WHERE pid = ANY(%s) AND state = 'active' GROUP BY 1
"""
STEPS = ("create", "claim", "mark_sent", "finish")


# --- lifecycle by step -----------------------------------------------------------------------


@dataclass
class StepCost:
    step: str
    batch: int
    fillfactor: int
    invocations: int
    wal_bytes_per_call: float  # median over batches of (WAL of the step / batch)
    wal_bytes_per_call_min: float
    cpu_us_per_call: float  # the backend's CPU over every batch / invocations
    wall_ms_median: float  # one statement + commit, as the client saw it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _lsn(meter: psycopg.Connection[Any]) -> int:
    row = meter.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return lsn_bytes(str(row[0]))


def lifecycle(
    fx: Fixture, queries: dict[str, str], batch: int, batches: int, fillfactor: int = 70
) -> tuple[list[StepCost], dict[str, float]]:
    """Per step costs, and the HOT share of the table's updates over the whole run. The table's
    fillfactor is set for the run (new rows honour it at once) and put back to 70 after."""
    with admin(fx.url) as conn:
        conn.execute(f"ALTER TABLE agents.tool_invocations SET (fillfactor = {int(fillfactor)})")
    before = table_stats(fx.url)
    try:
        steps = _lifecycle(fx, queries, batch, batches, fillfactor)
    finally:
        with admin(fx.url) as conn:
            conn.execute("ALTER TABLE agents.tool_invocations SET (fillfactor = 70)")
    time.sleep(STATS_FLUSH_S)
    after = table_stats(fx.url)
    upd = after["n_tup_upd"] - before["n_tup_upd"]
    hot = after["n_tup_hot_upd"] - before["n_tup_hot_upd"]
    return steps, {
        "fillfactor": fillfactor,
        "batch": batch,
        "updates": upd,
        "hot": hot,
        "hot_pct": round(100.0 * hot / upd, 1) if upd else 0.0,
        "wal_bytes_per_call": round(sum(s.wal_bytes_per_call for s in steps), 1),
        "cpu_us_per_call": round(sum(s.cpu_us_per_call for s in steps), 1),
    }


def _lifecycle(
    fx: Fixture, queries: dict[str, str], batch: int, batches: int, fillfactor: int
) -> list[StepCost]:
    claims = json.dumps({"sub": str(fx.owner), "role": OWNER_ROLE})
    wal: dict[str, list[float]] = {s: [] for s in STEPS}
    cpu: dict[str, float] = dict.fromkeys(STEPS, 0.0)
    wall: dict[str, list[float]] = {s: [] for s in STEPS}
    with (
        psycopg.connect(fx.url, autocommit=True) as owner,
        psycopg.connect(fx.url, autocommit=True, row_factory=dict_row) as disp,
        psycopg.connect(fx.url, autocommit=True) as meter,
    ):
        owner.execute(IDENTITY_SQL, (str(fx.owner), claims))
        disp.execute("SET ROLE service_role")
        pids = {"owner": owner.info.backend_pid, "disp": disp.info.backend_pid}

        def step(name: str, conn: psycopg.Connection[Any], sql: str, params: Any) -> list[Any]:
            pid = pids["owner"] if conn is owner else pids["disp"]
            before_lsn = _lsn(meter)
            before_cpu = backend_cpu_s(pid)
            began = time.perf_counter()
            rows = conn.execute(sql, params).fetchall()
            wall[name].append((time.perf_counter() - began) * MS)
            cpu[name] += backend_cpu_s(pid) - before_cpu
            wal[name].append((_lsn(meter) - before_lsn) / batch)
            return rows

        for _ in range(batches):
            step("create", owner, CREATE_SQL, {"agent": fx.agent_id, "tool": fx.tool_id,
                                               "batch": batch})  # fmt: skip
            started = datetime.now(UTC)
            claimed = step(
                "claim",
                disp,
                queries["claim"],
                {"limit": batch, "worker": LIFECYCLE_WORKER, "lease": 30},
            )
            if len(claimed) != batch:
                raise RuntimeError(f"claimed {len(claimed)} of {batch}: the table was not empty")
            items = [{"id": str(r["id"]), "attempt": r["attempt"]} for r in claimed]
            step("mark_sent", disp, queries["mark_sent"],
                 {"items": Jsonb(items), "worker": LIFECYCLE_WORKER})  # fmt: skip
            results = [
                {"id": str(r["id"]), "attempt": r["attempt"], "status": "completed",
                 "output": {"ok": True}, "error": None, "error_code": None, "http_status": 200,
                 "output_mismatch": None, "retry_in_ms": 0.0, "clear_sent": False}
                for r in claimed
            ]  # fmt: skip
            ended = datetime.now(UTC).isoformat()
            attempts = [
                {"invocation_id": str(r["id"]), "owner": str(r["owner"]),
                 "attempt": r["attempt"], "started_at": started.isoformat(),
                 "finished_at": ended, "status_code": 200, "duration_ms": 1.0,
                 "error_code": None, "error": None}
                for r in claimed
            ]  # fmt: skip
            step("finish", disp, queries["finish"], {"results": Jsonb(results),
                 "attempts": Jsonb(attempts), "worker": LIFECYCLE_WORKER})  # fmt: skip
    total = batch * batches
    return [
        StepCost(
            step=s,
            batch=batch,
            fillfactor=fillfactor,
            invocations=total,
            wal_bytes_per_call=round(statistics.median(wal[s]), 1),
            wal_bytes_per_call_min=round(min(wal[s]), 1),
            cpu_us_per_call=round(cpu[s] / total * US, 1),
            wall_ms_median=round(statistics.median(wall[s]), 3),
        )
        for s in STEPS
    ]


# --- commit latency --------------------------------------------------------------------------


def commit_latency(url: str, n: int) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.history_commit_probe (x int)")
        times: list[float] = []
        for _ in range(n):
            began = time.perf_counter()
            conn.execute("INSERT INTO public.history_commit_probe VALUES (1)")
            times.append((time.perf_counter() - began) * MS)
        conn.execute("DROP TABLE public.history_commit_probe")
    return percentiles(times)


# --- the NOTIFY ceiling ----------------------------------------------------------------------


# An experiment, in the scratch database only: NOTIFY only when no other unleased runnable
# invocation exists (a worker is then already due to claim, or busy and will claim again when
# a call finishes). With no worker running, as here, only the first call notifies: the best
# case, i.e. a backlog; while workers keep up, every call still notifies.
CONDITIONAL_NOTIFY_SQL = """
CREATE OR REPLACE FUNCTION agents.tg_tool_invocations_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'running')
       AND NOT EXISTS (SELECT 1 FROM agents.tool_invocations
                        WHERE status = 'running' AND lease_owner IS NULL
                          AND run_after <= now() AND id <> NEW.id) THEN
        PERFORM pg_notify('toolrelay_runnable', '');
    END IF;
    RETURN NULL;
END
$$
"""
TRIGGER_MODES = ("on", "off", "conditional")


@dataclass
class InvokeCeiling:
    connections: int
    trigger: str  # on (as shipped) / off / conditional (the experiment above)
    seconds: float
    calls: int
    per_s: float
    latency_ms: dict[str, float]
    cores: dict[str, float]
    pg_us_per_call: float
    wal_bytes_per_call: float
    waits_pct: dict[str, float]  # share of active-backend samples per wait event ("CPU": none)
    wait_samples: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WaitSampler(threading.Thread):
    def __init__(self, url: str, pids: list[int]) -> None:
        super().__init__(daemon=True, name="wait-sampler")
        self.url = url
        self.pids = pids
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._halt.wait(WAIT_POLL_S):
                conn.execute("SELECT pg_stat_clear_snapshot()")
                for what, n in conn.execute(WAITS_SQL, (self.pids,)).fetchall():
                    self.counts[str(what)] += int(n)
                self.samples += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


@dataclass
class Hammered:
    calls: int
    latencies: list[float]
    elapsed: float
    waits: dict[str, float]
    wait_samples: int


async def _hammer(fx: Fixture, connections: int, seconds: float) -> Hammered:
    claims = json.dumps({"sub": str(fx.owner), "role": OWNER_ROLE})
    conns = [
        await psycopg.AsyncConnection.connect(fx.url, autocommit=True) for _ in range(connections)
    ]
    for conn in conns:
        await conn.execute(IDENTITY_SQL, (str(fx.owner), claims))
    sampler = WaitSampler(fx.url, [c.info.backend_pid for c in conns])
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds

    async def lane(conn: psycopg.AsyncConnection[Any], base: int) -> int:
        k = base
        while loop.time() < stop_at:
            began = time.perf_counter()
            cur = await conn.execute(INVOKE_SQL, (fx.agent_id, fx.tool_id, Jsonb({"n": k})))
            await cur.fetchone()
            latencies.append((time.perf_counter() - began) * MS)
            k += 1
        return k - base

    sampler.start()
    began = time.perf_counter()
    counts = await asyncio.gather(*(lane(c, i * 10_000_000) for i, c in enumerate(conns)))
    elapsed = time.perf_counter() - began
    sampler.stop()
    for conn in conns:
        await conn.close()
    waits = {k: round(100.0 * v / max(1, sum(sampler.counts.values())), 1)
             for k, v in sampler.counts.most_common()}  # fmt: skip
    return Hammered(sum(counts), latencies, elapsed, waits, sampler.samples)


def invoke_ceiling(ctx: Context, fx: Fixture, connections: int, seconds: float,
                   trigger: str) -> InvokeCeiling:  # fmt: skip
    if trigger not in TRIGGER_MODES:
        raise ValueError(trigger)
    with admin(fx.url) as conn:
        original = conn.execute(
            "SELECT pg_get_functiondef('agents.tg_tool_invocations_notify'::regproc) AS d"
        ).fetchone()
        assert original is not None
        verb = "DISABLE" if trigger == "off" else "ENABLE"
        conn.execute(f"ALTER TABLE agents.tool_invocations {verb} TRIGGER tool_invocations_notify")
        if trigger == "conditional":
            conn.execute(CONDITIONAL_NOTIFY_SQL)
        lsn0 = conn.execute("SELECT pg_current_wal_insert_lsn()::text AS l").fetchone()
    began_wall = time.time()
    ctx.running = []
    try:
        done = asyncio.run(_hammer(fx, connections, seconds))
    finally:
        with admin(fx.url) as conn:
            lsn1 = conn.execute("SELECT pg_current_wal_insert_lsn()::text AS l").fetchone()
            conn.execute(
                "ALTER TABLE agents.tool_invocations ENABLE TRIGGER tool_invocations_notify"
            )
            conn.execute(original["d"])  # the shipped trigger function, as it was
    cores = ctx.cores(began_wall, time.time())
    assert lsn0 is not None and lsn1 is not None
    wal = lsn_bytes(lsn1["l"]) - lsn_bytes(lsn0["l"])
    calls, elapsed = done.calls, done.elapsed
    return InvokeCeiling(
        connections=connections,
        trigger=trigger,
        seconds=round(elapsed, 3),
        calls=calls,
        per_s=round(calls / elapsed, 1) if elapsed > 0 else 0.0,
        latency_ms=percentiles(done.latencies),
        cores=cores,
        pg_us_per_call=round(cores.get("postgres", 0.0) * elapsed / calls * US, 1) if calls else 0,
        wal_bytes_per_call=round(wal / calls, 1) if calls else 0.0,
        waits_pct=done.waits,
        wait_samples=done.wait_samples,
    )
