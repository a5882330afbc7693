"""`toolrelay agent ...`, `assign`, `revoke`, `invoke`, `approve`, `reject`, `invocations ...`."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum

import typer

from toolrelay.cli.context import acting, console, database, err_console, fail, registry
from toolrelay.cli.render import (
    AGENT,
    INVOCATION,
    INVOCATION_DETAIL,
    Output,
    detail,
    listing,
    output_option,
)
from toolrelay.cli.tools import parse_json
from toolrelay.errors import InvalidArgument, ToolrelayError
from toolrelay.mcp.oauth import OAuthBindings, authorization_servers
from toolrelay.registry.pages import invocation_page

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
def agent_list(output: Output = output_option()) -> None:
    """List your agents."""
    try:
        rows = registry().list_agents()
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(AGENT, rows, ["id", "name", "status", "created_at:created"], output)


@agent_app.command("oauth")
def agent_oauth(
    agent: str,
    issuer: str | None = typer.Option(
        None, help="The authorization server, exactly as its tokens' iss says it."
    ),
    subject: str | None = typer.Option(None, help="The identity there: its tokens' sub."),
    unbind: bool = typer.Option(False, "--unbind", help="Remove the binding."),
) -> None:
    """Let access tokens for SUBJECT at ISSUER (one of TOOLRELAY_MCP_AUTHORIZATION_SERVERS)
    act as AGENT (name or id) over MCP; an identity acts as one agent only. Without options,
    shows the binding."""
    try:
        if unbind and (issuer is not None or subject is not None):
            raise InvalidArgument("--unbind takes no --issuer or --subject")
        if (issuer is None) != (subject is None):
            raise InvalidArgument("give both --issuer and --subject (or --unbind)")
        who = acting()
        agent_id = registry().get_agent(agent)["id"]
        bindings = OAuthBindings(database())
        if unbind:
            said = (
                f"unbound {agent}" if bindings.unbind(who, agent_id) else f"{agent} was not bound"
            )
        elif issuer is None or subject is None:
            bound_issuer, bound_subject = bindings.get(who, agent_id)
            said = (f"{agent} is not bound to an OAuth identity" if bound_issuer is None
                    else f"{agent}: {bound_subject} at {bound_issuer}")  # fmt: skip
        else:
            bindings.bind(who, agent_id, issuer, subject)
            said = f"bound {agent} to {subject} at {issuer}"
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(said, markup=False, highlight=False)
    if issuer is None:
        return
    try:
        configured = authorization_servers()
    except ToolrelayError:
        configured = []
    if issuer not in configured:
        err_console.print(
            f"note: {issuer} is not in TOOLRELAY_MCP_AUTHORIZATION_SERVERS here; `toolrelay"
            " serve` accepts tokens only from the servers it lists",
            markup=False,
            highlight=False,
        )


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


@invocations_app.command("retry")
def invocations_retry(invocation_id: str) -> None:
    """Make a failed, rejected or expired call again (a human owner only): a new invocation
    with the same input, linked to the first, gated again if its tool is gated now. Prints
    the new invocation's id."""
    try:
        new_id = registry().retry(invocation_id)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(str(new_id), markup=False, highlight=False)


class InvocationStatus(StrEnum):
    pending = "pending"
    running = "running"
    completed = "completed"
    failed = "failed"
    rejected = "rejected"
    expired = "expired"


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """A time (ISO 8601; without a zone, UTC) or a duration back from now (90s, 15m, 12h, 7d,
    2w)."""
    text = value.strip()
    message = (
        "--since must be a time (ISO 8601, e.g. 2026-12-01T09:00:00Z) or a duration back from"
        f" now (e.g. 15m, 12h, 7d): {value!r}"
    )
    duration = _DURATION.fullmatch(text)
    try:
        if duration:
            amount, unit = duration.groups()
            return (now or datetime.now(UTC)) - timedelta(**{_UNITS[unit]: float(amount)})
        when = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        raise InvalidArgument(message) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@invocations_app.command("list")
def invocations_list(
    status: InvocationStatus | None = typer.Option(None, help="Only this status."),
    tool: str | None = typer.Option(None, help="Only this tool (key or id)."),
    agent: str | None = typer.Option(None, help="Only this agent (name or id)."),
    since: str | None = typer.Option(
        None, help="Only those created since: a time (ISO 8601, UTC) or a duration (15m, 7d)."
    ),
    limit: int = typer.Option(50, min=1, max=200, help="At most this many (a page)."),
    cursor: str | None = typer.Option(None, help="The next page: the cursor the last one gave."),
    output: Output = output_option(),
) -> None:
    """Invocations, newest first, a page at a time (the next page's --cursor goes to stderr,
    or next_cursor in --output json)."""
    try:
        after = parse_since(since) if since is not None else None
        reg = registry()
        reg.expire_pending()
        rows, next_cursor = invocation_page(
            reg,
            limit,
            cursor=cursor,
            status=status.value if status else None,
            tool=tool,
            agent=agent,
            since=after,
        )
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(
        INVOCATION,
        rows,
        ["id", "tool_key:tool", "agent_name:agent", "status", "approval_status:approval",
         "error_code:error", "created_at:created"],
        output,
        paged=True,
        next_cursor=next_cursor,
    )  # fmt: skip


@invocations_app.command("show")
def invocations_show(invocation_id: str, output: Output = output_option(Output.json)) -> None:
    """One invocation with its attempt history."""
    try:
        detail(INVOCATION_DETAIL, registry().get_invocation(invocation_id), output)
    except ToolrelayError as exc:
        raise fail(exc) from None
