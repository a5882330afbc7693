"""`toolrelay owner`: who the CLI acts as, and which owners a database holds."""

from __future__ import annotations

import os
import uuid

import typer

from toolrelay import config
from toolrelay.cli.context import OWNER_ENV, database, fail, owner_id
from toolrelay.cli.render import OWNER, Output, listing, output_option
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
def list_(output: Output = output_option()) -> None:
    """The owners this database holds, with how many tools, agents and credentials each has."""
    try:
        with database().as_dispatcher() as conn:
            rows = conn.execute(_OWNERS).fetchall()
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(OWNER, rows, ["owner", "tools", "agents", "credentials"], output)


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
