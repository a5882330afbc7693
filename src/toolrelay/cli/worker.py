"""`toolrelay worker`: run the dispatcher."""

from __future__ import annotations

import asyncio

import typer

from toolrelay import config, logs
from toolrelay.cli.context import database, fail
from toolrelay.dispatch.worker import WorkerSettings, run_worker
from toolrelay.errors import ToolrelayError


def make_resolver(embedded: bool) -> object:
    """The credential resolver for this process (decrypts only inside the dispatcher)."""
    from toolrelay.credentials import CredentialResolver, keyring_from_env

    return CredentialResolver(None, keyring_from_env(embedded=embedded))


def worker(
    concurrency: int = typer.Option(64, min=1, help="Calls in flight at once."),
    lease_seconds: float = typer.Option(30.0, min=1, help="Lease length; renewed by heartbeat."),
    drain: bool = typer.Option(False, help="Run until nothing is runnable or leased, then exit."),
    metrics_port: int | None = typer.Option(None, help="Serve Prometheus metrics on 127.0.0.1."),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Run the dispatcher: claim runnable invocations, send them, record the outcome."""
    logs.configure(log_level)
    try:
        db = database()
        resolver = make_resolver(embedded=config.database_url_from_env() is None)
        settings = WorkerSettings(
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            drain=drain,
            metrics_port=metrics_port,
        )
        asyncio.run(run_worker(db.url, settings, resolver))
    except ToolrelayError as exc:
        raise fail(exc) from None
