"""`toolrelay demo`: the end-to-end Postiz demo."""

from __future__ import annotations

import asyncio

import typer

from toolrelay import config
from toolrelay.cli.context import console, fail, migrated_database
from toolrelay.credentials import load_keyring
from toolrelay.errors import ToolrelayError


def demo() -> None:
    """Register RFC-0006's Postiz tool, invoke, approve, dispatch, then the failure cases."""
    from toolrelay.demo.postiz import run_demo

    try:
        db = migrated_database()
        keyring = load_keyring(db, embedded=config.database_url_from_env() is None)
        ok = asyncio.run(run_demo(db, keyring, console))
    except ToolrelayError as exc:
        raise fail(exc) from None
    if not ok:
        console.print("[bold red]demo failed[/]")
        raise typer.Exit(1)
    console.print("[bold green]demo passed[/]")
