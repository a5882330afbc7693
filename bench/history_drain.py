"""One worker drains fresh invocations next to a filled history (``python -m bench.history``).

The same measurement as the benchmark's throughput phase (one ``toolrelay worker --drain
--concurrency 64`` process, released by the gate, rate = first attempt started → last
invocation finished), except that the table is not truncated first: only what the benchmark
created is deleted (the filled history stays), then both tables are vacuumed and analyzed.
Around the drain it also reads the WAL position, the table's update counters (HOT or not) and,
every 50 ms, the worker's connections in pg_stat_activity.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from bench.constants import DRAIN_TIMEOUT_S
from bench.context import Context
from bench.history_probe import (
    FILL_WORKER,
    delete_fresh,
    probe_claim,
    set_id_default,
    sizes,
    statio,
    table_stats,
    wal_mark,
)
from bench.procs import Child, loadavg, wait_all
from bench.setup import Fixture, admin, enqueue
from bench.workers import WorkerLaunch, gate, wait_blocked

US = 1e6
CONNECTION_POLL_S = 0.05
SETTLE_S = 1.0  # after the worker exits: its statistics reach pg_stat_* (flushed at exit)

WORKER_APP = "toolrelay-bench-worker"  # PGAPPNAME of the workers: their connections are named
CONNECTIONS_SQL = """
SELECT count(*) AS backends,
       count(*) FILTER (WHERE query ILIKE 'LISTEN%%') AS listening,
       count(*) FILTER (WHERE state = 'active') AS active
  FROM pg_stat_activity
 WHERE datname = %s AND application_name = %s
"""


def start_worker(launch: WorkerLaunch, name: str) -> Child:
    """A worker whose connections carry application_name WORKER_APP (libpq's PGAPPNAME)."""
    env = launch.env() | {"PGAPPNAME": WORKER_APP}
    return Child(name, launch.argv(), env, launch.logs / f"{name}.log")


class ConnectionSampler(threading.Thread):
    """The most connections the workers (application_name WORKER_APP) of one database had at
    once while it ran."""

    def __init__(self, admin_url: str, dbname: str) -> None:
        super().__init__(daemon=True, name="connection-sampler")
        self.admin_url = admin_url
        self.dbname = dbname
        self.max_backends = 0
        self.max_listening = 0
        self.max_active = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while not self._halt.wait(CONNECTION_POLL_S):
                conn.execute("SELECT pg_stat_clear_snapshot()")
                row = conn.execute(CONNECTIONS_SQL, (self.dbname, WORKER_APP)).fetchone()
                if row:
                    self.max_backends = max(self.max_backends, int(row[0]))
                    self.max_listening = max(self.max_listening, int(row[1]))
                    self.max_active = max(self.max_active, int(row[2]))
                    self.samples += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


@dataclass
class HistoryDrain:
    label: str  # "10k" / "1M" / "1M v7"
    time_ordered_ids: bool  # the experiment: a UUIDv7-style id default during this drain
    history: int  # finished invocations in the table besides the fresh ones
    round: int
    n: int
    per_s: float
    window_s: float
    enqueue_per_s: float  # creating the queue: fn_invoke_tool, 5,000 per statement
    completed: int
    duplicates: int
    arrived: int  # distinct invocations the upstream saw
    cores: dict[str, float]
    cpu_us_per_call: dict[str, float]
    wal_drain: dict[str, float]  # claim + mark_sent + finish (+ attempt rows), whole drain
    wal_enqueue: dict[str, float]  # creating n - probe_runnable invocations
    wal_bytes_per_call: float  # drain
    wal_enqueue_bytes_per_call: float
    fpi_per_call: float  # full-page images per invocation drained (pg_stat_wal, cluster-wide)
    pg_us_per_enqueued: float  # PostgreSQL CPU while enqueueing, per invocation created
    blocks_hit_per_call: float  # shared buffers hit, both tables and their indexes
    blocks_read_per_call: float  # ... not in shared_buffers (read from the OS cache or disk)
    updates: int  # row updates on tool_invocations during the drain
    hot_updates: int
    connections: dict[str, int]  # most at once: backends, listening, active
    loadavg: tuple[float, float, float]
    probe: dict[str, Any] = field(default_factory=dict)  # the claim, small runnable set
    probe_picked: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def checkpoint(url: str) -> None:
    with admin(url) as conn:
        conn.execute("CHECKPOINT")


def _fresh_window(fx: Fixture, since: float) -> dict[str, Any]:
    with admin(fx.url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed') AS completed, count(*) AS total,"
            " extract(epoch FROM max(finished_at))::float8 AS last_finish"
            " FROM agents.tool_invocations WHERE owner = %s AND created_at >= to_timestamp(%s)",
            (fx.owner, since),
        ).fetchone()
        first = conn.execute(
            "SELECT extract(epoch FROM min(started_at))::float8 AS first_start"
            " FROM agents.tool_invocation_attempts"
            " WHERE started_at >= to_timestamp(%s) AND worker <> %s",
            (since, FILL_WORKER),
        ).fetchone()
    assert row is not None and first is not None
    return dict(row) | dict(first)


def drain_with_history(
    ctx: Context,
    fx: Fixture,
    admin_url: str,
    label: str,
    history: int,
    round_no: int,
    n: int,
    claim_sql: str,
    probe_runnable: int,
    probe_repeats: int,
    time_ordered_ids: bool = False,
) -> HistoryDrain:
    dbname = str(psycopg.conninfo.conninfo_to_dict(fx.url)["dbname"])
    since = time.time() - 1.0  # the filled history ends a day ago; everything fresh is after
    delete_fresh(fx, since - 3600.0)
    set_id_default(fx.url, time_ordered_ids)
    ctx.upstream.reset()
    # The claim alone, with a small runnable set, in a freshly vacuumed table.
    enqueue(fx, probe_runnable)
    probe = probe_claim(fx.url, claim_sql, probe_runnable, probe_repeats)
    picked = probe_claim(fx.url, claim_sql, probe_runnable, probe_repeats, picked_only=True)
    # The rest of the queue, measured: WAL and PostgreSQL CPU per invocation created. A
    # checkpoint first, and again before the drain: every page a step touches first then
    # writes a full-page image, whatever the server's checkpoint timer did (reproducible).
    checkpoint(fx.url)
    enq_began_wall = time.time()
    enq_began = time.monotonic()
    mark0 = wal_mark(fx.url)
    enqueue(fx, n - probe_runnable, first=probe_runnable + 1)
    enq_s = time.monotonic() - enq_began
    mark1 = wal_mark(fx.url)
    enq_cores = ctx.cores(enq_began_wall, time.time())
    table_sizes = sizes(fx.url)
    checkpoint(fx.url)
    stats0 = table_stats(fx.url)
    io0 = statio(fx.url)
    launch = WorkerLaunch(fx, ctx.logs, ctx.home, source=ctx.worker_source)
    sampler = ConnectionSampler(admin_url, dbname)
    with gate(fx.url):
        child = start_worker(launch, f"history-{label.replace(' ', '-')}-r{round_no}")
        ctx.running = [child]
        wait_blocked(fx.url, [child])
        sampler.start()
        mark2 = wal_mark(fx.url)
    usages = wait_all([child], DRAIN_TIMEOUT_S)
    mark3 = wal_mark(fx.url)
    sampler.stop()
    if usages[0].returncode != 0:
        raise RuntimeError(f"{child.name} exited {usages[0].returncode}:\n{child.tail()}")
    time.sleep(SETTLE_S)
    stats1 = table_stats(fx.url)
    io1 = statio(fx.url)
    set_id_default(fx.url, False)
    window = _fresh_window(fx, since)
    arrivals = ctx.upstream.arrivals()
    span = float(window["last_finish"] or 0.0) - float(window["first_start"] or 0.0)
    cores = ctx.cores(float(window["first_start"] or 0.0), float(window["last_finish"] or 0.0))
    if cores:
        cores["other"] = round(
            cores.get("machine", 0.0)
            - sum(cores.get(k, 0.0) for k in ("sut", "upstream", "postgres", "harness")),
            3,
        )
    total = int(window["total"])
    wal_drain = mark2.delta(mark3)
    wal_enq = mark0.delta(mark1)
    created = n - probe_runnable
    return HistoryDrain(
        label=label,
        time_ordered_ids=time_ordered_ids,
        history=history,
        round=round_no,
        n=n,
        per_s=round(total / span, 1) if span > 0 else 0.0,
        window_s=round(span, 3),
        enqueue_per_s=round(created / enq_s, 1) if enq_s > 0 else 0.0,
        completed=int(window["completed"]),
        duplicates=arrivals.duplicates,
        arrived=len(arrivals.first),
        cores=cores,
        cpu_us_per_call={
            k: round(cores[k] * span / n * US, 1)
            for k in ("sut", "postgres", "upstream")
            if k in cores and span > 0
        },
        wal_drain=wal_drain,
        wal_enqueue=wal_enq,
        wal_bytes_per_call=round(wal_drain["bytes"] / n, 1),
        wal_enqueue_bytes_per_call=round(wal_enq["bytes"] / created, 1),
        fpi_per_call=round(wal_drain["fpi"] / n, 3),
        pg_us_per_enqueued=round(enq_cores.get("postgres", 0.0) * enq_s / created * US, 1)
        if enq_cores
        else 0.0,
        blocks_hit_per_call=round((io1["hit"] - io0["hit"]) / n, 1),
        blocks_read_per_call=round((io1["read"] - io0["read"]) / n, 2),
        updates=stats1.get("n_tup_upd", 0) - stats0.get("n_tup_upd", 0),
        hot_updates=stats1.get("n_tup_hot_upd", 0) - stats0.get("n_tup_hot_upd", 0),
        connections={
            "backends": sampler.max_backends,
            "listening": sampler.max_listening,
            "active": sampler.max_active,
            "samples": sampler.samples,
        },
        loadavg=loadavg(),
        probe=probe.as_dict(),
        probe_picked=picked.as_dict(),
        sizes=table_sizes,
    )
