"""`toolrelay member ...`: the tenant's people and their roles (docs/approvals.md).

The CLI acts as the tenant itself (TOOLRELAY_OWNER), its first admin: it can add, change and
remove members as long as the tenant's own member row (after the first member, ``owner``)
is an admin.
"""

from __future__ import annotations

from dataclasses import asdict
from uuid import UUID

import typer

from toolrelay.cli.context import acting, database, err_console, fail
from toolrelay.cli.render import MEMBER, Output, detail, listing, output_option
from toolrelay.errors import ToolrelayError
from toolrelay.registry.members import ROLES, Members

member_app = typer.Typer(help="Add, list, change and remove members.", no_args_is_help=True)
ROLE_HELP = f"One of {', '.join(ROLES)}."


@member_app.command()
def add(
    name: str = typer.Argument(..., help="The person's name."),
    role: str = typer.Option(..., "--role", help=ROLE_HELP),
    email: str | None = typer.Option(None, "--email", help="Their email (for sign-in later)."),
) -> None:
    """Add a member; prints their token alone on stdout (shown once: hand it over now)."""
    try:
        member, token = Members(database()).invite(acting(), name, role, email)
    except ToolrelayError as exc:
        raise fail(exc) from None
    err_console.print(f"added member {member.id} ({member.name}, {member.role})",
                      markup=False, highlight=False)  # fmt: skip
    typer.echo(token)


@member_app.command("list")
def list_(
    removed: bool = typer.Option(False, "--removed", help="Include removed members."),
    output: Output = output_option(),
) -> None:
    """List the members and their roles."""
    try:
        members = Members(database()).list(acting(), include_removed=removed)
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(MEMBER, [asdict(m) for m in members],
            ["id", "name", "email", "role", "created_at:added", "removed_at:removed"],
            output)  # fmt: skip


@member_app.command()
def role(
    member: UUID = typer.Argument(..., help="The member's id."),
    new_role: str = typer.Argument(..., metavar="ROLE", help=ROLE_HELP),
    output: Output = output_option(),
) -> None:
    """Change a member's role (one admin always remains)."""
    try:
        changed = Members(database()).set_role(acting(), member, new_role)
    except ToolrelayError as exc:
        raise fail(exc) from None
    detail(MEMBER, asdict(changed), output)


@member_app.command()
def email(
    member: UUID = typer.Argument(..., help="The member's id."),
    address: str = typer.Argument(..., metavar="EMAIL", help="The new email ('' for none)."),
    output: Output = output_option(),
) -> None:
    """Change who signs in as a member: a new email, their sign-in bound anew with it."""
    try:
        changed = Members(database()).change(acting(), member, email=address, set_email=True)
    except ToolrelayError as exc:
        raise fail(exc) from None
    detail(MEMBER, asdict(changed), output)


@member_app.command()
def remove(member: UUID = typer.Argument(..., help="The member's id.")) -> None:
    """Remove a member and revoke their tokens (one admin always remains)."""
    try:
        done = Members(database()).remove(acting(), member)
    except ToolrelayError as exc:
        raise fail(exc) from None
    typer.echo(f"removed member {member}" if done else f"member {member} was removed already")
