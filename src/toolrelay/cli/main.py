"""The `toolrelay` command."""

from __future__ import annotations

import typer

from toolrelay.cli import agents
from toolrelay.cli.agents import agent_app, invocations_app
from toolrelay.cli.context import console, fail
from toolrelay.cli.demo import demo
from toolrelay.cli.prune import prune
from toolrelay.cli.serve import serve
from toolrelay.cli.tokens import token_app
from toolrelay.cli.tools import tool_app
from toolrelay.cli.worker import worker
from toolrelay.db import Database, migrate
from toolrelay.errors import ToolrelayError

app = typer.Typer(
    help="toolrelay: a tool registry and dispatcher for AI agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(tool_app, name="tool")
app.add_typer(agent_app, name="agent")
app.add_typer(invocations_app, name="invocations")
app.add_typer(token_app, name="token")
for command in (agents.assign, agents.revoke, agents.invoke, agents.approve, agents.reject):
    app.command()(command)
app.command()(worker)
app.command()(demo)
app.command()(serve)
app.command()(prune)


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


def _register_optional() -> None:
    """Sub-commands whose modules may import heavier dependencies."""
    try:
        from toolrelay.cli.credentials import credential_app
    except ImportError:  # pragma: no cover - only while the package is being assembled
        return
    app.add_typer(credential_app, name="credential")


_register_optional()

from toolrelay.cli.chaos import chaos  # noqa: E402  (the chaos command, docs/reliability.md)

app.command()(chaos)
