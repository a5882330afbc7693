"""toolrelay workers as separate processes (`python -m toolrelay.cli worker`), and the gate.

The gate lets several workers start claiming at the same instant: the harness holds a SHARE
lock on agents.tool_invocations, each worker blocks on its first write (the approval-expiry
sweep that starts its loop), and committing the harness's transaction releases them all.
Nothing about the invocations is changed for it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.constants import CONCURRENCY
from bench.procs import Child
from bench.setup import Fixture, wait_until

LOCK_WAITERS_SQL = (
    "SELECT count(DISTINCT pid) AS n FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    " AND pid <> pg_backend_pid()"
)
LISTENING_SQL = (
    "SELECT count(*) AS n FROM pg_stat_activity"
    " WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
)


@dataclass(frozen=True)
class WorkerLaunch:
    fx: Fixture
    logs: Path
    home: Path
    concurrency: int = CONCURRENCY
    drain: bool = True
    source: Path | None = None  # a patched copy of src/ to run instead (experiments)
    extra: tuple[str, ...] = ()  # more `toolrelay worker` options (e.g. --no-sleep-protocol)

    def env(self) -> dict[str, str]:
        return toolrelay_env(self.fx, self.home, self.source)

    def argv(self, interpreter: Sequence[str] = ()) -> list[str]:
        """``interpreter`` replaces plain ``python`` (e.g. py-spy record -- python)."""
        options = [
            "--drain" if self.drain else "--no-drain",
            "--concurrency",
            str(self.concurrency),
            *self.extra,
        ]
        return [*(interpreter or [sys.executable]), "-m", "toolrelay.cli", "worker", *options]

    def start(self, name: str, interpreter: Sequence[str] = ()) -> Child:
        return Child(name, self.argv(interpreter), self.env(), self.logs / f"{name}.log")


def toolrelay_env(fx: Fixture, home: Path, source: Path | None = None) -> dict[str, str]:
    """The environment of a toolrelay process under test (worker or serve): this run's
    database and master key, its own home, egress allowed to the loopback upstream, none of
    the harness's other TOOLRELAY_ settings; ``source`` (a copy of src/) first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLRELAY_")}
    env |= {
        "DATABASE_URL": fx.url,
        "TOOLRELAY_EGRESS_ALLOW": "127.0.0.1",
        "TOOLRELAY_MASTER_KEY": fx.master_key,
        "TOOLRELAY_HOME": str(home),
    }
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    return env


@contextmanager
def gate(url: str) -> Iterator[psycopg.Connection[tuple[int]]]:
    """Hold back every worker's first write until the block ends."""
    conn = psycopg.connect(url)
    try:
        conn.execute("LOCK TABLE agents.tool_invocations IN SHARE MODE")
        yield conn
        conn.commit()
    finally:
        conn.close()


def wait_blocked(url: str, workers: Sequence[Child]) -> None:
    """Until every worker is waiting on the gate (or one of them died)."""
    wait_until(
        url,
        LOCK_WAITERS_SQL,
        lambda row: int(row["n"]) >= len(workers),
        "workers did not reach the gate",
        watch=workers,
    )


def wait_listening(url: str, worker: Child) -> None:
    """Until a (not draining) worker has run LISTEN: it will hear the next invocation."""
    wait_until(
        url,
        LISTENING_SQL,
        lambda row: int(row["n"]) >= 1,
        "the worker did not start listening",
        watch=[worker],
    )
