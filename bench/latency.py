"""Section 2 of RESULTS.md: latency under a steady load, one worker.

Started: one ``toolrelay worker --no-drain`` (waited for until it LISTENs), then a warm-up
of LATENCY_WARMUP_S at the first rate (not measured), then each rate of LATENCY_RATES in
turn (the 1,000/s one for Sizes.sustained_seconds when set). Each invocation is its own
fn_invoke_tool call (one autocommit statement, as an agent's request would be) from one of
GENERATOR_CONNECTIONS connections, on an open-loop schedule: the k-th is due at t0 + k/rate
whether or not earlier ones are done.

Counted per invocation, once all are finished (or SETTLE_CAP_S passed): created_at
(PostgreSQL's now()) → first arrival at the upstream (time.time() there), and created_at →
finished_at, as p50/p95/p99/max; both clocks are the machine's real-time clock. Beside
them: the rate the generator achieved, duplicates, calls that never arrived or did not
complete, and the cores used over the creation window; the worker's peak RSS over the phase.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.constants import (
    GENERATOR_CONNECTIONS,
    LATENCY_PAUSE_S,
    LATENCY_RATES,
    LATENCY_WARMUP_S,
    SETTLE_TIMEOUT_S,
)
from bench.session import Context
from bench.setup import (
    SESSION_IDENTITY_SQL,
    TERMINAL,
    Fixture,
    clear_invocations,
    invocation_times,
    status_of,
)
from bench.workers import wait_listening
from toolrelay.db.connect import owner_identity

MS = 1000.0
PERCENTILES = (50, 95, 99)
HISTOGRAM_LIMIT = 20_000  # samples kept per rate for the plot
INVOKE_SQL = "SELECT fn_invoke_tool(%s, %s, %s) AS id"


@dataclass
class Generated:
    ids: list[str]
    offered_per_s: float  # as scheduled
    achieved_per_s: float  # first → last creation as the generator saw it
    max_lag_ms: float  # worst delay of a call behind its schedule


@dataclass
class RateResult:
    rate: int
    seconds: float
    n: int
    achieved_per_s: float
    generator_max_lag_ms: float
    to_request_ms: dict[str, float]  # p50/p95/p99/max/mean: creation → arrival upstream
    to_finish_ms: dict[str, float]  # creation → finished_at
    duplicates: int
    missing: int  # never reached the upstream
    non_terminal: int
    not_completed: int
    cores: dict[str, float]  # average cores while creating: machine, worker, upstream, postgres
    by_status: dict[str, int]  # "completed", or status/error_code
    worker_rss_mb: float = 0.0  # the worker's peak over the whole latency phase
    samples_request_ms: list[float] = field(default_factory=list)
    samples_finish_ms: list[float] = field(default_factory=list)

    def as_dict(self, with_samples: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_samples:
            data.pop("samples_request_ms")
            data.pop("samples_finish_ms")
        return data


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {f"p{p}": float("nan") for p in PERCENTILES} | {"max": float("nan")}
    ordered = sorted(values)
    out = {
        f"p{p}": ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))] for p in PERCENTILES
    }
    out["max"] = ordered[-1]
    out["mean"] = statistics.fmean(ordered)
    return {k: round(v, 2) for k, v in out.items()}


async def generate(fx: Fixture, rate: int, seconds: float) -> Generated:
    total = max(1, round(rate * seconds))
    conns = [
        await psycopg.AsyncConnection.connect(fx.url, autocommit=True)
        for _ in range(GENERATOR_CONNECTIONS)
    ]
    for conn in conns:
        await conn.execute(SESSION_IDENTITY_SQL, owner_identity(fx.owner))
    queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
    ids: list[str] = []
    lag = 0.0
    loop = asyncio.get_running_loop()

    async def lane(conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal lag
        while (item := await queue.get()) is not None:
            k, due = item
            lag = max(lag, loop.time() - due)
            cur = await conn.execute(INVOKE_SQL, (fx.agent_id, fx.tool_id, Jsonb({"n": k})))
            row = await cur.fetchone()
            assert row is not None
            ids.append(str(row[0]))

    lanes = [asyncio.create_task(lane(conn)) for conn in conns]
    t0 = loop.time()
    first_wall = time.time()
    for k in range(total):
        due = t0 + k / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait((k, due))
    for _ in lanes:
        queue.put_nowait(None)
    await asyncio.gather(*lanes)
    elapsed = time.time() - first_wall
    for conn in conns:
        await conn.close()
    return Generated(ids, float(rate), total / elapsed if elapsed > 0 else 0.0, lag * MS)


SETTLE_CAP_S = 300.0  # a backlog still draining is waited for this long at most


def wait_settled(url: str, ids: list[str]) -> None:
    """Until every call is finished; gives up after SETTLE_TIMEOUT_S without progress (a
    backlog that still drains is waited for, up to SETTLE_CAP_S: slow is not lost)."""
    began = last_progress = time.monotonic()
    done_before = -1
    while time.monotonic() - last_progress < SETTLE_TIMEOUT_S:
        times = invocation_times(url, ids)
        done = sum(1 for _, _, outcome in times.values() if status_of(outcome) in TERMINAL)
        if done == len(ids):
            return
        if done > done_before:
            done_before, last_progress = done, time.monotonic()
        if time.monotonic() - began > SETTLE_CAP_S:
            return
        time.sleep(0.2)


def measure(ctx: Context, rate: int, seconds: float) -> RateResult:
    began = time.time()
    gen = asyncio.run(generate(ctx.fx, rate, seconds))
    ended = time.time()
    wait_settled(ctx.fx.url, gen.ids)
    times = invocation_times(ctx.fx.url, gen.ids)
    arrivals = ctx.upstream.arrivals()
    to_request: list[float] = []
    to_finish: list[float] = []
    for inv, (created, finished, _status) in times.items():
        arrived = arrivals.first.get(inv)
        if arrived is not None:
            to_request.append((arrived - created) * MS)
        if finished is not None:
            to_finish.append((finished - created) * MS)
    wanted = set(gen.ids)
    return RateResult(
        rate=rate,
        seconds=seconds,
        n=len(gen.ids),
        achieved_per_s=round(gen.achieved_per_s, 1),
        generator_max_lag_ms=round(gen.max_lag_ms, 2),
        to_request_ms=percentiles(to_request),
        to_finish_ms=percentiles(to_finish),
        duplicates=sum(v for k, v in arrivals.repeats.items() if k in wanted),
        missing=sum(1 for inv in gen.ids if inv not in arrivals.first),
        non_terminal=sum(1 for _, _, s in times.values() if status_of(s) not in TERMINAL)
        + (len(gen.ids) - len(times)),
        not_completed=sum(1 for _, _, s in times.values() if s != "completed"),
        by_status=dict(Counter(s for _, _, s in times.values())),
        cores=ctx.cores(began, ended),
        samples_request_ms=[round(v, 3) for v in to_request[:HISTOGRAM_LIMIT]],
        samples_finish_ms=[round(v, 3) for v in to_finish[:HISTOGRAM_LIMIT]],
    )


SUSTAINED_RATE = 1_000  # invocations per second held for Sizes.sustained_seconds


def run(ctx: Context, seconds: float, rates: tuple[int, ...] = LATENCY_RATES) -> list[RateResult]:
    clear_invocations(ctx.fx.url)
    ctx.upstream.reset()
    worker = ctx.launch(drain=False).start("latency-w1")
    ctx.running = [worker]
    try:
        wait_listening(ctx.fx.url, worker)
        warm = asyncio.run(generate(ctx.fx, rates[0], LATENCY_WARMUP_S))
        wait_settled(ctx.fx.url, warm.ids)
        results = []
        for rate in rates:
            time.sleep(LATENCY_PAUSE_S)
            sustained = ctx.sizes.sustained_seconds if rate == SUSTAINED_RATE else 0.0
            results.append(measure(ctx, rate, sustained or seconds))
    finally:
        usage = worker.stop()
    if usage.returncode != 0:
        raise RuntimeError(f"latency worker exited {usage.returncode}:\n{worker.tail()}")
    for result in results:
        result.worker_rss_mb = round(usage.max_rss_mb, 1)
    return results
