"""`toolrelay db status|stop|url`: which database the CLI uses, whether it runs, how to reach it.

Without DATABASE_URL every command starts the embedded PostgreSQL (the pgserver wheel) under
TOOLRELAY_HOME/pgdata and leaves it running, so that the next command starts in milliseconds;
`db stop` stops it, and the next command starts it again.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import subprocess
import warnings
from pathlib import Path
from typing import Any

import psycopg
import typer

from toolrelay import config
from toolrelay.cli import context
from toolrelay.cli.context import console, err_console, fail
from toolrelay.cli.render import DB_STATUS, Output, detail, output_option
from toolrelay.db.embedded import EMBEDDED_DATABASE, embedded_url
from toolrelay.db.errors import mask_url, unreachable, where
from toolrelay.errors import ConfigurationError, ToolrelayError

DB_STATUS_FIELDS = [f.name for f in DB_STATUS.fields]
PGDATA = "pgdata"  # toolrelay.db.embedded runs the server on TOOLRELAY_HOME/pgdata
CONNECT_TIMEOUT = 3  # seconds `db status` waits for a server
STOP_TIMEOUT = 60  # seconds pg_ctl waits for the server to shut down

db_app = typer.Typer(
    help="The database: embedded or external, running or not, its URL for psql; stop the"
    " embedded one.",
    no_args_is_help=True,
)

_FACTS = """
SELECT current_setting('server_version') AS version,
       pg_postmaster_start_time() AS started_at,
       pg_database_size(current_database()) AS size_bytes,
       (SELECT count(*) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()) AS others
"""


def data_dir() -> Path:
    return (config.home() / PGDATA).resolve()


def psql_url(url: str) -> str:
    """pgserver's URL without its empty password (``postgres:@`` -> ``postgres@``)."""
    return url.replace("://postgres:@", "://postgres@", 1)


def _postmaster(pgdata: Path) -> Any | None:
    """pgserver's view of postmaster.pid when the server it names runs, else None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (AssertionError, ValueError, OSError):  # being written, or not ours to read
        return None
    return info if info is not None and info.is_running() else None


def _facts(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
        row = conn.execute(_FACTS).fetchone()
    assert row is not None
    return dict(zip(("version", "started_at", "size_bytes", "others"), row, strict=True))


def _dir_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a temporary file gone meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _status() -> dict[str, Any]:
    url = config.database_url_from_env()
    return _external_status(url) if url is not None else _embedded_status()


def _external_status(url: str) -> dict[str, Any]:
    status: dict[str, Any] = dict.fromkeys(DB_STATUS_FIELDS)
    status |= {"kind": "external", "running": False, "url": mask_url(url)}
    try:
        facts = _facts(url)
    except psycopg.Error as exc:
        return status | {"error": unreachable(url, str(exc)).message}
    return status | {
        "running": True,
        "version": facts["version"],
        "size_bytes": facts["size_bytes"],  # the database's (the server's files are not ours)
        "started_at": facts["started_at"],
    }


def _embedded_status() -> dict[str, Any]:
    pgdata = data_dir()
    version_file = pgdata / "PG_VERSION"
    status: dict[str, Any] = dict.fromkeys(DB_STATUS_FIELDS)
    status |= {
        "kind": "embedded",
        "running": False,
        "data_dir": str(pgdata),
        "version": version_file.read_text().strip() if version_file.exists() else None,
        "size_bytes": _dir_size(pgdata) if pgdata.exists() else None,  # all of it, on disk
    }
    info = _postmaster(pgdata)
    if info is None:
        return status
    url = psql_url(info.get_uri(database=EMBEDDED_DATABASE))
    status |= {"running": True, "pid": info.pid, "url": url}
    try:
        facts = _facts(url)
    except psycopg.Error as exc:
        return status | {"error": f"running, but not answering: {str(exc).strip()}"}
    return status | {"version": facts["version"], "started_at": facts["started_at"]}


@db_app.command()
def status(output: Output = output_option()) -> None:
    """Which database the CLI uses and whether it runs (this never starts one)."""
    detail(DB_STATUS, _status(), output)


@db_app.command()
def url() -> None:
    """The URL to give psql: `psql "$(toolrelay db url)"`. Starts the embedded server if it
    is stopped; for DATABASE_URL, prints it with the password hidden."""
    external = config.database_url_from_env()
    if external is not None:
        masked = mask_url(external)
        typer.echo(masked)
        if masked != external:
            err_console.print(
                "(password hidden: give it to psql with PGPASSWORD or ~/.pgpass)", highlight=False
            )
        return
    try:
        typer.echo(psql_url(embedded_url(config.home())))
    except (OSError, subprocess.SubprocessError, psycopg.Error) as exc:
        raise fail(_cannot_start(exc)) from None


@db_app.command()
def stop() -> None:
    """Stop the embedded PostgreSQL cleanly (connected workers lose their connections); the
    next command starts it again. An external database (DATABASE_URL) is never stopped."""
    external = config.database_url_from_env()
    if external is not None:
        raise fail(
            ConfigurationError(
                f"DATABASE_URL is set: the database at {where(external)} is not toolrelay's"
                " embedded one, and toolrelay does not stop it (stop it with its own tools,"
                " or unset DATABASE_URL to act on the embedded one)"
            )
        )
    pgdata = data_dir()
    info = _postmaster(pgdata)
    if info is None:
        console.print(f"the embedded database in {pgdata} is not running", markup=False)
        return
    others = 0
    with contextlib.suppress(psycopg.Error):
        others = int(_facts(psql_url(info.get_uri(database=EMBEDDED_DATABASE)))["others"])
    _close_own_connections()
    try:
        _pg_ctl_stop(pgdata)
    except ToolrelayError as exc:
        raise fail(exc) from None
    _forget_handle(pgdata)
    closed = f" ({others} other connection(s) closed)" if others else ""
    console.print(f"stopped the embedded database in {pgdata}{closed}", markup=False)


def _pg_ctl_stop(pgdata: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH

    # pg_ctl refuses to run as root: as root, act as the user that owns the data (and runs
    # the server), as pgserver does.
    user = pwd.getpwuid(pgdata.stat().st_uid).pw_name if os.geteuid() == 0 else None
    pg_ctl = str(POSTGRES_BIN_PATH / "pg_ctl")
    command = [pg_ctl, "stop", "-D", str(pgdata), "-m", "fast", "-w", "-t", str(STOP_TIMEOUT)]
    try:
        done = subprocess.run(
            command, user=user, capture_output=True, text=True, timeout=STOP_TIMEOUT + 10
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigurationError(f"cannot stop the embedded database in {pgdata}: {exc}") from None
    if done.returncode != 0 and _postmaster(pgdata) is not None:
        why = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise ConfigurationError(f"cannot stop the embedded database in {pgdata}: {why[-1]}")


def _close_own_connections() -> None:
    """This process's pool, if a command before this one opened it (the same process)."""
    if context.database.cache_info().currsize:
        context.database().close()
        context.database.cache_clear()


def _forget_handle(pgdata: Path) -> None:
    """pgserver keeps one handle per data directory per process and would hand the stopped
    server's URL to the next command run in this process: drop it (as its own exit handler
    does, which with toolrelay's cleanup_mode=None never stops anything)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import PostgresServer

    server = PostgresServer._instances.get(pgdata)
    if server is None:
        return
    atexit.unregister(server._cleanup)
    server._cleanup()
    PostgresServer._instances.pop(pgdata, None)


def _cannot_start(exc: BaseException) -> ConfigurationError:
    log = data_dir() / "log"
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return ConfigurationError(
        f"cannot start the embedded database in {data_dir()}: {first.strip()} (its log: {log})"
    )
