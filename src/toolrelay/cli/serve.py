"""`toolrelay serve`: the HTTP API and approvals page, with the dispatcher in-process."""

from __future__ import annotations

import os

import typer

from toolrelay import config, heap, logs
from toolrelay.cli.context import err_console, fail, migrated_database
from toolrelay.credentials import Keyring, MissingMasterKey, load_keyring
from toolrelay.db import Database
from toolrelay.dispatch.budget import DEFAULT_ANSWER_BUDGET, DEFAULT_MAX_ANSWER
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import WorkerSettings
from toolrelay.errors import ConfigurationError, ToolrelayError
from toolrelay.tokens import JWT_SECRET_ENV

# toolrelay.api.server's defaults (not imported here: importing toolrelay.api loads the app).
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_MAX_SLOW = 100


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8080, min=0, max=65535, help="Port (0 picks a free one)."),
    no_worker: bool = typer.Option(
        False, "--no-worker", help="Do not run the dispatcher in this process."
    ),
    concurrency: int = typer.Option(64, min=1, help="The in-process worker's calls in flight."),
    lease_seconds: float = typer.Option(30.0, min=1, help="The worker's lease length."),
    answer_budget_mib: float = typer.Option(
        DEFAULT_ANSWER_BUDGET / 2**20,
        min=0.001,
        help="The in-process worker's MiB of upstream answers held parsed at once (worker"
        " --answer-budget-mib).",
    ),
    max_answer_mib: float = typer.Option(
        DEFAULT_MAX_ANSWER / 2**20,
        min=0.001,
        help="The in-process worker's MiB one upstream answer may take once parsed (worker"
        " --max-answer-mib).",
    ),
    proxy_headers: bool = typer.Option(
        False, help="Trust X-Forwarded-* from 127.0.0.1 (behind a TLS-terminating proxy)."
    ),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR."),
    header_timeout: float = typer.Option(
        DEFAULT_HEADER_TIMEOUT,
        min=0.1,
        help="Seconds for a request's line and headers (from connecting, or from the next"
        " request's first byte); then 408 and the connection is closed.",
    ),
    body_timeout: float = typer.Option(
        DEFAULT_BODY_TIMEOUT,
        min=0.1,
        help="Seconds a request body may take once its headers are in; then closed.",
    ),
    max_slow_connections: int = typer.Option(
        DEFAULT_MAX_SLOW,
        min=1,
        help="Connections that may be sending headers at once; past it the oldest is closed.",
    ),
) -> None:
    """Serve the HTTP API (/v1, OpenAPI at /openapi.json) and the approvals page."""
    import uvicorn

    from toolrelay.api import ApiSettings, create_app
    from toolrelay.api.server import ConnectionLimits, protocol_class

    logs.configure(log_level)
    try:
        db = migrated_database()
        settings = ApiSettings(
            database_url=db.url,
            keyring=_keyring(db),
            egress=EgressPolicy.from_env(),
            jwt_secret=os.environ.get(JWT_SECRET_ENV) or None,
            run_worker=not no_worker,
            worker=WorkerSettings(
                concurrency=concurrency,
                lease_seconds=lease_seconds,
                answer_budget=round(answer_budget_mib * 2**20),
                max_answer=round(max_answer_mib * 2**20),
            ),
        )
        app = create_app(settings)
    except ToolrelayError as exc:
        raise fail(exc) from None
    limits = ConnectionLimits(header_timeout, body_timeout, max_slow_connections)
    heap.settle()  # what startup made stays out of the collector's scans (toolrelay/heap.py)
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=protocol_class(limits),  # h11 with header/body deadlines (docs/api.md, Limits)
        log_level=log_level.lower(),
        log_config=None,  # keep logs.configure's JSON handlers for uvicorn's loggers
        proxy_headers=proxy_headers,
        server_header=False,
    )


def _keyring(db: Database) -> Keyring | None:
    """The master keys; without them credentials cannot be added or used (a warning).
    Keys in use by stored credentials but missing refuse the start (MissingMasterKey)."""
    try:
        return load_keyring(db, embedded=config.database_url_from_env() is None)
    except MissingMasterKey:
        raise
    except ConfigurationError as exc:
        err_console.print(f"warning: {exc.message}", markup=False, highlight=False)
        return None
