"""The floor: a minimal durable PostgreSQL-backed dispatch loop (issue 14, goal 4).

What any dispatcher keeping its queue in PostgreSQL must do, and nothing more: a job table
of its own; claim up to 50 with FOR UPDATE SKIP LOCKED (a committed lease, recovered when
it expires); send with aiohttp, 64 in flight; one batched UPDATE per completed batch,
fenced by the lease owner; LISTEN/NOTIFY to wake up. No credentials, templates,
validation, "possibly sent" mark or attempt history: toolrelay does all of those, and its
goal is at least 0.7x this loop's rate against the same upstream in the same run.

The request is the raw client's (bench/raw.py): a JSON POST with the API key header and a
unique X-Toolrelay-Invocation value (the job id), whose JSON answer is read and parsed.

The harness creates the table and the jobs (``setup``, ``enqueue``) and reads the outcome
(``stats``); the loop runs as ``python -m bench.floor DB_URL UPSTREAM_URL CONCURRENCY`` and
exits when nothing is queued or running (``drain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

import aiohttp
import psycopg
from psycopg.rows import dict_row

from bench.constants import ENQUEUE_CHUNK, REQUEST_TIMEOUT_S, call_headers

BATCH = 50  # jobs per claim at most
LEASE_S = 30.0
POLL_S = 1.0  # fallback when no notification arrives
CHANNEL = "bench_floor"

SCHEMA = f"""
CREATE SCHEMA IF NOT EXISTS bench_floor;
CREATE TABLE IF NOT EXISTS bench_floor.jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload      jsonb NOT NULL,
    status       text NOT NULL DEFAULT 'queued',  -- queued, running, done, failed
    locked_by    text,
    locked_until timestamptz,
    http_status  integer,
    result       jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    finished_at  timestamptz
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS jobs_open_idx ON bench_floor.jobs (id)
    WHERE status IN ('queued', 'running');
CREATE OR REPLACE FUNCTION bench_floor.notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', '');
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER jobs_notify AFTER INSERT ON bench_floor.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION bench_floor.notify();
"""
CLAIM = """
UPDATE bench_floor.jobs j
   SET status = 'running', locked_by = %(me)s,
       locked_until = now() + make_interval(secs => %(lease)s), started_at = now()
  FROM (SELECT id FROM bench_floor.jobs
         WHERE status = 'queued' OR (status = 'running' AND locked_until < now())
         ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) picked
 WHERE j.id = picked.id
RETURNING j.id, j.payload
"""
FINISH = """
UPDATE bench_floor.jobs j
   SET status = r.status, http_status = r.http_status, result = r.result::jsonb,
       finished_at = now(), locked_by = NULL, locked_until = NULL
  FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(codes)s::int[], %(results)s::text[])
       AS r(id, status, http_status, result)
 WHERE j.id = r.id AND j.locked_by = %(me)s AND j.status = 'running'
"""
OPEN = "SELECT EXISTS (SELECT 1 FROM bench_floor.jobs WHERE status IN ('queued', 'running'))"


# --- the harness's side ----------------------------------------------------------------


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)


def enqueue(url: str, n: int) -> None:
    """Start from an empty, vacuumed table (created on first use) holding ``n`` queued jobs."""
    setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE bench_floor.jobs RESTART IDENTITY")
        for start in range(1, n + 1, ENQUEUE_CHUNK):
            stop = min(start + ENQUEUE_CHUNK, n + 1) - 1
            conn.execute(
                "INSERT INTO bench_floor.jobs (payload)"
                " SELECT jsonb_build_object('n', g) FROM generate_series(%s::int, %s::int) g",
                (start, stop),
            )
        conn.execute("VACUUM ANALYZE bench_floor.jobs")


@dataclass
class FloorStats:
    by_status: dict[str, int]
    first_start: float  # epoch seconds
    last_finish: float

    @property
    def done(self) -> int:
        return self.by_status.get("done", 0)

    @property
    def open(self) -> int:
        return self.by_status.get("queued", 0) + self.by_status.get("running", 0)


def stats(url: str) -> FloorStats:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status, count(*) AS n FROM bench_floor.jobs GROUP BY 1"
        ).fetchall()
        window: dict[str, Any] | None = conn.execute(
            "SELECT extract(epoch FROM min(started_at))::float8 AS s,"
            " extract(epoch FROM max(finished_at))::float8 AS f FROM bench_floor.jobs"
        ).fetchone()
    assert window is not None
    return FloorStats(
        {r["status"]: int(r["n"]) for r in rows},
        float(window["s"] or 0.0),
        float(window["f"] or 0.0),
    )


# --- the loop --------------------------------------------------------------------------


class Floor:
    def __init__(self, url: str, upstream: str, concurrency: int) -> None:
        self.url, self.upstream, self.concurrency = url, upstream, concurrency
        self.me = f"floor-{os.getpid()}"
        self.in_flight = 0
        self.wake = asyncio.Event()
        self.batches: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        self.claimer = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        self.writer = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        listener = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        await listener.execute(f"LISTEN {CHANNEL}")
        listening = asyncio.create_task(self._listen(listener))
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as self.http:
            while True:
                self.wake.clear()
                free = self.concurrency - self.in_flight
                if free >= min(BATCH, self.concurrency) // 4:
                    params = {"me": self.me, "lease": LEASE_S, "limit": min(BATCH, free)}
                    cur = await self.claimer.execute(CLAIM, params)
                    jobs = await cur.fetchall()
                    if jobs:
                        self._start(jobs)
                        continue
                    if not self.in_flight and not await self._open():
                        break  # drained
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), POLL_S)
        listening.cancel()
        for conn in (listener, self.claimer, self.writer):
            await conn.close()

    def _start(self, jobs: list[tuple[Any, ...]]) -> None:
        self.in_flight += len(jobs)
        task = asyncio.create_task(self._batch(jobs))
        self.batches.add(task)
        task.add_done_callback(self.batches.discard)

    async def _batch(self, jobs: list[tuple[Any, ...]]) -> None:
        """Send every job of one claim, then record all of them in one UPDATE."""
        outcomes = await asyncio.gather(*(self._send(job_id, p) for job_id, p in jobs))
        await self.writer.execute(
            FINISH,
            {
                "me": self.me,
                "ids": [job_id for job_id, _ in jobs],
                "statuses": [status for status, _, _ in outcomes],
                "codes": [code for _, code, _ in outcomes],
                "results": [result for _, _, result in outcomes],
            },
        )
        self.in_flight -= len(jobs)
        self.wake.set()

    async def _send(self, job_id: int, payload: dict[str, Any]) -> tuple[str, int | None, str]:
        headers = call_headers(f"floor-{job_id}")
        try:
            async with self.http.post(self.upstream, json=payload, headers=headers) as resp:
                body = await resp.read()
                json.loads(body)  # the answer is parsed, as every system here does
                status = "done" if resp.status == 200 else "failed"
                return status, resp.status, body.decode()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return "failed", None, json.dumps({"error": type(exc).__name__})

    async def _open(self) -> bool:
        cur = await self.claimer.execute(OPEN)
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async for _ in conn.notifies():
            self.wake.set()


if __name__ == "__main__":
    db_url, upstream_url, lanes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asyncio.run(Floor(db_url, upstream_url, lanes).run())
