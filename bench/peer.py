"""The peer: the same HTTP call as a procrastinate task, in procrastinate's own database.

The task sends what the toolrelay worker sends (JSON POST, API key header, an
X-Toolrelay-Invocation id carried in the job's arguments) and parses the JSON answer.

The harness applies procrastinate's schema (``apply_schema``), defers the jobs
(``reset_and_defer``) and reads the outcome (``stats``); the worker runs as
``python -m bench.peer DB_URL UPSTREAM_URL CONCURRENCY`` and exits once the queue is empty
(``wait=False``).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import aiohttp
import procrastinate
import psycopg
from procrastinate.types import JSONValue
from psycopg.rows import dict_row

from bench.constants import REQUEST_TIMEOUT_S, call_headers

VERSION = version("procrastinate")
TASK_NAME = "bench_call"
DEFER_CHUNK = 1_000  # jobs per batch_defer_async call
POOL_MAX = 8  # connections of the procrastinate worker (psycopg_pool's default is 4)
POLL_INTERVAL_S = 0.1  # fetch_job_polling_interval: the worker has everything queued up front
TERMINAL = ("succeeded", "failed", "cancelled", "aborted")


class _Client:
    """One aiohttp session per worker process, opened on first use."""

    upstream = ""
    session: aiohttp.ClientSession | None = None

    @classmethod
    def get(cls) -> aiohttp.ClientSession:
        if cls.session is None:
            cls.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            )
        return cls.session


def make_app(url: str, pool_max: int = POOL_MAX) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(
        conninfo=url, min_size=min(4, pool_max), max_size=pool_max
    )
    app = procrastinate.App(connector=connector)

    @app.task(name=TASK_NAME)
    async def call(n: int, inv: str) -> None:
        headers = call_headers(inv)
        async with _Client.get().post(_Client.upstream, json={"n": n}, headers=headers) as resp:
            resp.raise_for_status()
            await resp.json()

    return app


async def apply_schema(url: str) -> None:
    app = make_app(url, pool_max=1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def reset_and_defer(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")
        conn.execute("VACUUM ANALYZE procrastinate_jobs")
        conn.execute("VACUUM ANALYZE procrastinate_events")
    app = make_app(url, pool_max=1)
    async with app.open_async():
        task = app.tasks[TASK_NAME]
        for start in range(1, n + 1, DEFER_CHUNK):
            stop = min(start + DEFER_CHUNK, n + 1)
            jobs: list[dict[str, JSONValue]] = [
                {"n": i, "inv": str(uuid.uuid4())} for i in range(start, stop)
            ]
            await task.batch_defer_async(*jobs)


@dataclass
class PeerStats:
    by_status: dict[str, int]
    first_start: float
    last_finish: float
    started: int
    succeeded: int

    @property
    def non_terminal(self) -> int:
        return sum(v for k, v in self.by_status.items() if k not in TERMINAL)


def stats(url: str) -> PeerStats:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status::text AS status, count(*) AS n FROM procrastinate_jobs GROUP BY 1"
        ).fetchall()
        row: dict[str, Any] | None = conn.execute(
            "SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'started'))::float8 AS s,"
            " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded'))::float8 AS f,"
            " count(*) FILTER (WHERE type = 'started') AS started,"
            " count(*) FILTER (WHERE type = 'succeeded') AS succeeded"
            " FROM procrastinate_events"
        ).fetchone()
    assert row is not None
    return PeerStats(
        by_status={r["status"]: int(r["n"]) for r in rows},
        first_start=float(row["s"] or 0.0),
        last_finish=float(row["f"] or 0.0),
        started=int(row["started"]),
        succeeded=int(row["succeeded"]),
    )


async def work(url: str, upstream: str, concurrency: int) -> None:
    _Client.upstream = upstream
    app = make_app(url)
    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency,
            wait=False,
            install_signal_handlers=False,
            delete_jobs="never",
            fetch_job_polling_interval=POLL_INTERVAL_S,
        )
    if _Client.session is not None:
        await _Client.session.close()


if __name__ == "__main__":
    asyncio.run(work(sys.argv[1], sys.argv[2], int(sys.argv[3])))
