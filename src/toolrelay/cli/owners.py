"""`toolrelay owner`: who the CLI acts as, and which owners a database holds."""

from __future__ import annotations

import os
import uuid

import typer
from rich.table import Table

from toolrelay import config
from toolrelay.cli.context import OWNER_ENV, console, database, fail, owner_id
from toolrelay.errors import ToolrelayError

owner_app = typer.Typer(
    help="Owners (tenants): who the CLI acts as, and which owners this database holds.",
    no_args_is_help=True,
)

# Every table that carries an owner; an owner exists as soon as one row names it.
_OWNERS = """
SELECT owner,
       count(*) FILTER (WHERE what = 'tool') AS tools,
       count(*) FILTER (WHERE what = 'agent') AS agents,
       count(*) FILTER (WHERE what = 'credential') AS credentials
  FROM (SELECT owner, 'tool' AS what FROM agents.tools_registry
        UNION ALL SELECT owner, 'agent' FROM agents.agents
        UNION ALL SELECT owner, 'credential' FROM agents.credentials) o
 GROUP BY owner ORDER BY owner
"""


@owner_app.command("list")
def list_() -> None:
    """The owners this database holds, with how many tools, agents and credentials each has."""
    try:
        with database().as_dispatcher() as conn:
            rows = conn.execute(_OWNERS).fetchall()
    except ToolrelayError as exc:
        raise fail(exc) from None
    out = Table("owner", "tools", "agents", "credentials")
    for row in rows:
        out.add_row(str(row["owner"]), str(row["tools"]), str(row["agents"]),
                    str(row["credentials"]))  # fmt: skip
    console.print(out, soft_wrap=True)


@owner_app.command()
def create() -> None:
    """Print a new owner uuid (nothing is written until you act as it)."""
    typer.echo(str(uuid.uuid4()))


@owner_app.command()
def show() -> None:
    """The owner the CLI acts as now, and where that choice comes from."""
    try:
        me = owner_id()
    except ToolrelayError as exc:
        raise fail(exc) from None
    source = OWNER_ENV if os.environ.get(OWNER_ENV, "").strip() else "the local owner file"
    typer.echo(f"{me}\t{source}" if source == OWNER_ENV else f"{me}\t{source} in {config.home()}")
