"""Dead tuples under a long-running transaction (``python -m bench.history``, part 2).

One worker (not draining) dispatches a steady stream of invocations created at RATE/s (each
its own ``fn_invoke_tool`` statement, 8 connections, open loop: the latency phase's
generator). Three phases:

1. *baseline*: nothing unusual;
2. *held*: another session runs ``BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM
   agents.tool_invocations LIMIT 1;`` and then stays idle in that transaction;
3. *released*: that transaction ends.

A VACUUM of agents.tool_invocations runs every VACUUM_EVERY seconds throughout, standing in
for autovacuum (the shared server has ``autovacuum = off``, and turning it on is not ours to
do); its VERBOSE report says how many row versions it removed and how many were "dead but not
yet removable". Every SAMPLE seconds: the table's statistics (n_dead_tup: an estimate that
lags by up to ~1 s), pgstattuple's exact count, sizes, the oldest transaction's xmin age, the
runnable count, and the claim's scan (its ``picked`` CTE) under EXPLAIN (ANALYZE, BUFFERS).
Per window, afterwards from the database: invocations created and finished, and creation →
finished latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from bench.context import Context
from bench.history_drain import ConnectionSampler, start_worker
from bench.history_probe import (
    SIZES_SQL,
    TABLE_STATS_SQL,
    lsn_bytes,
    oldest_xmin,
    picked_of,
    probe_claim,
)
from bench.latency import Generated, generate, wait_listening, wait_settled
from bench.procs import loadavg
from bench.setup import Fixture, admin
from bench.workers import WorkerLaunch

PROBE_REPEATS = 3  # picked-scan EXPLAINs per sample (median)
TICK_S = 0.05
MS = 1000.0
VACUUM_TUPLES = re.compile(
    r"tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable"
)
VACUUM_CUTOFF = re.compile(r"removable cutoff: (\d+), which was (\d+) XIDs old")
VACUUM_ITEMS = re.compile(r"had (\d+) dead item identifiers removed")


@dataclass(frozen=True)
class DeadPlan:
    rate: int  # invocations created per second
    baseline_s: float
    held_s: float
    released_s: float
    sample_s: float
    vacuum_every_s: float

    @property
    def total_s(self) -> float:
        return self.baseline_s + self.held_s + self.released_s

    def phase(self, t: float) -> str:
        if t < self.baseline_s:
            return "baseline"
        if t < self.baseline_s + self.held_s:
            return "held"
        return "released"


@dataclass
class Sample:
    t: float  # seconds since the generator started
    phase: str
    n_live_tup: int
    n_dead_tup: int
    n_tup_upd: int
    n_tup_hot_upd: int
    dead_exact: int  # pgstattuple: row versions no snapshot can see any more, or -1
    heap: int
    total: int
    runnable_idx: int
    xmin_age: float  # oldest backend_xmin age on the server, in transactions
    oldest_xact_s: float
    running: int  # status = 'running': runnable or leased
    lsn: int
    claim_ms: float  # the claim's picked scan, median of PROBE_REPEATS
    claim_hit: float  # its shared buffers hit
    claim_index_hit: float  # of which in the index scan node


@dataclass
class Vacuum:
    t: float
    phase: str
    seconds: float
    removed: int
    remain: int
    not_removable: int
    cutoff_age: int  # "removable cutoff ... which was N XIDs old"
    items_removed: int  # dead item identifiers (left by pruning) removed with their index entries


@dataclass
class Window:
    start: float
    end: float
    phase: str
    created_per_s: float
    finished_per_s: float
    latency_ms: dict[str, float]  # creation → finished, of those created in the window
    unfinished: int  # created in the window, not finished when the run ended
    dead_tup: int  # n_dead_tup at the window's end
    dead_exact: int
    claim_ms: float  # at the window's end
    claim_hit: float
    runnable_idx_kb: float
    total_mb: float
    hot_pct: float  # HOT share of the updates in the window
    wal_kb_per_s: float
    wal_bytes_per_call: float  # per invocation finished in the window
    running: int
    xmin_age: float
    cores: dict[str, float]


@dataclass
class DeadResult:
    plan: dict[str, Any]
    samples: list[dict[str, Any]]
    vacuums: list[dict[str, Any]]
    windows: list[dict[str, Any]]
    generated: int
    achieved_per_s: float
    not_completed: int
    summary: dict[str, Any] = field(default_factory=dict)
    worker_connections: dict[str, int] = field(default_factory=dict)
    loadavg_end: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Holder:
    """A session idle in a REPEATABLE READ transaction: its snapshot pins the xmin horizon."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("SET application_name = 'history-holder'")
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        self.conn.execute("SELECT 1 FROM agents.tool_invocations LIMIT 1")

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


def _sample(url: str, claim_sql: str, t: float, phase: str) -> Sample:
    with admin(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        stats = conn.execute(TABLE_STATS_SQL).fetchone() or {}
        size = conn.execute(SIZES_SQL).fetchone() or {}
        try:
            exact_row = conn.execute(
                "SELECT dead_tuple_count FROM pgstattuple('agents.tool_invocations')"
            ).fetchone()
            exact = int(exact_row["dead_tuple_count"]) if exact_row else -1
        except psycopg.Error:
            exact = -1
        running = conn.execute(
            "SELECT count(*) AS n FROM agents.tool_invocations WHERE status = 'running'"
        ).fetchone()
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn()::text AS l").fetchone()
    xmin = oldest_xmin(url)
    probe = probe_claim(url, claim_sql, -1, PROBE_REPEATS, picked_only=True)
    return Sample(
        t=round(t, 3),
        phase=phase,
        n_live_tup=int(stats.get("n_live_tup") or 0),
        n_dead_tup=int(stats.get("n_dead_tup") or 0),
        n_tup_upd=int(stats.get("n_tup_upd") or 0),
        n_tup_hot_upd=int(stats.get("n_tup_hot_upd") or 0),
        dead_exact=exact,
        heap=int(size.get("heap") or 0),
        total=int(size.get("total") or 0),
        runnable_idx=int(size.get("runnable_idx") or 0),
        xmin_age=xmin.get("xmin_age", 0.0),
        oldest_xact_s=round(xmin.get("oldest_xact_s", 0.0), 1),
        running=int(running["n"]) if running else 0,
        lsn=lsn_bytes(lsn["l"]) if lsn else 0,
        claim_ms=probe.execution_ms["median"],
        claim_hit=probe.shared_hit["median"],
        claim_index_hit=probe.index_hit["median"],
    )


def _vacuum(url: str, t: float, phase: str) -> Vacuum:
    notices: list[str] = []
    began = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(str(d.message_primary or "")))
        conn.execute("VACUUM (VERBOSE) agents.tool_invocations")
    seconds = time.monotonic() - began
    text = "\n".join(notices)
    tuples = VACUUM_TUPLES.search(text)
    cutoff = VACUUM_CUTOFF.search(text)
    items = VACUUM_ITEMS.search(text)
    return Vacuum(
        t=round(t, 3),
        phase=phase,
        seconds=round(seconds, 3),
        removed=int(tuples.group(1)) if tuples else -1,
        remain=int(tuples.group(2)) if tuples else -1,
        not_removable=int(tuples.group(3)) if tuples else -1,
        cutoff_age=int(cutoff.group(2)) if cutoff else -1,
        items_removed=int(items.group(1)) if items else 0,
    )


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)

    def pick(p: int) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]

    return {"p50": round(pick(50), 1), "p99": round(pick(99), 1), "max": round(ordered[-1], 1)}


def _windows(
    ctx: Context,
    fx: Fixture,
    t0_wall: float,
    samples: list[Sample],
    plan: DeadPlan,
) -> list[Window]:
    with admin(fx.url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM created_at)::float8 AS c,"
            " extract(epoch FROM finished_at)::float8 AS f"
            " FROM agents.tool_invocations WHERE owner = %s AND created_at >= to_timestamp(%s)",
            (fx.owner, t0_wall - 1.0),
        ).fetchall()
    created = [float(r["c"]) - t0_wall for r in rows]
    finished = [float(r["f"]) - t0_wall if r["f"] is not None else None for r in rows]
    out: list[Window] = []
    for before, after in itertools.pairwise(samples):
        a, b = before.t, after.t
        span = b - a
        if span < plan.sample_s / 2:
            continue  # the stragglers after the generator stopped
        made = [i for i, c in enumerate(created) if a <= c < b]
        done = sum(1 for f in finished if f is not None and a <= f < b)
        lat = [(finished[i] - created[i]) * MS for i in made if finished[i] is not None]  # type: ignore[operator]
        upd = after.n_tup_upd - before.n_tup_upd
        hot = after.n_tup_hot_upd - before.n_tup_hot_upd
        wal = after.lsn - before.lsn
        out.append(
            Window(
                start=round(a, 1),
                end=round(b, 1),
                phase=plan.phase((a + b) / 2),
                created_per_s=round(len(made) / span, 1),
                finished_per_s=round(done / span, 1),
                latency_ms=_percentiles(lat),
                unfinished=sum(1 for i in made if finished[i] is None),
                dead_tup=after.n_dead_tup,
                dead_exact=after.dead_exact,
                claim_ms=after.claim_ms,
                claim_hit=after.claim_hit,
                runnable_idx_kb=round(after.runnable_idx / 1024, 1),
                total_mb=round(after.total / 2**20, 2),
                hot_pct=round(100.0 * hot / upd, 1) if upd else 0.0,
                wal_kb_per_s=round(wal / span / 1024, 1),
                wal_bytes_per_call=round(wal / done, 1) if done else 0.0,
                running=after.running,
                xmin_age=after.xmin_age,
                cores=ctx.cores(t0_wall + a, t0_wall + b),
            )
        )
    return out


def run(ctx: Context, fx: Fixture, admin_url: str, claim_sql: str, plan: DeadPlan) -> DeadResult:
    """Measure; the caller has emptied the fresh part of the table and vacuumed it."""
    picked_of(claim_sql)  # fails early if the claim's shape changed
    # Without contrib on the server the exact dead count is reported as -1.
    with admin(fx.url) as conn, contextlib.suppress(psycopg.Error):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    ctx.upstream.reset()
    launch = WorkerLaunch(fx, ctx.logs, ctx.home, drain=False, source=ctx.worker_source)
    worker = start_worker(launch, "dead-w1")
    ctx.running = [worker]
    sampler = ConnectionSampler(admin_url, str(psycopg.conninfo.conninfo_to_dict(fx.url)["dbname"]))
    generated: list[Generated] = []
    samples: list[Sample] = []
    vacuums: list[Vacuum] = []
    holder: Holder | None = None
    try:
        wait_listening(fx.url, worker)
        sampler.start()
        gen = threading.Thread(
            target=lambda: generated.append(asyncio.run(generate(fx, plan.rate, plan.total_s))),
            name="generator",
            daemon=True,
        )
        t0_wall = time.time()
        t0 = time.monotonic()
        gen.start()
        next_sample = 0.0
        next_vacuum = plan.vacuum_every_s / 2
        held_at = plan.baseline_s
        released_at = plan.baseline_s + plan.held_s
        while True:
            t = time.monotonic() - t0
            if t >= next_sample:  # before a phase change at the same instant: ends the window
                samples.append(_sample(fx.url, claim_sql, t, plan.phase(t)))
                next_sample += plan.sample_s
                t = time.monotonic() - t0
            if holder is None and held_at <= t < released_at:
                holder = Holder(fx.url)
            if holder is not None and t >= released_at:
                holder.release()
                holder = None
            if t >= next_vacuum and t < next_sample - 0.5:
                vacuums.append(_vacuum(fx.url, t, plan.phase(t)))
                next_vacuum += plan.vacuum_every_s
            if t > plan.total_s and not gen.is_alive():
                break
            time.sleep(TICK_S)
        t_end = time.monotonic() - t0
        samples.append(_sample(fx.url, claim_sql, t_end, "released"))
        gen.join()
        ids = generated[0].ids if generated else []
        wait_settled(fx.url, ids)
    finally:
        if holder is not None:
            holder.release()
        if sampler.is_alive():
            sampler.stop()
        usage = worker.stop()
    if usage.returncode != 0:
        raise RuntimeError(f"dead-tuple worker exited {usage.returncode}:\n{worker.tail()}")
    windows = _windows(ctx, fx, t0_wall, samples, plan)
    with admin(fx.url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status <> 'completed') AS bad"
            " FROM agents.tool_invocations WHERE owner = %s AND created_at >= to_timestamp(%s)",
            (fx.owner, t0_wall - 1.0),
        ).fetchone()
    gen_result = generated[0] if generated else Generated([], 0.0, 0.0, 0.0)
    return DeadResult(
        plan=asdict(plan),
        samples=[asdict(s) for s in samples],
        vacuums=[asdict(v) for v in vacuums],
        windows=[asdict(w) for w in windows],
        generated=len(gen_result.ids),
        achieved_per_s=round(gen_result.achieved_per_s, 1),
        not_completed=int(row["bad"]) if row else -1,
        summary=summarize(windows, vacuums),
        worker_connections={
            "backends": sampler.max_backends,
            "listening": sampler.max_listening,
            "active": sampler.max_active,
        },
        loadavg_end=loadavg(),
    )


def summarize(windows: list[Window], vacuums: list[Vacuum]) -> dict[str, Any]:
    """Per phase: medians of the windows (the last held window for what piled up)."""
    out: dict[str, Any] = {}
    for phase in ("baseline", "held", "released"):
        ws = [w for w in windows if w.phase == phase]
        if not ws:
            continue
        out[phase] = {
            "claim_ms_median": round(statistics.median(w.claim_ms for w in ws), 3),
            "claim_ms_max": round(max(w.claim_ms for w in ws), 3),
            "claim_hit_max": max(w.claim_hit for w in ws),
            "finished_per_s_median": round(statistics.median(w.finished_per_s for w in ws), 1),
            "p99_ms_max": max(w.latency_ms["p99"] for w in ws),
            "dead_tup_end": ws[-1].dead_tup,
            "dead_exact_end": ws[-1].dead_exact,
            "runnable_idx_kb_end": ws[-1].runnable_idx_kb,
            "total_mb_end": ws[-1].total_mb,
            "hot_pct_median": round(statistics.median(w.hot_pct for w in ws), 1),
            "pg_cores_median": round(
                statistics.median(w.cores.get("postgres", 0.0) for w in ws), 3
            ),
            "removed_by_vacuum": sum(v.removed for v in vacuums if v.phase == phase),
            "not_removable_max": max(
                (v.not_removable for v in vacuums if v.phase == phase), default=0
            ),
        }
    return out
