"""`toolrelay prune`: retention of finished invocations."""

from __future__ import annotations

import typer

from toolrelay.cli.context import console, database, fail
from toolrelay.dispatch.retention import prune as prune_history
from toolrelay.errors import ToolrelayError


def prune(
    older_than: str = typer.Option(..., help="A duration: 30d, 12h, '2 weeks'."),
) -> None:
    """Delete finished invocations (and their attempts) older than the given duration."""
    try:
        count = prune_history(database(), older_than)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"pruned {count} invocation(s)", markup=False)
