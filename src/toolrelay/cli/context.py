"""What every CLI command needs: the database and the owner it acts as."""

from __future__ import annotations

import os
import uuid
from functools import cache

import typer
from rich.console import Console

from toolrelay import config
from toolrelay.db import Database, migrate
from toolrelay.errors import ConfigurationError, ToolrelayError

OWNER_FILE = "owner"

console = Console()
err_console = Console(stderr=True)


@cache
def database() -> Database:
    """The database, migrated (migrations are idempotent and cheap when up to date)."""
    db = Database()
    migrate(db.url)
    return db


def owner_id() -> uuid.UUID:
    """TOOLRELAY_OWNER, else the local default owner created once under TOOLRELAY_HOME."""
    value = os.environ.get("TOOLRELAY_OWNER", "").strip()
    if value:
        try:
            return uuid.UUID(value)
        except ValueError:
            raise ConfigurationError(f"TOOLRELAY_OWNER is not a uuid: {value!r}") from None
    path = config.home() / OWNER_FILE
    if path.exists():
        return uuid.UUID(path.read_text().strip())
    new = uuid.uuid4()
    path.write_text(f"{new}\n")
    return new


def fail(exc: ToolrelayError) -> typer.Exit:
    """Print one clear line and return the exit to raise."""
    err_console.print(f"error: {exc.message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code=1)
