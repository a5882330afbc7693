"""Invoke cost: how many invocations per second the owner's side can record.

Three variants, each INVOKE_THREADS threads for a fixed time:
- ``Registry.invoke``: the shipped path (lookups, jsonschema validation, fn_invoke_tool),
  each thread with its own Registry. Database opens a new connection per transaction.
- ``fn_invoke_tool`` SQL: one persistent connection per thread, no Python validation.
- ``Registry.invoke, pooled`` (an experiment, not shipped): the same Registry over a
  Database whose as_owner borrows from a psycopg connection pool instead of connecting.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from bench.constants import AGENT_NAME, INVOKE_THREADS, TOOL_KEY
from bench.context import Context
from bench.latency import IDENTITY_SQL, INVOKE_SQL, percentiles
from bench.setup import Fixture, clear_invocations
from toolrelay.db import Database
from toolrelay.db.connect import _SET_IDENTITY, OWNER_ROLE, Row
from toolrelay.registry import Registry

MS = 1000.0


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


class PooledDatabase(Database):
    """Experiment: as_owner on pooled connections (identity stays transaction-local)."""

    def __init__(self, url: str, size: int) -> None:
        super().__init__(url)
        self.pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
            url, min_size=size, max_size=size, kwargs={"row_factory": dict_row}, open=True
        )
        self.pool.wait()

    @contextmanager
    def as_owner(
        self, owner: UUID | str, agent_id: UUID | str | None = None
    ) -> Iterator[psycopg.Connection[Row]]:
        claims: dict[str, str] = {"sub": str(owner), "role": OWNER_ROLE}
        if agent_id is not None:
            claims["agent_id"] = str(agent_id)
        with self.pool.connection() as conn, conn.transaction():
            conn.execute(_SET_IDENTITY, (OWNER_ROLE, str(owner), json.dumps(claims)))
            yield conn


Call = Callable[[int], None]
Close = Callable[[], None]


def _hammer(
    ctx: Context, name: str, make_call: Callable[[], tuple[Call, Close]], seconds: float
) -> InvokeResult:
    calls = [0] * INVOKE_THREADS
    errors = [0] * INVOKE_THREADS
    latencies: list[list[float]] = [[] for _ in range(INVOKE_THREADS)]
    start = threading.Barrier(INVOKE_THREADS + 1)
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

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(INVOKE_THREADS)]
    for t in threads:
        t.start()
    ctx.running = []
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
        threads=INVOKE_THREADS,
        seconds=round(elapsed, 3),
        calls=total,
        per_s=round(total / elapsed, 1),
        errors=sum(errors),
        latency_ms=percentiles([v for lane in latencies for v in lane]),
        cores=cores,
    )


def _registry_call(db: Database, owner: UUID) -> tuple[Call, Close]:
    registry = Registry(db, owner)

    def call(k: int) -> None:
        registry.invoke(AGENT_NAME, TOOL_KEY, {"n": k})

    return call, lambda: None


def _sql_call(fx: Fixture) -> tuple[Call, Close]:
    conn = psycopg.connect(fx.url, autocommit=True)
    claims = json.dumps({"sub": str(fx.owner), "role": OWNER_ROLE})
    conn.execute(IDENTITY_SQL, (str(fx.owner), claims))

    def call(k: int) -> None:
        conn.execute(INVOKE_SQL, (fx.agent_id, fx.tool_id, Jsonb({"n": k}))).fetchone()

    return call, conn.close


def run(ctx: Context, seconds: float, experiment: bool = True) -> list[InvokeResult]:
    fx = ctx.fx
    results = []
    clear_invocations(fx.url)
    results.append(
        _hammer(ctx, "Registry.invoke", lambda: _registry_call(Database(fx.url), fx.owner), seconds)
    )
    clear_invocations(fx.url)
    results.append(_hammer(ctx, "fn_invoke_tool (SQL only)", lambda: _sql_call(fx), seconds))
    if experiment:
        clear_invocations(fx.url)
        pooled = PooledDatabase(fx.url, INVOKE_THREADS)
        try:
            results.append(
                _hammer(
                    ctx,
                    "Registry.invoke, pooled (experiment)",
                    lambda: _registry_call(pooled, fx.owner),
                    seconds,
                )
            )
        finally:
            pooled.pool.close()
    clear_invocations(fx.url)
    return results
