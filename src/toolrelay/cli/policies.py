"""`toolrelay policy ...`: rules that approve or reject the obvious calls (docs/approvals.md)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any
from uuid import UUID

import typer

from toolrelay.cli.context import acting, database, fail
from toolrelay.cli.render import POLICY, Output, detail, listing, output_option
from toolrelay.errors import InvalidArgument, ToolrelayError
from toolrelay.registry.policies import Policies

policy_app = typer.Typer(
    help="Rules that approve or reject a call waiting for approval by its input.",
    no_args_is_help=True,
)
SCHEMA_HELP = "a JSON Schema the input must match: JSON text, or @FILE"


def _schema(text: str) -> dict[str, Any]:
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InvalidArgument(f"the schema is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgument("the schema must be a JSON object")
    return value


@policy_app.command()
def add(
    tool: str = typer.Argument(..., help="The tool's key or id."),
    name: str = typer.Argument(..., help="The rule's name, shown in the call's history."),
    approve_if: str | None = typer.Option(None, "--approve-if", help=f"Approve: {SCHEMA_HELP}."),
    reject_if: str | None = typer.Option(None, "--reject-if", help=f"Reject: {SCHEMA_HELP}."),
    output: Output = output_option(),
) -> None:
    """Add a rule to a tool (an admin). Rejection rules are checked first."""
    try:
        if (approve_if is None) == (reject_if is None):
            raise InvalidArgument("give exactly one of --approve-if and --reject-if")
        action, text = ("approve", approve_if) if approve_if is not None else ("reject", reject_if)
        assert text is not None
        made = Policies(database()).add(acting(), tool, name, action, _schema(text))
    except (ToolrelayError, OSError) as exc:
        raise fail(exc if isinstance(exc, ToolrelayError) else InvalidArgument(str(exc))) from None
    detail(POLICY, asdict(made), output)


@policy_app.command("list")
def list_(
    tool: str | None = typer.Argument(None, help="Only this tool's rules."),
    output: Output = output_option(),
) -> None:
    """List the rules."""
    try:
        found = Policies(database()).list(acting(), tool)
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(POLICY, [asdict(p) for p in found],
            ["id", "tool_key:tool", "name", "action", "in_force", "confirmations",
             "confirmations_needed:needed", "current", "created_at:added"],
            output)  # fmt: skip


@policy_app.command()
def confirm(
    policy: UUID = typer.Argument(..., help="The rule's id."),
    output: Output = output_option(),
) -> None:
    """Confirm a rule for its tool as it is now (an admin). An approval rule stops deciding
    when its tool's request changes (endpoint, method, template, credential...) until
    confirmed, and decides only once as many admins confirmed it as the tool's calls need
    approvers (two for a dangerous tool in a team)."""
    try:
        confirmed = Policies(database()).confirm(acting(), policy)
    except ToolrelayError as exc:
        raise fail(exc) from None
    detail(POLICY, asdict(confirmed), output)


@policy_app.command()
def remove(policy: UUID = typer.Argument(..., help="The rule's id.")) -> None:
    """Remove a rule (an admin)."""
    try:
        Policies(database()).remove(acting(), policy)
    except ToolrelayError as exc:
        raise fail(exc) from None
    typer.echo(f"removed policy {policy}")
