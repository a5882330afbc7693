"""`toolrelay worker`: run the dispatcher."""

from __future__ import annotations

import asyncio

import typer

from toolrelay import config, heap, logs
from toolrelay.cli.context import err_console, fail, migrated_database
from toolrelay.credentials import Keyring, MissingMasterKey, load_keyring
from toolrelay.db import Database
from toolrelay.dispatch.budget import DEFAULT_ANSWER_BUDGET, DEFAULT_MAX_ANSWER
from toolrelay.dispatch.worker import SUMMARY_ENV, SUMMARY_INTERVAL, WorkerSettings, run_worker
from toolrelay.errors import ConfigurationError, ToolrelayError

DRAIN_LEFT_CALLS = 3  # exit status of a drain that handed calls back (docs/cli.md)


def worker(
    concurrency: int = typer.Option(64, min=1, help="Calls in flight at once."),
    lease_seconds: float = typer.Option(30.0, min=1, help="Lease length; renewed by heartbeat."),
    drain: bool = typer.Option(False, help="Run until nothing is runnable or leased, then exit."),
    metrics_port: int | None = typer.Option(None, help="Serve Prometheus metrics on 127.0.0.1."),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR."),
    pooler: bool = typer.Option(
        False,
        envvar="TOOLRELAY_POOLER_TRANSACTION",
        help="DATABASE_URL goes through PgBouncer in transaction mode.",
    ),
    listen_url: str | None = typer.Option(
        None,
        envvar="TOOLRELAY_LISTEN_URL",
        help="A direct connection for LISTEN/NOTIFY when DATABASE_URL is pooled.",
    ),
    poll_interval: float = typer.Option(
        1.0, min=0.01, help="Seconds between polls when no notification arrives."
    ),
    sleep_protocol: bool = typer.Option(
        True,
        help="Register asleep when idle, so that calls notify only while some worker sleeps"
        " (migration 0018). Off: this worker never registers (it is still woken, as long as"
        " no worker that registers runs beside it).",
    ),
    summary_interval: float = typer.Option(
        SUMMARY_INTERVAL,
        min=0.01,
        envvar=SUMMARY_ENV,
        help="Seconds between summary lines at INFO (claimed, completed, failed by code, ...).",
    ),
    answer_budget_mib: float = typer.Option(
        DEFAULT_ANSWER_BUDGET / 2**20,
        min=0.001,
        help="MiB of upstream answers held parsed at once across calls; past it a call waits"
        " before parsing its answer (a parsed JSON answer weighs 10-45x its bytes).",
    ),
    max_answer_mib: float = typer.Option(
        DEFAULT_MAX_ANSWER / 2**20,
        min=0.001,
        help="MiB one upstream answer may take once parsed (estimated from its bytes before"
        " parsing, erring high); a call answered with more fails response_too_large.",
    ),
) -> None:
    """Run the dispatcher: claim runnable invocations, send them, record the outcome."""
    logs.configure(log_level)
    try:
        # Migrations take a session-level advisory lock: run them directly, not via a pooler.
        db = Database() if pooler else migrated_database()
        try:
            keyring: Keyring | None = load_keyring(
                db, embedded=config.database_url_from_env() is None
            )
        except MissingMasterKey:
            raise  # secrets are sealed under a key we lack: refuse rather than fail every call
        except ConfigurationError as exc:
            # Tools without credentials still run; calls of those with one are handed back
            # for a worker that has the keys (dispatch/worker.py, _resolve).
            err_console.print(f"warning: {exc.message}", markup=False, highlight=False)
            keyring = None
        settings = WorkerSettings(
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            drain=drain,
            metrics_port=metrics_port,
            pooler=pooler,
            listen_url=listen_url,
            poll_interval=poll_interval,
            sleep_protocol=sleep_protocol,
            summary_interval=summary_interval,
            answer_budget=round(answer_budget_mib * 2**20),
            max_answer=round(max_answer_mib * 2**20),
        )
        url = db.url
        db.close()  # its pool (and the pool's threads) is not used from here on
        heap.settle()  # what startup made stays out of the collector's scans (toolrelay/heap.py)
        ran = asyncio.run(run_worker(url, settings, keyring))
    except ToolrelayError as exc:
        raise fail(exc) from None
    if drain and ran.handed_back:
        keys = sorted({k for k in ran.handed_back.values() if k})
        needs = f"master key(s) {', '.join(map(repr, keys))}" if keys else "a master key"
        err_console.print(
            f"error: {len(ran.handed_back)} call(s) left runnable, unsent: their credentials"
            f" need {needs} this worker lacks or holds other bytes of (its log says which);"
            " they wait for a worker with the key",
            markup=False, highlight=False,
        )  # fmt: skip
        raise typer.Exit(DRAIN_LEFT_CALLS)
