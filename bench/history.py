"""``python -m bench.history [--quick]``: does the hot path stay small as the history grows?

Three phases, one function each; every table this prints names the function that made it.

- ``drains``: two scratch databases, A filled in SQL with 10,000 finished invocations and B
  with 1,000,000 (one attempt row each). In rounds, A and B back to back (order alternating):
  the claim under EXPLAIN (ANALYZE, BUFFERS) with 100 runnable, then 20,000 fresh invocations
  created 5,000 per statement and drained by one ``toolrelay worker --drain --concurrency
  64``. A CHECKPOINT before creating and before draining, so each pays a full-page image per
  page it touches first. Around each: WAL, full-page images, HOT updates, buffers, CPU.
- ``dead_tuples``: 500/s through one worker (the latency phase's generator) while another
  session holds a REPEATABLE READ snapshot for 60 s; a VACUUM (VERBOSE) every 10 s stands in
  for autovacuum. Sampled every 5 s.
- ``capacity``: WAL per invocation for each step of its life (``lifecycle``: create, claim,
  mark_sent, finish), batches of 1 and of 64, and the HOT share of its updates by fillfactor.

The session, processes and CPU come from bench/session.py and bench/procs.py, the table
writer from bench/tables.py. Prints the tables and writes them to bench/out/history-<stamp>.md.
Exits 1, after a ``FAIL:`` line, when an invocation reached the upstream twice or did not
complete.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from bench.constants import DRAIN_TIMEOUT_S, FULL, OUT_DIR, QUICK
from bench.context import Context
from bench.latency import generate, percentiles, wait_listening, wait_settled
from bench.procs import loadavg, noise_sample, wait_all
from bench.session import open_session
from bench.setup import (
    ENQUEUE_SQL,
    Fixture,
    act_as_owner,
    admin,
    create_database,
    drop_database,
    enqueue,
    provision,
)
from bench.tables import md_table
from bench.workers import WorkerLaunch, gate, wait_blocked
from toolrelay.db.queries import parse

US, MS, KB, MB = 1e6, 1e3, 1024, 2**20
WARMUP = 2  # EXPLAINs discarded first (a fresh backend's catalog caches)
SETTLE_S = 1.0  # after a worker exits: its statistics reach pg_stat_* (flushed at exit)
FILL_WORKER, STEP = "history-fill", "history-lifecycle"  # the attempt rows' `worker`
FRESH = "owner = %s AND created_at > now() - interval '12 hours'"  # the fill ends a day ago
RUNNABLE_INDEX = "tool_invocations_runnable_idx"
TABLES = ("tool_invocations", "tool_invocation_attempts")


@dataclass(frozen=True)
class Plan:
    small: int  # finished invocations in database A
    large: int  # ... in database B
    drain_n: int  # fresh invocations per drain
    rounds: int
    runnable: int  # queued while the claim is explained
    repeats: int  # EXPLAINs per probe, after WARMUP
    rate: int  # dead tuples: invocations created per second
    phases_s: tuple[float, float, float]  # baseline, snapshot held, released
    sample_s: float
    vacuum_s: float
    single: int  # lifecycles with batches of 1
    batches: int  # lifecycles with batches of 64


FULL_PLAN = Plan(small=10_000, large=1_000_000, drain_n=20_000, rounds=5, runnable=100,
                 repeats=20, rate=500, phases_s=(20, 60, 30), sample_s=5, vacuum_s=10,
                 single=500, batches=40)  # fmt: skip
QUICK_PLAN = Plan(small=1_000, large=20_000, drain_n=1_000, rounds=2, runnable=100, repeats=3,
                  rate=200, phases_s=(4, 8, 6), sample_s=2, vacuum_s=4, single=50,
                  batches=4)  # fmt: skip

# Finished invocations with one attempt row each, as the worker leaves them, spread over the
# 30 days before yesterday; random ids (what a database made before migration 0011 holds).
# Triggers are off for the fill only: the rows are consistent by construction.
FILL_SQL = """
WITH rows AS (
    SELECT gen_random_uuid() AS id, g,
           now() - interval '31 days' + (g - 1) * (interval '30 days' / %(total)s) AS t
      FROM generate_series(%(first)s::int, %(last)s::int) AS g
), inv AS (
    INSERT INTO agents.tool_invocations (
        id, owner, tool_id, agent_id, input, output, status, approval_status,
        config_fingerprint, attempt, run_after, sent_at, http_status, finished_at,
        created_at, updated_at)
    SELECT id, %(owner)s, %(tool)s, %(agent)s, jsonb_build_object('n', g), '{"ok": true}',
           'completed', 'not_required',
           (SELECT agents.tool_fingerprint(r) FROM agents.tools_registry r WHERE id = %(tool)s),
           1, t, t + interval '1 ms', 200, t + interval '6 ms', t, t + interval '6 ms'
      FROM rows
)
INSERT INTO agents.tool_invocation_attempts (
    invocation_id, owner, attempt, worker, started_at, finished_at, status_code, duration_ms)
SELECT id, %(owner)s, 1, %(worker)s, t + interval '1 ms', t + interval '5 ms', 200, 4.0
  FROM rows
"""
# Cumulative counters, read around each measurement (autocommit: a fresh snapshot each time).
COUNTERS_SQL = f"""
SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn AS wal,
       (SELECT wal_fpi FROM pg_stat_wal) AS fpi,
       s.n_tup_upd AS upd, s.n_tup_hot_upd AS hot, s.n_dead_tup AS dead,
       pg_total_relation_size('agents.tool_invocations') AS total,
       pg_relation_size('agents.tool_invocations') AS heap,
       pg_indexes_size('agents.tool_invocations') AS indexes,
       pg_total_relation_size('agents.tool_invocation_attempts') AS attempts,
       pg_relation_size('agents.{RUNNABLE_INDEX}') AS runnable_idx,
       (SELECT coalesce(max(age(backend_xmin)), 0) FROM pg_stat_activity) AS xmin_age
  FROM pg_stat_user_tables s WHERE s.relid = 'agents.tool_invocations'::regclass
"""
DRAIN_WINDOW_SQL = f"""
SELECT count(*) FILTER (WHERE status = 'completed') AS completed,
       extract(epoch FROM max(finished_at))::float8 AS last,
       (SELECT extract(epoch FROM min(started_at))::float8 FROM agents.tool_invocation_attempts
         WHERE started_at > now() - interval '12 hours' AND worker <> %s) AS first
  FROM agents.tool_invocations WHERE {FRESH}
"""
SETTINGS_SQL = """SELECT string_agg(name || ' ' || setting, ', ') AS s FROM pg_settings WHERE name
IN ('shared_buffers', 'max_connections', 'synchronous_commit', 'autovacuum', 'full_page_writes')"""
VACUUM_RE = {
    "removed": r"tuples: (\d+) removed",
    "dead but not yet removable": r"(\d+) are dead but not yet removable",
    "removable cutoff age (xids)": r"removable cutoff: \d+, which was (\d+) XIDs old",
    "dead item ids removed": r"had (\d+) dead item identifiers removed",
}


def section(title: str, head: str, rows: list[str], *notes: str) -> list[str]:
    """A markdown table: columns and rows given as ``a | b | c``."""
    table = md_table(head.split(" | "), [r.split(" | ") for r in rows])
    return [f"### {title}", "", table, "", *(n for note in notes for n in (note, ""))]


def g(v: float) -> str:
    """A number at a sensible precision: 2,212 / 45.8 / 0.082 / 5."""
    if v == v and v == int(v):
        return f"{int(v):,}"
    return f"{v:,.{0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 3}f}"


def counters(url: str) -> dict[str, float]:
    with admin(url) as conn:
        row = conn.execute(COUNTERS_SQL).fetchone()
    return {k: float(v or 0) for k, v in (row or {}).items()}


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def sql(url: str, *statements: str) -> None:
    with admin(url) as conn:
        for statement in statements:
            conn.execute(statement)


def delete_fresh(fx: Fixture) -> None:
    """Remove what the benchmark created (attempts by cascade); the filled history stays."""
    with admin(fx.url) as conn:
        conn.execute(f"DELETE FROM agents.tool_invocations WHERE {FRESH}", (fx.owner,))
    sql(fx.url, *(f"VACUUM (ANALYZE) agents.{t}" for t in TABLES))


def fill(fx: Fixture, n: int) -> str:
    """Add ``n`` finished invocations, 100,000 per statement; a row of table 1a."""
    began = time.monotonic()
    params = {"total": n, "owner": fx.owner, "tool": fx.tool_id, "agent": fx.agent_id}
    with admin(fx.url) as conn:
        conn.execute("SET session_replication_role = replica")
        for first in range(1, n + 1, 100_000):
            conn.execute(FILL_SQL, params | {"first": first, "last": min(n, first + 99_999),
                                             "worker": FILL_WORKER})  # fmt: skip
        conn.execute("RESET session_replication_role")
    delete_fresh(fx)  # vacuums and analyzes
    sql(fx.url, "CHECKPOINT")  # the fill's WAL must not checkpoint during a measurement
    size = counters(fx.url)
    mb = " | ".join(f"{size[k] / MB:.1f}" for k in ("heap", "indexes", "attempts"))
    return f"{label(n)} | {n:,} | {time.monotonic() - began:.1f} | {mb}"


def picked_of(claim: str) -> str:
    """The claim's first CTE (``picked``): the index scan and row locks, without the UPDATE."""
    found = re.search(r"WITH picked AS \((.*?)\), claimed AS", claim, re.S)
    if found is None:
        raise RuntimeError("the claim query no longer starts with a `picked` CTE")
    return found.group(1).strip()


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def explain(url: str, statement: str, repeats: int) -> dict[str, float]:
    """Medians of EXPLAIN (ANALYZE, BUFFERS) as the dispatcher role, each rolled back:
    ms, shared buffers hit (whole statement), and of those the runnable index's."""
    runs: list[tuple[float, float, float]] = []
    params = {"limit": 64, "worker": "history-probe", "lease": 30}
    with psycopg.connect(url, cursor_factory=psycopg.ClientCursor) as conn:
        for _ in range(repeats + WARMUP):
            conn.execute("SET LOCAL ROLE service_role")
            cur = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", params)
            doc = (cur.fetchone() or [None])[0]
            conn.rollback()
            top = (json.loads(doc) if isinstance(doc, str) else doc)[0]
            index = [n for n in _nodes(top["Plan"]) if n.get("Index Name") == RUNNABLE_INDEX]
            hit = index[0]["Shared Hit Blocks"] if index else 0
            runs.append((top["Execution Time"], top["Plan"]["Shared Hit Blocks"], hit))
    ms, hit, idx = (statistics.median(v) for v in zip(*runs[WARMUP:], strict=True))
    return {"ms": ms, "buffers": hit, "index_buffers": idx}


def label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


# --- 1. drains next to a small and a large history -------------------------------------------


def drain_once(ctx: Context, fx: Fixture, plan: Plan, claim: str) -> dict[str, float]:
    """One case of a round: its row of table 1b (the keys are the columns)."""
    delete_fresh(fx)
    ctx.upstream.reset()
    enqueue(fx, plan.runnable)
    probe = explain(fx.url, claim, plan.repeats)
    picked = explain(fx.url, picked_of(claim), plan.repeats)
    sql(fx.url, "CHECKPOINT")
    c0, t0 = counters(fx.url), time.time()
    enqueue(fx, plan.drain_n - plan.runnable, first=plan.runnable + 1)
    c1, t1 = counters(fx.url), time.time()
    created, n = plan.drain_n - plan.runnable, plan.drain_n
    pg_created_s = ctx.cores(t0, t1).get("postgres", 0.0) * (t1 - t0)
    sql(fx.url, "CHECKPOINT")
    with gate(fx.url):
        launch = WorkerLaunch(fx, ctx.logs, ctx.home, source=ctx.worker_source)
        worker = launch.start("history-drain")  # its log: the last drain's
        ctx.running = [worker]
        wait_blocked(fx.url, [worker])
        c2 = counters(fx.url)
    if (code := wait_all([worker], DRAIN_TIMEOUT_S)[0].returncode) != 0:
        raise RuntimeError(f"{worker.name} exited {code}:\n{worker.tail()}")
    time.sleep(SETTLE_S)
    d = delta(c2, counters(fx.url))
    with admin(fx.url) as conn:
        w = conn.execute(DRAIN_WINDOW_SQL, (FILL_WORKER, fx.owner)).fetchone() or {}
    span = (w["last"] or 0.0) - (w["first"] or 0.0)
    cores = ctx.cores(w["first"] or 0.0, w["last"] or 0.0)
    ours = sum(cores.get(k, 0.0) for k in ("sut", "upstream", "postgres", "harness"))
    return {
        "drain/s": n / span,
        "claim of 64 ms": probe["ms"],
        "claim buffers": probe["buffers"],
        "claim runnable-index buffers": probe["index_buffers"],
        "claim scan (picked CTE) ms": picked["ms"],
        "claim scan buffers": picked["buffers"],
        "create/s (5,000 per statement)": created / (t1 - t0),
        "worker CPU µs/call": cores.get("sut", 0.0) * span / n * US,
        "pg CPU µs/call drained": cores.get("postgres", 0.0) * span / n * US,
        "pg CPU µs/call created": pg_created_s / created * US,
        "WAL B/call drained": d["wal"] / n,
        "WAL B/call created": delta(c0, c1)["wal"] / created,
        "full-page images/call drained": d["fpi"] / n,
        "HOT % of updates": 100.0 * d["hot"] / d["upd"] if d["upd"] else 0.0,
        "other load (cores)": cores.get("machine", 0.0) - ours,
        "sent twice": ctx.upstream.arrivals().duplicates,
        "not completed": n - int(w["completed"]),
    }


T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and Student-t 95 % interval."""
    if len(values) < 2:
        return (values[0],) * 3 if values else (float("nan"),) * 3
    mean = statistics.fmean(values)
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def drains(ctx: Context, cases: list[tuple[Fixture, int]], plan: Plan, claim: str) -> list[str]:
    """Tables 1a-1c: the fills, every drain, and large / small per measure, paired by round
    (the two ran back to back: their ratio cancels slow drifts of the machine's load)."""
    fills = [fill(fx, n) for fx, n in cases]
    runs: list[tuple[int, str, dict[str, float]]] = []
    for rnd in range(1, plan.rounds + 1):
        for fx, n in cases if rnd % 2 else cases[::-1]:
            runs.append((rnd, label(n), r := drain_once(ctx, fx, plan, claim)))
            print(f"  round {rnd} {label(n):>3}: {r['drain/s']:,.0f}/s", flush=True)
    small, large = label(cases[0][1]), label(cases[1][1])
    compared = []
    for key in list(runs[0][2])[:-2]:
        a = [r[key] for _, h, r in runs if h == small]
        b = [r[key] for _, h, r in runs if h == large]
        mean, low, high = interval([y / x for x, y in zip(a, b, strict=True) if x])
        ma, mb = statistics.median(a), statistics.median(b)
        compared.append(f"{key} | {g(ma)} | {g(min(a))} - {g(max(a))} | {g(mb)} | "
                        f"{g(min(b))} - {g(max(b))} | {mb / ma if ma else 0:.3f} | "
                        f"{mean:.3f} ({low:.3f} - {high:.3f})")  # fmt: skip
    failed = [f"FAIL: round {rnd} {h}: {r['sent twice']:.0f} sent twice, {r['not completed']:.0f}"
              " not completed" for rnd, h, r in runs if r["sent twice"] or r["not completed"]]  # fmt: skip
    return [
        *section("1a. The histories (bench/history.py: fill)",
                 "history | finished rows | fill s | heap MB | indexes MB | attempts MB", fills),
        *section(f"1b. Every drain, in the order run (bench/history.py: drain_once); "
                 f"{plan.drain_n:,} fresh invocations, one worker, --concurrency 64",
                 " | ".join(["round", "history", *runs[0][2]]),
                 [" | ".join([str(rnd), h, *map(g, r.values())]) for rnd, h, r in runs]),
        *section(f"1c. {large} / {small} (bench/history.py: drains)",
                 f"measure | {small} median | range | {large} median | range | {large} / {small}"
                 " | paired by round: mean (95 % interval)", compared, *failed),
    ]  # fmt: skip


# --- 2. dead tuples under a snapshot held open -----------------------------------------------


def vacuum(url: str) -> dict[str, int]:
    """VACUUM (VERBOSE) of the table; what its report says (-1: not found)."""
    notices: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(str(d.message_primary or "")))
        conn.execute("VACUUM (VERBOSE) agents.tool_invocations")
    text = "\n".join(notices)
    return {k: int(m.group(1)) if (m := re.search(p, text)) else -1 for k, p in VACUUM_RE.items()}


def dead_tuples(ctx: Context, fx: Fixture, plan: Plan, claim: str) -> list[str]:
    """Tables 2a-2b: a row per sample window, and the VACUUMs."""
    delete_fresh(fx)
    ctx.upstream.reset()
    base_s, held_s, _ = plan.phases_s
    total_s = sum(plan.phases_s)

    def phase(t: float) -> str:
        return "baseline" if t < base_s else "held" if t < base_s + held_s else "released"

    picked = picked_of(claim)
    launch = WorkerLaunch(fx, ctx.logs, ctx.home, drain=False, source=ctx.worker_source)
    worker = launch.start("history-dead")
    ctx.running = [worker]
    samples: list[tuple[float, dict[str, float], dict[str, float]]] = []
    vacuums: list[str] = []
    ids: list[str] = []
    holder: psycopg.Connection[Any] | None = None
    try:
        wait_listening(fx.url, worker)
        run = asyncio.run
        gen = threading.Thread(target=lambda: ids.extend(run(generate(fx, plan.rate, total_s)).ids))
        t0_wall, t0 = time.time(), time.monotonic()
        gen.start()
        next_sample, next_vacuum, t = 0.0, plan.vacuum_s / 2, 0.0
        while gen.is_alive() or t < total_s:
            t = time.monotonic() - t0
            if t >= next_sample:
                samples.append((t, counters(fx.url), explain(fx.url, picked, 3)))
                next_sample += plan.sample_s
            if holder is None and base_s <= t < base_s + held_s:
                holder = psycopg.connect(fx.url)  # then idle in a REPEATABLE READ transaction
                holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                holder.execute("SELECT 1 FROM agents.tool_invocations LIMIT 1")
            if holder is not None and t >= base_s + held_s:
                holder.close()
                holder = None
            if t >= next_vacuum:
                found = " | ".join(f"{v:,}" for v in vacuum(fx.url).values())
                vacuums.append(f"{t:.1f} | {phase(t)} | {found}")
                next_vacuum += plan.vacuum_s
            time.sleep(0.05)
        samples.append((time.monotonic() - t0, counters(fx.url), explain(fx.url, picked, 3)))
        wait_settled(fx.url, ids)
    finally:
        if holder is not None:
            holder.close()
        code = worker.stop().returncode
    if code != 0:
        raise RuntimeError(f"dead-tuple worker exited {code}:\n{worker.tail()}")
    with admin(fx.url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM created_at)::float8 - %s AS c, extract(epoch FROM"
            f" finished_at)::float8 - %s AS f, status FROM agents.tool_invocations WHERE {FRESH}",
            (t0_wall, t0_wall, fx.owner),
        ).fetchall()
    windows = []
    for (a, ca, _), (b, cb, probe) in itertools.pairwise(samples):
        if b - a < plan.sample_s / 2:
            continue  # the last, short sample after the generator stopped
        made = [r for r in rows if a <= r["c"] < b]
        done = sum(1 for r in rows if r["f"] is not None and a <= r["f"] < b)
        lat = percentiles([(r["f"] - r["c"]) * MS for r in made if r["f"] is not None])
        d, cores = delta(ca, cb), ctx.cores(t0_wall + a, t0_wall + b)
        cpu = " | ".join(f"{cores.get(k, 0.0):.2f}" for k in ("postgres", "sut", "machine"))
        windows.append(f"{a:.0f}-{b:.0f} | {phase((a + b) / 2)} | {len(made) / (b - a):.0f} | "
            f"{done / (b - a):.0f} | {lat['p50']:.1f} / {lat['p99']:.1f} | {cb['dead']:,.0f} | "
            f"{cb['runnable_idx'] / KB:,.0f} | {cb['total'] / MB:.1f} | {g(probe['ms'])} | "
            f"{probe['buffers']:,.0f} | {100 * d['hot'] / max(1, d['upd']):.0f} | "
            f"{d['wal'] / max(1, done):,.0f} | {cb['xmin_age']:,.0f} | {cpu}")  # fmt: skip
    bad = sum(1 for r in rows if r["status"] != "completed")
    twice = ctx.upstream.arrivals().duplicates
    return [
        *section(f"2a. {plan.rate}/s, a snapshot held from t = {base_s:g} to {base_s + held_s:g}"
                 f" s (bench/history.py: dead_tuples); {len(ids):,} created",
                 "t s | phase | created/s | finished/s | latency p50 / p99 ms | n_dead_tup | "
                 "runnable idx KB | table+idx MB | claim scan ms | claim scan buffers | HOT % | "
                 "WAL B/call | oldest xmin age | pg cores | worker cores | all cores", windows,
                 *([f"FAIL: {bad} not completed, {twice} sent twice"] if bad or twice else [])),
        *section("2b. The VACUUMs (bench/history.py: vacuum)",
                 " | ".join(["t s", "phase", *VACUUM_RE]), vacuums),
    ]  # fmt: skip


# --- 3. WAL per step of one invocation's life, HOT by fillfactor, one commit -----------------


def lifecycle(fx: Fixture, q: dict[str, str], batch: int, batches: int, ff: int) -> str:
    """A row of table 3: WAL per invocation for each step (each its own autocommit statement,
    as the worker runs it; median over batches), and how many of its updates were HOT."""
    delete_fresh(fx)
    sql(fx.url, f"ALTER TABLE agents.tool_invocations SET (fillfactor = {ff})")
    before = counters(fx.url)
    wal: dict[str, list[float]] = {s: [] for s in ("create", "claim", "mark_sent", "finish")}
    lsn = "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
    try:
        with (
            psycopg.connect(fx.url, autocommit=True) as owner,
            psycopg.connect(fx.url, autocommit=True, row_factory=dict_row) as disp,
            psycopg.connect(fx.url, autocommit=True) as meter,
        ):
            act_as_owner(owner, fx.owner)
            disp.execute("SET ROLE service_role")

            def step(name: str, conn: psycopg.Connection[Any], text: str, p: Any) -> list[Any]:
                w0 = (meter.execute(lsn).fetchone() or (0,))[0]
                rows = conn.execute(text, p).fetchall()
                wal[name].append(float((meter.execute(lsn).fetchone() or (0,))[0] - w0) / batch)
                return rows

            for _ in range(batches):
                create = {"agent": fx.agent_id, "tool": fx.tool_id, "start": 1, "stop": batch}
                step("create", owner, ENQUEUE_SQL, create)
                got = step("claim", disp, q["claim"], {"limit": batch, "worker": STEP, "lease": 30})
                if len(got) != batch:
                    raise RuntimeError(f"claimed {len(got)} of {batch}: the queue was not empty")
                ids = [{"id": str(r["id"]), "attempt": r["attempt"]} for r in got]
                step("mark_sent", disp, q["mark_sent"], {"items": Jsonb(ids), "worker": STEP})
                now = datetime.now(UTC).isoformat()
                done = [i | {"status": "completed", "output": {"ok": True}, "http_status": 200}
                        for i in ids]  # fmt: skip
                tried = [{"invocation_id": i["id"], "owner": str(fx.owner), "attempt": i["attempt"],
                          "started_at": now, "finished_at": now, "status_code": 200,
                          "duration_ms": 1.0} for i in ids]  # fmt: skip
                done_p = {"results": Jsonb(done), "attempts": Jsonb(tried), "worker": STEP}
                step("finish", disp, q["finish"], done_p)
    finally:
        sql(fx.url, "ALTER TABLE agents.tool_invocations SET (fillfactor = 70)")  # as shipped
    time.sleep(SETTLE_S)
    d = delta(before, counters(fx.url))
    steps = [statistics.median(v) for v in wal.values()]
    wals = " | ".join(f"{v:,.0f}" for v in [*steps, sum(steps)])
    hot = f"{d['hot']:,.0f} ({100 * d['hot'] / max(1, d['upd']):.1f} %)"
    return f"{ff} | {batch} | {batch * batches:,} | {wals} | {d['upd']:,.0f} | {hot}"


def capacity(fx: Fixture, plan: Plan, queries: dict[str, str]) -> list[str]:
    """Table 3: lifecycle at fillfactor 70 with batches of 1 and 64, then 100 and 50 at 64."""
    rows = [lifecycle(fx, queries, b, plan.single if b == 1 else plan.batches, ff)
            for b, ff in ((1, 70), (64, 70), (64, 100), (64, 50))]  # fmt: skip
    return section(
        "3. One invocation's life, step by step (bench/history.py: lifecycle)",
        "fillfactor | batch | invocations | WAL B/call create | claim | mark_sent | finish | "
        "whole life | updates | HOT", rows,
        "Claim and mark_sent can be HOT, finish cannot (it changes `status`, which the partial"
        " indexes read): 66.7 % is the ceiling.",
    )  # fmt: skip


# --- entry -----------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1k vs 20k, short phases (< 1 min)")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    started, idle_s = time.monotonic(), 0.5 if args.quick else 2.0
    before = (noise_sample(idle_s), loadavg())
    sizes = QUICK if args.quick else FULL
    with open_session(sizes, args.quick, print, keep_logs=args.keep_logs) as (ctx, m):
        url_b = create_database(ctx.fx.url, "histb")
        try:
            fx_b = provision(url_b, ctx.upstream.url)
            for url in (ctx.fx.url, url_b):  # VACUUM when this says so (autovacuum: off)
                sql(
                    url, *(f"ALTER TABLE agents.{t} SET (autovacuum_enabled = off)" for t in TABLES)
                )
            assert ctx.worker_source is not None  # the snapshot of src/ the workers run
            queries = parse((ctx.worker_source / "toolrelay/db/sql/dispatch.sql").read_text())
            with admin(ctx.fx.url) as conn:
                settings = conn.execute(SETTINGS_SQL).fetchone() or {}
            print("drains ...", flush=True)
            parts = drains(ctx, [(ctx.fx, plan.small), (fx_b, plan.large)], plan, queries["claim"])
            print("dead_tuples ...", flush=True)
            parts += dead_tuples(ctx, ctx.fx, plan, queries["claim"])
            print("capacity ...", flush=True)
            parts += capacity(ctx.fx, plan, queries)
        finally:
            drop_database(ctx.fx.url, url_b)
    after = (noise_sample(idle_s), loadavg())
    text = "\n".join([
        f"## python -m bench.history{' --quick' if args.quick else ''}, {stamp}", "",
        f"- machine: {m['nproc']} cores ({m['cpu']}), {m['memory_gb']} GB, Linux {m['kernel']},"
        f" Python {m['python']}; PostgreSQL {m['postgres']} ({m['postgres_source']}):"
        f" {settings.get('s')}; both tables autovacuum_enabled off",
        f"- code: {m['code']['git']}, workers ran src sha1 {m['code']['src_sha1']}",
        f"- other load: {before[0]:.2f} cores busy before, {after[0]:.2f} after; load average"
        f" {before[1]} before, {after[1]} after; run took {time.monotonic() - started:.0f} s",
        f"- plan: {asdict(plan)}", "", *parts,
    ])  # fmt: skip
    print(text)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"history-{stamp}.md").write_text(text, "utf-8")
    print(f"wrote bench/out/history-{stamp}.md")
    return 1 if "\nFAIL: " in text else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
