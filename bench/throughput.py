"""Sections 1, 3 and 4 of RESULTS.md: draining a full queue.

Each drain starts from an empty, vacuumed table (or job table) holding ``n`` queued calls
and one process (or ``k`` toolrelay workers) that exits once they are done; the upstream
counts every request. Rows: toolrelay (``toolrelay worker --drain --concurrency 64``,
released together by workers.gate), the minimal durable loop (bench/floor.py), the raw
client (bench/raw.py, no queue) and procrastinate (bench/peer.py). Section 3 is toolrelay's
drain with 1, 2 and 4 workers; section 4 is one worker's drain of 100,000, its peak RSS.

Every rate is calls done over "first work started → last result recorded": toolrelay
min(attempt.started_at) → max(invocation.finished_at); floor: its first job's started_at →
last finished_at; raw: first request started → last response read; peer: first 'started'
event → last 'succeeded' event. Beside it: the upstream's rate over its first → last
arrival, duplicates (requests beyond the first for one invocation) and calls not done,
each process's peak RSS (VmHWM), and the cores each party used over the same window (the
session's Timeline), also as CPU µs per call.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench import floor, peer
from bench.constants import CONCURRENCY, DRAIN_TIMEOUT_S
from bench.procs import Child, DatabaseBackends, ServerProcesses, Usage, python_module, wait_all
from bench.session import Context
from bench.setup import admin, clear_invocations, dbname, drain_stats, enqueue, postmaster_of
from bench.workers import gate, wait_blocked

US = 1e6  # microseconds per second
SETTLE_S = 0.5  # pause after a phase so that exits and checkpoints do not bleed into the next


def watch_databases(ctx: Context) -> None:
    """Add ``pg_db`` (procs.DatabaseBackends) to the CPU timeline, when the server is local."""
    postmaster = postmaster_of(ctx.fx.url)
    if postmaster is not None:
        names = [dbname(ctx.fx.url), dbname(ctx.peer_url)]
        ctx.timeline.add("pg_db", DatabaseBackends(ServerProcesses(postmaster), names))


@dataclass
class DrainResult:
    system: str
    n: int
    workers: int
    per_s: float  # over the "first start → last result" window
    window_s: float
    wall_s: float  # gate release (or process start) → last process exit
    upstream_per_s: float  # over the upstream's first → last arrival
    arrived: int  # distinct invocations seen by the upstream
    duplicates: int  # requests beyond the first for one invocation: must be 0
    non_terminal: int  # invocations not finished at the end: must be 0
    not_completed: int  # finished otherwise than completed: should be 0
    attempts: int
    rss_mb: list[float] = field(default_factory=list)  # peak RSS per process (VmHWM)
    cores: dict[str, float] = field(default_factory=dict)  # average cores over the window
    extra: dict[str, Any] = field(default_factory=dict)
    # CPU microseconds per call over the window: the cost, whatever share of the machine we got
    cpu_us_per_call: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n and self.window_s > 0:
            self.cpu_us_per_call = {
                k: round(self.cores[k] * self.window_s / self.n * US, 1)
                for k in ("sut", "postgres", "pg_db", "upstream")
                if k in self.cores
            }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _drained(
    ctx: Context,
    system: str,
    n: int,
    done: int,
    window: tuple[float, float],
    usages: Sequence[Usage],
    *,
    wall_s: float,
    failed: tuple[int, int],
    attempts: int,
    by_status: dict[str, int] | None = None,
) -> DrainResult:
    """One row: ``done`` calls over ``window`` (epoch seconds, first start → last result),
    what the upstream saw since its reset, and ``failed`` (not terminal, not completed)."""
    arrivals = ctx.upstream.arrivals()
    time.sleep(SETTLE_S)  # the timeline samples the window's end before it is read
    first, last = window
    seen_first, seen_last = arrivals.window()
    seen = len(arrivals.first)
    return DrainResult(
        system=system,
        n=n,
        workers=len(usages),
        per_s=done / (last - first) if last > first else 0.0,
        window_s=last - first,
        wall_s=wall_s,
        upstream_per_s=seen / (seen_last - seen_first) if seen_last > seen_first else 0.0,
        arrived=seen,
        duplicates=arrivals.duplicates,
        non_terminal=failed[0],
        not_completed=failed[1],
        attempts=attempts,
        rss_mb=[round(u.max_rss_mb, 1) for u in usages],
        cores=ctx.cores(first, last),
        extra={} if by_status is None else {"by_status": by_status},
    )


def _check_exits(children: Sequence[Child], usages: Sequence[Usage]) -> None:
    for child, usage in zip(children, usages, strict=True):
        if usage.returncode != 0:
            raise RuntimeError(f"{child.name} exited {usage.returncode}:\n{child.tail()}")


def _run_child(
    ctx: Context, name: str, argv: list[str], capture: bool = False
) -> tuple[Child, Usage]:
    """Start one child on a reset upstream and wait until it exits (0, or RuntimeError)."""
    ctx.upstream.reset()
    child = Child(name, argv, dict(os.environ), ctx.logs / f"{name}.log", capture)
    ctx.running = [child]
    usage = child.wait(DRAIN_TIMEOUT_S)
    _check_exits([child], [usage])
    return child, usage


def drain_toolrelay(
    ctx: Context, n: int, workers: int, label: str, interpreter: Sequence[str] = ()
) -> DrainResult:
    """Queue ``n`` invocations, release ``workers`` drain-mode workers at once, wait."""
    clear_invocations(ctx.fx.url)
    ctx.upstream.reset()
    enqueue(ctx.fx, n)
    # Statistics as autovacuum would have them for a queue this size: taken on the empty
    # table, they can steer mark_sent and finish onto the runnable index (every queued
    # row scanned per statement) instead of the primary key, a plan no real queue keeps.
    with admin(ctx.fx.url) as conn:
        conn.execute("ANALYZE agents.tool_invocations")
    launch = ctx.launch(drain=True)
    with gate(ctx.fx.url):
        children = [launch.start(f"{label}-w{i + 1}", interpreter) for i in range(workers)]
        ctx.running = children
        wait_blocked(ctx.fx.url, children)
        released = time.monotonic()
    usages = wait_all(children, DRAIN_TIMEOUT_S)
    wall = time.monotonic() - released
    _check_exits(children, usages)
    s = drain_stats(ctx.fx.url)
    failed = (s.non_terminal + (n - s.total), s.not_completed)
    return _drained(ctx, "toolrelay", n, s.total, (s.first_start, s.last_finish), usages,
                    wall_s=wall, failed=failed, attempts=s.attempts,
                    by_status=s.by_status)  # fmt: skip


def drain_raw(ctx: Context, n: int) -> DrainResult:
    """The same requests from one aiohttp process at the same concurrency."""
    argv = python_module("bench.raw", ctx.upstream.url, str(n), str(CONCURRENCY))
    child, usage = _run_child(ctx, "raw", argv, capture=True)
    out = json.loads(child.readline())
    failed = (0, int(out["errors"]) + n - len(ctx.upstream.arrivals().first))
    return _drained(ctx, "raw aiohttp", n, n, (out["first_start"], out["last_end"]), [usage],
                    wall_s=usage.wall_s, failed=failed, attempts=n)  # fmt: skip


def drain_floor(ctx: Context, n: int) -> DrainResult:
    """The same calls through the minimal durable loop of bench/floor.py, its own process."""
    floor.enqueue(ctx.fx.url, n)
    argv = python_module("bench.floor", ctx.fx.url, ctx.upstream.url, str(CONCURRENCY))
    _, usage = _run_child(ctx, "floor", argv)
    s = floor.stats(ctx.fx.url)
    failed = (s.open + (n - sum(s.by_status.values())), n - s.done - s.open)
    return _drained(ctx, f"minimal loop (claim {floor.BATCH})", n, s.done,
                    (s.first_start, s.last_finish), [usage], wall_s=usage.wall_s, failed=failed,
                    attempts=n, by_status=s.by_status)  # fmt: skip


def drain_peer(ctx: Context, n: int) -> DrainResult:
    """The same calls as procrastinate jobs, drained by one procrastinate worker process."""
    asyncio.run(peer.reset_and_defer(ctx.peer_url, n))
    argv = python_module("bench.peer", ctx.peer_url, ctx.upstream.url, str(CONCURRENCY))
    _, usage = _run_child(ctx, "peer", argv)
    s = peer.stats(ctx.peer_url)
    return _drained(ctx, f"procrastinate {peer.VERSION}", n, s.succeeded,
                    (s.first_start, s.last_finish), [usage], wall_s=usage.wall_s,
                    failed=(s.non_terminal, n - s.succeeded), attempts=s.started,
                    by_status=s.by_status)  # fmt: skip


def scaling(ctx: Context, n: int, counts: Sequence[int]) -> list[DrainResult]:
    return [drain_toolrelay(ctx, n, workers, f"scale{workers}") for workers in counts]
