"""`toolrelay token ...`: bearer tokens for the HTTP API (and MCP), for owners or agents."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from uuid import UUID

import typer

from toolrelay.cli.context import acting, console, database, fail, registry
from toolrelay.cli.render import TOKEN, Output, listing, output_option
from toolrelay.errors import InvalidArgument, ToolrelayError
from toolrelay.tokens import TokenStore

token_app = typer.Typer(help="Make, list and revoke API tokens.", no_args_is_help=True)


@token_app.command()
def create(
    owner: bool = typer.Option(False, "--owner", help="A token that acts as you, the owner."),
    agent: str | None = typer.Option(None, "--agent", help="A token for this agent (name or id)."),
    member: UUID | None = typer.Option(None, "--member", help="A token for this member (id)."),
    name: str | None = typer.Option(None, "--name", help="A label to recognise it by."),
    expires_days: float | None = typer.Option(
        None, "--expires-days", min=0.001, help="Expire after this many days (default: never)."
    ),
) -> None:
    """Make a token; prints it alone on stdout. Only its hash is stored: keep it now."""
    try:
        if [owner, agent is not None, member is not None].count(True) != 1:
            raise InvalidArgument("give exactly one of --owner, --agent ID and --member ID")
        me = acting()
        agent_id = registry().get_agent(agent)["id"] if agent else None
        expires = datetime.now(UTC) + timedelta(days=expires_days) if expires_days else None
        _, token = TokenStore(database()).create(me, agent_id, name, expires, member_id=member)
    except ToolrelayError as exc:
        raise fail(exc) from None
    typer.echo(token)


@token_app.command("list")
def list_(output: Output = output_option()) -> None:
    """List your tokens (never the tokens themselves), with the agent each acts as."""
    try:
        me = acting()
        infos = TokenStore(database()).list(me)
        names = {a["id"]: a["name"] for a in registry().list_agents()}
    except ToolrelayError as exc:
        raise fail(exc) from None
    rows = [
        {**asdict(info), "kind": info.kind, "agent_name": names.get(info.agent_id)}
        for info in infos
    ]
    listing(
        TOKEN,
        rows,
        ["id", "kind", "agent_name:agent", "name", "created_at:created",
         "last_used_at:last used", "expires_at:expires", "revoked_at:revoked"],
        output,
    )  # fmt: skip


@token_app.command()
def revoke(token_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Revoke a token at once."""
    try:
        try:
            ident = UUID(token_id)
        except ValueError:
            raise InvalidArgument(f"not a token id (uuid): {token_id!r}") from None
        done = TokenStore(database()).revoke(acting(), ident)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"revoked {ident}" if done else f"{ident} was already revoked", markup=False)
