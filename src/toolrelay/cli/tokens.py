"""`toolrelay token ...`: bearer tokens for the HTTP API (and MCP), for owners or agents."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import typer
from rich.table import Table

from toolrelay.cli.context import console, database, fail, owner_id
from toolrelay.errors import InvalidArgument, ToolrelayError
from toolrelay.registry import Registry
from toolrelay.tokens import TokenInfo, TokenStore

token_app = typer.Typer(help="Make, list and revoke API tokens.", no_args_is_help=True)


@token_app.command()
def create(
    owner: bool = typer.Option(False, "--owner", help="A token that acts as you, the owner."),
    agent: str | None = typer.Option(None, "--agent", help="A token for this agent (name or id)."),
    name: str | None = typer.Option(None, "--name", help="A label to recognise it by."),
    expires_days: float | None = typer.Option(
        None, "--expires-days", min=0.001, help="Expire after this many days (default: never)."
    ),
) -> None:
    """Make a token; prints it alone on stdout. Only its hash is stored: keep it now."""
    try:
        if owner == (agent is not None):
            raise InvalidArgument("give exactly one of --owner and --agent ID")
        me = owner_id()
        agent_id = Registry(database(), me).get_agent(agent)["id"] if agent else None
        expires = datetime.now(UTC) + timedelta(days=expires_days) if expires_days else None
        _, token = TokenStore(database()).create(me, agent_id, name, expires)
    except ToolrelayError as exc:
        raise fail(exc) from None
    typer.echo(token)


@token_app.command("list")
def list_() -> None:
    """List your tokens (never the tokens themselves)."""
    try:
        infos = TokenStore(database()).list(owner_id())
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(_table(infos))


@token_app.command()
def revoke(token_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Revoke a token at once."""
    try:
        try:
            ident = UUID(token_id)
        except ValueError:
            raise InvalidArgument(f"not a token id (uuid): {token_id!r}") from None
        done = TokenStore(database()).revoke(owner_id(), ident)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"revoked {ident}" if done else f"{ident} was already revoked", markup=False)


def _table(infos: list[TokenInfo]) -> Table:
    table = Table("id", "kind", "agent", "name", "created", "last used", "expires", "revoked")
    for info in infos:
        table.add_row(
            str(info.id),
            info.kind,
            str(info.agent_id or "-"),
            info.name or "-",
            _when(info.created_at),
            _when(info.last_used_at),
            _when(info.expires_at),
            _when(info.revoked_at),
        )
    return table


def _when(value: datetime | None) -> str:
    return f"{value:%Y-%m-%d %H:%M}" if value else "-"
