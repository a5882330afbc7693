"""SQL probes for ``python -m bench.history``: filling a history, the claim under EXPLAIN,
table statistics and sizes, WAL positions, and per-backend CPU.

Everything here talks to one scratch database as the superuser. The claim text is read from
the copy of ``src/`` the workers run (the code measured), never retyped here.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from bench.procs import CLOCK_TICKS
from bench.setup import Fixture, admin
from toolrelay.db.queries import parse

FILL_WORKER = "history-fill"  # the `worker` of the attempt rows the fill writes
FILL_CHUNK = 100_000  # finished invocations per INSERT statement
FILL_SPAN_DAYS = 30  # the filled history is spread over the 30 days before "yesterday"
RUNNABLE_INDEX = "tool_invocations_runnable_idx"
PROBE_WORKER = "history-probe"  # lease owner used by the probes' (rolled back) claims
US = 1e6

# Finished invocations and one attempt row each, made the way the worker would have left them
# (completed, HTTP 200, sent, leases cleared). Triggers are off for the fill only
# (session_replication_role = replica): the rows are consistent by construction, and the
# NOTIFY trigger would do nothing for finished rows anyway.
FILL_SQL = """
WITH rows AS (
    SELECT gen_random_uuid() AS id, g,
           now() - make_interval(days => %(span)s + 1)
                 + (g - 1) * (make_interval(days => %(span)s) / %(total)s) AS t
      FROM generate_series(%(first)s::int, %(last)s::int) AS g
), inv AS (
    INSERT INTO agents.tool_invocations (
        id, owner, tool_id, agent_id, run_id, input, output, status, approval_status,
        config_fingerprint, attempt, run_after, sent_at, http_status, finished_at,
        created_at, updated_at)
    SELECT id, %(owner)s, %(tool)s, %(agent)s, %(marker)s, jsonb_build_object('n', g),
           '{"ok": true}'::jsonb, 'completed', 'not_required', %(fingerprint)s, 1, t,
           t + interval '1 ms', 200, t + interval '6 ms', t, t + interval '6 ms'
      FROM rows
)
INSERT INTO agents.tool_invocation_attempts (
    invocation_id, owner, attempt, worker, started_at, finished_at, status_code, duration_ms)
SELECT id, %(owner)s, 1, %(fill_worker)s, t + interval '1 ms', t + interval '5 ms', 200, 4.0
  FROM rows
"""


def snapshot_queries(source: Path) -> dict[str, str]:
    """The dispatcher's named queries as the measured copy of src/ has them (the same
    parser as toolrelay.db.queries.load)."""
    return parse((source / "toolrelay" / "db" / "sql" / "dispatch.sql").read_text("utf-8"))


def picked_of(claim: str) -> str:
    """The claim's first CTE (``picked``): the index scan and row locks, without the UPDATE."""
    found = re.search(r"WITH picked AS \((.*?)\), claimed AS", claim, re.S)
    if found is None:
        raise RuntimeError("the claim query no longer starts with a `picked` CTE")
    return found.group(1).strip()


def fill(fx: Fixture, n: int, marker: UUID) -> float:
    """Add ``n`` finished invocations (and an attempt row each); returns the seconds taken."""
    began = time.monotonic()
    with admin(fx.url) as conn:
        row = conn.execute(
            "SELECT agents.tool_fingerprint(t) AS fp FROM agents.tools_registry t WHERE id = %s",
            (fx.tool_id,),
        ).fetchone()
        assert row is not None
        conn.execute("SET session_replication_role = replica")
        for first in range(1, n + 1, FILL_CHUNK):
            conn.execute(
                FILL_SQL,
                {
                    "span": FILL_SPAN_DAYS,
                    "total": n,
                    "first": first,
                    "last": min(n, first + FILL_CHUNK - 1),
                    "owner": fx.owner,
                    "tool": fx.tool_id,
                    "agent": fx.agent_id,
                    "marker": marker,
                    "fingerprint": row["fp"],
                    "fill_worker": FILL_WORKER,
                },
            )
        conn.execute("RESET session_replication_role")
        vacuum(fx.url, analyze=True)
        conn.execute("CHECKPOINT")  # the fill's WAL must not checkpoint during a measurement
    return time.monotonic() - began


# An experiment, in the scratch database only: time-ordered invocation ids (UUIDv7 layout:
# 48 bits of Unix milliseconds, version 7, then random bits) instead of gen_random_uuid(), so
# that new ids land at one edge of the primary key and of the attempts' invocation index.
UUID_V7_SQL = """
CREATE OR REPLACE FUNCTION public.history_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
  SELECT encode(
    set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                            PLACING substring(int8send(floor(extract(epoch FROM
                                clock_timestamp()) * 1000)::bigint) FROM 3)
                            FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$
"""


def set_id_default(url: str, time_ordered: bool) -> None:
    with admin(url) as conn:
        if time_ordered:
            conn.execute(UUID_V7_SQL)
            conn.execute(
                "ALTER TABLE agents.tool_invocations"
                " ALTER COLUMN id SET DEFAULT public.history_uuid_v7()"
            )
        else:
            conn.execute(
                "ALTER TABLE agents.tool_invocations ALTER COLUMN id SET DEFAULT gen_random_uuid()"
            )


STATIO_SQL = """
SELECT coalesce(sum(heap_blks_hit + coalesce(idx_blks_hit, 0)), 0)::bigint AS hit,
       coalesce(sum(heap_blks_read + coalesce(idx_blks_read, 0)), 0)::bigint AS read
  FROM pg_statio_user_tables
 WHERE relid IN ('agents.tool_invocations'::regclass, 'agents.tool_invocation_attempts'::regclass)
"""


def statio(url: str) -> dict[str, int]:
    """Shared-buffer hits and reads (misses: from the OS cache or disk) of both tables and
    their indexes, cumulative."""
    with admin(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(STATIO_SQL).fetchone()
    return {k: int(v) for k, v in (row or {}).items()}


def vacuum(url: str, analyze: bool = False) -> None:
    verb = "VACUUM (ANALYZE)" if analyze else "VACUUM"
    with admin(url) as conn:
        conn.execute(f"{verb} agents.tool_invocations")
        conn.execute(f"{verb} agents.tool_invocation_attempts")


def delete_fresh(fx: Fixture, since: float) -> int:
    """Remove what the benchmark created (created at or after ``since``, epoch seconds), with
    its attempts (cascade), keeping the filled history; then VACUUM ANALYZE both tables."""
    with admin(fx.url) as conn:
        cur = conn.execute(
            "DELETE FROM agents.tool_invocations"
            " WHERE owner = %s AND created_at >= to_timestamp(%s)",
            (fx.owner, since),
        )
        deleted = cur.rowcount
    vacuum(fx.url, analyze=True)
    return deleted


def db_now(url: str) -> float:
    with admin(url) as conn:
        row = conn.execute("SELECT extract(epoch FROM now())::float8 AS t").fetchone()
    assert row is not None
    return float(row["t"])


# --- the claim under EXPLAIN -----------------------------------------------------------------


@dataclass
class Explained:
    """One EXPLAIN (ANALYZE, BUFFERS) of a statement, run and rolled back."""

    execution_ms: float
    planning_ms: float
    rows: int  # rows the top node returned (claimed)
    shared_hit: int  # buffers of the whole statement (top node, children included)
    shared_read: int
    shared_dirtied: int
    index: str  # the index the scan of tool_invocations used ("" when none)
    index_hit: int  # buffers of that index scan node alone
    index_rows: int


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += _walk(child)
    return found


def parse_explain(doc: Any) -> Explained:
    top = doc[0] if isinstance(doc, list) else doc
    plan = top["Plan"]
    scans = [
        n
        for n in _walk(plan)
        if n.get("Relation Name") == "tool_invocations" and "Index" in n.get("Node Type", "")
    ]
    scan = scans[0] if scans else {}
    return Explained(
        execution_ms=float(top["Execution Time"]),
        planning_ms=float(top.get("Planning Time", 0.0)),
        rows=int(plan.get("Actual Rows", 0)),
        shared_hit=int(plan.get("Shared Hit Blocks", 0)),
        shared_read=int(plan.get("Shared Read Blocks", 0)),
        shared_dirtied=int(plan.get("Shared Dirtied Blocks", 0)),
        index=str(scan.get("Index Name", "")),
        index_hit=int(scan.get("Shared Hit Blocks", 0)),
        index_rows=int(scan.get("Actual Rows", 0)),
    )


def explain_once(url: str, sql: str, params: dict[str, Any]) -> Explained:
    """EXPLAIN (ANALYZE, BUFFERS) ``sql`` as the dispatcher role, then roll it back.
    Parameters are bound client-side, so the plan is the one for these values."""
    with psycopg.connect(url, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute("SET LOCAL ROLE service_role")
        cur = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        row = cur.fetchone()
        conn.rollback()
    assert row is not None
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return parse_explain(doc)


@dataclass
class ClaimProbe:
    """The claim (or its ``picked`` scan) explained ``repeats`` times after warm-up runs."""

    what: str
    runnable: int  # runnable invocations in the table while probing
    limit: int
    repeats: int
    execution_ms: dict[str, float]  # median / min / max
    shared_hit: dict[str, float]
    index_hit: dict[str, float]
    rows: int
    index: str
    shared_read_total: int
    samples_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


WARMUP = 2  # probe runs discarded first (catalog caches of a fresh connection's backend)


def spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def probe_claim(
    url: str, claim: str, runnable: int, repeats: int, limit: int = 64, picked_only: bool = False
) -> ClaimProbe:
    sql = picked_of(claim) if picked_only else claim
    params = {"limit": limit, "worker": PROBE_WORKER, "lease": 30}
    runs: list[Explained] = []
    for i in range(repeats + WARMUP):
        one = explain_once(url, sql, params)
        if i >= WARMUP:
            runs.append(one)
    return ClaimProbe(
        what="picked scan" if picked_only else "claim",
        runnable=runnable,
        limit=limit,
        repeats=repeats,
        execution_ms=spread([r.execution_ms for r in runs]),
        shared_hit=spread([float(r.shared_hit) for r in runs]),
        index_hit=spread([float(r.index_hit) for r in runs]),
        rows=runs[-1].rows if runs else 0,
        index=runs[-1].index if runs else "",
        shared_read_total=sum(r.shared_read for r in runs),
        samples_ms=[round(r.execution_ms, 4) for r in runs],
    )


# --- statistics, sizes, WAL ------------------------------------------------------------------

TABLE_STATS_SQL = """
SELECT n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
       vacuum_count, autovacuum_count
  FROM pg_stat_user_tables WHERE relid = 'agents.tool_invocations'::regclass
"""
SIZES_SQL = f"""
SELECT pg_relation_size('agents.tool_invocations') AS heap,
       pg_total_relation_size('agents.tool_invocations') AS total,
       pg_indexes_size('agents.tool_invocations') AS indexes,
       pg_relation_size('agents.{RUNNABLE_INDEX}') AS runnable_idx,
       pg_relation_size('agents.tool_invocations_pkey') AS pkey,
       pg_total_relation_size('agents.tool_invocation_attempts') AS attempts_total
"""
WAL_SQL = """
SELECT pg_current_wal_insert_lsn()::text AS lsn,
       (SELECT wal_records FROM pg_stat_wal) AS records,
       (SELECT wal_fpi FROM pg_stat_wal) AS fpi,
       (SELECT wal_bytes FROM pg_stat_wal)::bigint AS bytes
"""
OLDEST_XMIN_SQL = """
SELECT coalesce(max(age(backend_xmin)), 0) AS xmin_age,
       coalesce(max(extract(epoch FROM now() - xact_start)), 0)::float8 AS oldest_xact_s
  FROM pg_stat_activity WHERE backend_xmin IS NOT NULL
"""


def table_stats(url: str) -> dict[str, int]:
    with admin(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(TABLE_STATS_SQL).fetchone()
    return {k: int(v or 0) for k, v in (row or {}).items()}


def sizes(url: str) -> dict[str, int]:
    with admin(url) as conn:
        row = conn.execute(SIZES_SQL).fetchone()
        out = {k: int(v) for k, v in (row or {}).items()}
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
            for name in ("tool_invocations_pkey", RUNNABLE_INDEX):
                level = conn.execute(
                    "SELECT level FROM bt_metap(%s)", (f"agents.{name}",)
                ).fetchone()
                out[f"{name}_levels"] = int(level["level"]) + 1 if level else 0
        except psycopg.Error:
            pass  # pageinspect not installed: the btree depth is left out
    return out


def lsn_bytes(lsn: str) -> int:
    high, low = lsn.split("/")
    return (int(high, 16) << 32) + int(low, 16)


@dataclass
class WalMark:
    lsn: int  # bytes: pg_current_wal_insert_lsn()
    records: int  # pg_stat_wal: cluster-wide, flushed by backends at most every ~1 s
    fpi: int
    bytes: int
    at: float  # epoch seconds

    def delta(self, later: WalMark) -> dict[str, float]:
        return {
            "bytes": later.lsn - self.lsn,
            "stat_bytes": later.bytes - self.bytes,
            "records": later.records - self.records,
            "fpi": later.fpi - self.fpi,
            "seconds": round(later.at - self.at, 3),
        }


def wal_mark(url: str) -> WalMark:
    with admin(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(WAL_SQL).fetchone()
    assert row is not None
    return WalMark(
        lsn_bytes(row["lsn"]), int(row["records"]), int(row["fpi"]), int(row["bytes"]), time.time()
    )


def oldest_xmin(url: str) -> dict[str, float]:
    with admin(url) as conn:
        row = conn.execute(OLDEST_XMIN_SQL).fetchone()
    return {k: float(v) for k, v in (row or {}).items()}


def backend_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a server backend on this machine has used; 10 ms ticks."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def server_settings(url: str) -> dict[str, str]:
    names = (
        "shared_buffers",
        "max_connections",
        "synchronous_commit",
        "fsync",
        "wal_level",
        "full_page_writes",
        "wal_compression",
        "autovacuum",
        "autovacuum_naptime",
        "autovacuum_vacuum_scale_factor",
        "idle_in_transaction_session_timeout",
        "checkpoint_timeout",
        "max_wal_size",
    )
    with admin(url) as conn:
        return {
            n: str(next(iter((conn.execute(f"SHOW {n}").fetchone() or {"": "?"}).values())))
            for n in names
        }
