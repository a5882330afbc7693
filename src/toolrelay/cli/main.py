"""The `toolrelay` command: one sub-command or group per concern, each in its own module."""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any

import psycopg
import typer
from typer.core import TyperGroup

from toolrelay.cli import agents, login
from toolrelay.cli.agents import agent_app, invocations_app
from toolrelay.cli.audit import audit
from toolrelay.cli.chaos import chaos
from toolrelay.cli.context import console, fail
from toolrelay.cli.credentials import credential_app
from toolrelay.cli.db import db_app
from toolrelay.cli.demo import demo
from toolrelay.cli.interop import export_app, import_app
from toolrelay.cli.mcp import mcp
from toolrelay.cli.members import member_app
from toolrelay.cli.owners import owner_app
from toolrelay.cli.policies import policy_app
from toolrelay.cli.prune import prune
from toolrelay.cli.serve import serve
from toolrelay.cli.tokens import token_app
from toolrelay.cli.tools import tool_app
from toolrelay.cli.webhooks import webhook_app
from toolrelay.cli.worker import worker
from toolrelay.db import Database, migrate
from toolrelay.db.errors import is_connection_error, unstorable_text
from toolrelay.errors import DatabaseUnavailable, ToolrelayError

DEBUG_ENV = "TOOLRELAY_DEBUG"


class _Commands(TyperGroup):
    """The root group: an error raised anywhere below is one line on stderr, never a
    traceback (commands catch what they expect; this catches what they did not)."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except ToolrelayError as exc:
            raise fail(exc) from None
        except psycopg.Error as exc:
            if not is_connection_error(exc):
                raise
            raise fail(DatabaseUnavailable("the database is unavailable", str(exc))) from None
        except (typer.Exit, typer.Abort, typer.TyperException):  # click's own handling
            raise
        except UnicodeEncodeError as exc:  # an argument's bytes were not UTF-8
            said = unstorable_text(exc)
            if not isinstance(said, ToolrelayError) or os.environ.get(DEBUG_ENV):
                raise
            raise fail(said) from None
        except Exception as exc:
            if os.environ.get(DEBUG_ENV):
                raise
            # A bug, not a mistake of the user's: still one line, with how to see more.
            message = f"unexpected error (a bug): {type(exc).__name__}: {exc}"[:500]
            raise fail(ToolrelayError(f"{message}; {DEBUG_ENV}=1 shows the traceback")) from None


app = typer.Typer(
    cls=_Commands,
    help="toolrelay: a tool registry and dispatcher for AI agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"toolrelay {metadata.version('toolrelay')}")
        except metadata.PackageNotFoundError:
            typer.echo("toolrelay (version unknown: the package is not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    pass


for name, group in (
    ("tool", tool_app),
    ("agent", agent_app),
    ("credential", credential_app),
    ("invocations", invocations_app),
    ("token", token_app),
    ("export", export_app),
    ("import", import_app),
    ("owner", owner_app),
    ("member", member_app),
    ("policy", policy_app),
    ("db", db_app),
    ("webhook", webhook_app),
):
    app.add_typer(group, name=name)
for command in (
    agents.assign,
    agents.revoke,
    agents.invoke,
    agents.approve,
    agents.reject,
    worker,
    serve,
    mcp,
    demo,
    prune,
    chaos,
    audit,
    login.login,
    login.logout,
    login.whoami,
):
    app.command()(command)


@app.command("migrate")
def migrate_() -> None:
    """Apply all migrations (idempotent, under an advisory lock)."""
    try:
        applied = migrate(Database().url)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(
        f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "")
    )
