"""`toolrelay prune`: retention of finished invocations."""

from __future__ import annotations

import typer

from toolrelay.cli.context import console, database, fail
from toolrelay.dispatch.retention import prune as prune_history
from toolrelay.errors import ToolrelayError


def prune(
    older_than: str = typer.Option(
        ..., help="A duration, every number with its unit: 30d, 12h, 6mon, '2 weeks'."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; delete nothing."),
) -> None:
    """Delete every owner's finished invocations (and attempts) older than a duration."""
    try:
        pruned = prune_history(database(), older_than, dry_run=dry_run)
    except ToolrelayError as exc:
        raise fail(exc) from None
    cutoff = pruned.cutoff.isoformat(timespec="seconds")
    verb = "would prune" if pruned.dry_run else "pruned"
    console.print(f"{verb} {pruned.count} invocation(s) finished before {cutoff}", markup=False)
