"""`toolrelay agent ...`, `assign`, `revoke`, `invoke`, `approve`, `reject`, `invocations ...`."""

from __future__ import annotations

import typer

from toolrelay.cli.context import console, fail
from toolrelay.cli.render import show, table
from toolrelay.cli.tools import parse_json, registry
from toolrelay.errors import ToolrelayError

agent_app = typer.Typer(help="Create and list agents.", no_args_is_help=True)
invocations_app = typer.Typer(help="List and show invocations.", no_args_is_help=True)


@agent_app.command("create")
def agent_create(name: str) -> None:
    """Create an agent; prints its id."""
    try:
        console.print(str(registry().create_agent(name)), markup=False, highlight=False)
    except ToolrelayError as exc:
        raise fail(exc) from None


@agent_app.command("list")
def agent_list() -> None:
    table(registry().list_agents(), ["id", "name", "status", "created_at"])


def assign(
    agent: str, tool: str, deny: bool = typer.Option(False, help="Assign as denied.")
) -> None:
    """Let AGENT (name or id) call TOOL (key or id)."""
    try:
        registry().assign(agent, tool, allowed=not deny)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"{'denied' if deny else 'assigned'} {tool} to {agent}", markup=False)


def revoke(agent: str, tool: str) -> None:
    """Remove an assignment; invocations not yet sent will not be sent."""
    try:
        removed = registry().revoke(agent, tool)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print("revoked" if removed else "was not assigned", markup=False)


def invoke(
    agent: str,
    tool: str,
    input: str = typer.Option("{}", "--input", "-i", help="JSON object (or @file)."),
) -> None:
    """Invoke TOOL as AGENT; prints the invocation id."""
    try:
        inv_id = registry().invoke(agent, tool, parse_json("input", input))
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(str(inv_id), markup=False, highlight=False)


def approve(
    invocation_id: str,
    digest: str | None = typer.Option(
        None, "--digest", help="Approve only if the request still has this digest."
    ),
) -> None:
    """Approve a pending invocation (a human owner only), bound to the request it renders."""
    try:
        registry().approve(invocation_id, digest)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"approved {invocation_id}", markup=False)


def reject(invocation_id: str, reason: str | None = typer.Option(None, "--reason")) -> None:
    """Reject a pending invocation."""
    try:
        registry().reject(invocation_id, reason)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"rejected {invocation_id}", markup=False)


@invocations_app.command("list")
def invocations_list(
    status: str | None = typer.Option(None, help="Only this status."),
    limit: int = 50,
) -> None:
    reg = registry()
    reg.expire_pending()
    rows = reg.list_invocations(status=status, limit=limit)
    table(
        rows,
        ["id", "tool_key", "agent_name", "status", "approval_status", "error_code", "created_at"],
    )


@invocations_app.command("show")
def invocations_show(invocation_id: str) -> None:
    """One invocation with its attempt history."""
    try:
        show(registry().get_invocation(invocation_id))
    except ToolrelayError as exc:
        raise fail(exc) from None
