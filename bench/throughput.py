"""Draining a full queue: toolrelay with 1..k workers, the minimal durable loop (the floor),
the raw client, the procrastinate peer.

Every rate here is "first work started → last result recorded":
toolrelay: min(attempt.started_at) → max(invocation.finished_at); floor: first job's
started_at → last finished_at; raw: first request started → last response read; peer:
first job 'started' event → last 'succeeded' event. The upstream's own window (first → last arrival) is reported beside it,
and so is the CPU each party used over the same window.
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
from bench.upstream import Arrivals
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

    @property
    def failures(self) -> int:
        return self.duplicates + self.non_terminal + self.not_completed


def _upstream_rate(arrivals: Arrivals) -> float:
    first, last = arrivals.window()
    return len(arrivals.first) / (last - first) if last > first else 0.0


def _check_exits(children: Sequence[Child], usages: Sequence[Usage]) -> None:
    for child, usage in zip(children, usages, strict=True):
        if usage.returncode != 0:
            raise RuntimeError(f"{child.name} exited {usage.returncode}:\n{child.tail()}")


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
    stats = drain_stats(ctx.fx.url)
    arrivals = ctx.upstream.arrivals()
    window = stats.last_finish - stats.first_start
    time.sleep(SETTLE_S)
    return DrainResult(
        system="toolrelay",
        n=n,
        workers=workers,
        per_s=stats.total / window if window > 0 else 0.0,
        window_s=window,
        wall_s=wall,
        upstream_per_s=_upstream_rate(arrivals),
        arrived=len(arrivals.first),
        duplicates=arrivals.duplicates,
        non_terminal=stats.non_terminal + (n - stats.total),
        not_completed=stats.not_completed,
        attempts=stats.attempts,
        rss_mb=[round(u.max_rss_mb, 1) for u in usages],
        cores=ctx.cores(stats.first_start, stats.last_finish),
        extra={"by_status": stats.by_status},
    )


def drain_raw(ctx: Context, n: int) -> DrainResult:
    """The same requests from one aiohttp process at the same concurrency."""
    ctx.upstream.reset()
    argv = python_module("bench.raw", ctx.upstream.url, str(n), str(CONCURRENCY))
    child = Child("raw", argv, dict(os.environ), ctx.logs / "raw.log", capture_stdout=True)
    ctx.running = [child]
    usage = child.wait(DRAIN_TIMEOUT_S)
    _check_exits([child], [usage])
    out = json.loads(child.readline())
    arrivals = ctx.upstream.arrivals()
    time.sleep(SETTLE_S)
    return DrainResult(
        system="raw aiohttp",
        n=n,
        workers=1,
        per_s=out["per_s"],
        window_s=out["elapsed_s"],
        wall_s=usage.wall_s,
        upstream_per_s=_upstream_rate(arrivals),
        arrived=len(arrivals.first),
        duplicates=arrivals.duplicates,
        non_terminal=0,
        not_completed=int(out["errors"]) + (n - len(arrivals.first)),
        attempts=n,
        rss_mb=[round(usage.max_rss_mb, 1)],
        cores=ctx.cores(out["first_start"], out["last_end"]),
    )


def drain_floor(ctx: Context, n: int) -> DrainResult:
    """The same calls through the minimal durable loop of bench/floor.py, its own process."""
    floor.enqueue(ctx.fx.url, n)
    usage, arrivals = _drain_child(ctx, "floor", "bench.floor", ctx.fx.url)
    stats = floor.stats(ctx.fx.url)
    window = stats.last_finish - stats.first_start
    time.sleep(SETTLE_S)
    return DrainResult(
        system=f"minimal loop (claim {floor.BATCH})",
        n=n,
        workers=1,
        per_s=stats.done / window if window > 0 else 0.0,
        window_s=window,
        wall_s=usage.wall_s,
        upstream_per_s=_upstream_rate(arrivals),
        arrived=len(arrivals.first),
        duplicates=arrivals.duplicates,
        non_terminal=stats.open + (n - sum(stats.by_status.values())),
        not_completed=n - stats.done - stats.open,
        attempts=n,
        rss_mb=[round(usage.max_rss_mb, 1)],
        cores=ctx.cores(stats.first_start, stats.last_finish),
        extra={"by_status": stats.by_status},
    )


def _drain_child(ctx: Context, name: str, module: str, db_url: str) -> tuple[Usage, Arrivals]:
    """Run ``python -m module DB_URL UPSTREAM CONCURRENCY`` until it has drained its queue;
    its usage and what the upstream saw."""
    ctx.upstream.reset()
    argv = python_module(module, db_url, ctx.upstream.url, str(CONCURRENCY))
    child = Child(name, argv, dict(os.environ), ctx.logs / f"{name}.log")
    ctx.running = [child]
    usage = child.wait(DRAIN_TIMEOUT_S)
    _check_exits([child], [usage])
    return usage, ctx.upstream.arrivals()


def drain_peer(ctx: Context, n: int) -> DrainResult:
    """The same calls as procrastinate jobs, drained by one procrastinate worker process."""
    asyncio.run(peer.reset_and_defer(ctx.peer_url, n))
    usage, arrivals = _drain_child(ctx, "peer", "bench.peer", ctx.peer_url)
    stats = peer.stats(ctx.peer_url)
    window = stats.last_finish - stats.first_start
    time.sleep(SETTLE_S)
    return DrainResult(
        system=f"procrastinate {peer.VERSION}",
        n=n,
        workers=1,
        per_s=stats.succeeded / window if window > 0 else 0.0,
        window_s=window,
        wall_s=usage.wall_s,
        upstream_per_s=_upstream_rate(arrivals),
        arrived=len(arrivals.first),
        duplicates=arrivals.duplicates,
        non_terminal=stats.non_terminal,
        not_completed=n - stats.succeeded,
        attempts=stats.started,
        rss_mb=[round(usage.max_rss_mb, 1)],
        cores=ctx.cores(stats.first_start, stats.last_finish),
        extra={"by_status": stats.by_status},
    )


def scaling(ctx: Context, n: int, counts: Sequence[int]) -> list[DrainResult]:
    return [drain_toolrelay(ctx, n, workers, f"scale{workers}") for workers in counts]
