"""Section 5 of RESULTS.md: invoke cost, how many invocations per second the owner's side
can record, with no worker running.

Each variant runs N threads for a fixed time (Sizes.invoke_seconds), every thread on its
own connection, from the harness process; counted: calls completed per second over that
time, each call's latency, errors, and the cores used over the window (the threads show as
``harness``). The table is emptied before each variant. The variants:
- ``Registry.invoke``: the shipped path (BEGIN; identity and lookup pipelined; jsonschema
  validation; fn_invoke_tool; COMMIT: four round trips), each thread its own Registry.
- ``fn_invoke_tool``: one autocommit statement per call, no Python validation, from 8 and
  from 32 connections: whether anything serializes all invokers.
Each runs with every call notifying (as shipped), with NOTIFY to sleeping workers only
(migration 0016's protocol on, no worker asleep) and with the trigger disabled. (The
``4 statements (before)`` variant, the path Registry.invoke took until 2026-12-01, was
removed (issue 14, goal 5: bench/ stays readable); its last numbers are in RESULTS.md.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from bench.constants import AGENT_NAME, INVOKE_THREADS, TOOL_KEY
from bench.latency import INVOKE_SQL, percentiles
from bench.session import Context
from bench.setup import Fixture, act_as_owner, admin, clear_invocations
from toolrelay.db import Database
from toolrelay.registry import Registry

MS = 1000.0
WIDE_THREADS = 32  # connections of the widest fn_invoke_tool variant
NOTIFY_TRIGGER = "tool_invocations_notify"


@dataclass
class InvokeResult:
    variant: str
    threads: int
    seconds: float
    calls: int
    per_s: float
    errors: int
    latency_ms: dict[str, float]
    cores: dict[str, float]  # machine, harness (the threads), postgres

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Call = Callable[[int], None]
Close = Callable[[], None]


def hammer(
    ctx: Context,
    name: str,
    make_call: Callable[[], tuple[Call, Close]],
    seconds: float,
    threads_n: int = INVOKE_THREADS,
) -> InvokeResult:
    calls = [0] * threads_n
    errors = [0] * threads_n
    latencies: list[list[float]] = [[] for _ in range(threads_n)]
    start = threading.Barrier(threads_n + 1)
    stop_at = [0.0]

    def thread(index: int) -> None:
        call, close = make_call()
        start.wait()
        k = index * 10_000_000
        while time.monotonic() < stop_at[0]:
            began = time.monotonic()
            try:
                call(k)
                calls[index] += 1
            except Exception:
                errors[index] += 1
            latencies[index].append((time.monotonic() - began) * MS)
            k += 1
        close()

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    began_at = time.time()
    began = time.monotonic()
    stop_at[0] = began + seconds
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    cores = ctx.cores(began_at, time.time())
    total = sum(calls)
    return InvokeResult(
        variant=name,
        threads=threads_n,
        seconds=round(elapsed, 3),
        calls=total,
        per_s=round(total / elapsed, 1),
        errors=sum(errors),
        latency_ms=percentiles([v for lane in latencies for v in lane]),
        cores=cores,
    )


def registry_call(db: Database, owner: UUID) -> tuple[Call, Close]:
    registry = Registry(db, owner)

    def call(k: int) -> None:
        registry.invoke(AGENT_NAME, TOOL_KEY, {"n": k})

    return call, lambda: None


def sql_call(fx: Fixture) -> tuple[Call, Close]:
    conn = psycopg.connect(fx.url, autocommit=True)
    act_as_owner(conn, fx.owner)

    def call(k: int) -> None:
        conn.execute(INVOKE_SQL, (fx.agent_id, fx.tool_id, Jsonb({"n": k}))).fetchone()

    return call, conn.close


# How calls notify: as shipped (every call), to sleeping workers only (0016's protocol on,
# no worker asleep: what a busy fleet sees), and not at all (the trigger disabled).
NOTIFY_MODES = ("", ", sleepers only", ", no NOTIFY")


def _set_notify(url: str, mode: str) -> None:
    with admin(url) as conn:
        verb = "DISABLE" if mode == ", no NOTIFY" else "ENABLE"
        conn.execute(f"ALTER TABLE agents.tool_invocations {verb} TRIGGER {NOTIFY_TRIGGER}")
        only = mode == ", sleepers only"
        conn.execute("UPDATE agents.dispatch_wake SET sleepers_only = %s", (only,))
        conn.execute("DELETE FROM agents.dispatch_sleepers")


def run(ctx: Context, seconds: float) -> list[InvokeResult]:
    fx = ctx.fx
    db = Database(fx.url, pool_size=INVOKE_THREADS)
    variants: list[tuple[str, Callable[[], tuple[Call, Close]], int]] = [
        ("Registry.invoke", lambda: registry_call(db, fx.owner), INVOKE_THREADS),
        ("fn_invoke_tool", lambda: sql_call(fx), INVOKE_THREADS),
        ("fn_invoke_tool", lambda: sql_call(fx), WIDE_THREADS),
    ]
    results = []
    ctx.running = []  # no system under test but the threads (the harness's CPU)
    try:
        for mode in NOTIFY_MODES:
            _set_notify(fx.url, mode)
            for name, make, threads_n in variants:
                clear_invocations(fx.url)
                results.append(hammer(ctx, name + mode, make, seconds, threads_n))
    finally:
        _set_notify(fx.url, "")
        db.close()
    clear_invocations(fx.url)
    return results
