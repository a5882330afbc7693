"""What every CLI command needs: the database and the owner it acts as."""

from __future__ import annotations

import os
import uuid
from functools import cache
from pathlib import Path

import typer
from rich.console import Console

from toolrelay import config
from toolrelay.db import Database, migrate
from toolrelay.db.errors import unreachable
from toolrelay.errors import ConfigurationError, DatabaseUnavailable, ToolrelayError

OWNER_FILE = "owner"
OWNER_ENV = "TOOLRELAY_OWNER"

console = Console()
err_console = Console(stderr=True)


@cache
def database() -> Database:
    """The database, migrated (migrations are idempotent and cheap when up to date)."""
    db = Database()
    migrate(db.url)
    return db


def owner_id() -> uuid.UUID:
    """TOOLRELAY_OWNER; on the embedded database only, else the local default owner created
    once under TOOLRELAY_HOME. Against a shared database (DATABASE_URL) the owner is never
    guessed: a lost TOOLRELAY_HOME must not turn the CLI into a brand-new, empty owner."""
    value = os.environ.get(OWNER_ENV, "").strip()
    if value:
        try:
            return uuid.UUID(value)
        except ValueError:
            raise ConfigurationError(f"{OWNER_ENV} is not a uuid: {value!r}") from None
    path = config.home() / OWNER_FILE
    if config.database_url_from_env() is not None:
        raise ConfigurationError(_no_owner_message(path))
    if path.exists():
        return uuid.UUID(path.read_text().strip())
    new = uuid.uuid4()
    path.write_text(f"{new}\n")
    return new


def _no_owner_message(path: Path) -> str:
    message = (
        f"no owner chosen: with DATABASE_URL set the CLI acts only as an owner you name; set"
        f" {OWNER_ENV} to your owner uuid (`toolrelay owner list` shows the owners in this"
        " database, `toolrelay owner create` prints a new one)"
    )
    if path.exists():
        known = path.read_text().strip()
        message += f"; {path} names {known}: export {OWNER_ENV}={known} to keep acting as it"
    return message


def fail(exc: ToolrelayError) -> typer.Exit:
    """Print one clear line and return the exit to raise: 2 when the database cannot be
    reached (the environment is wrong), 1 for everything refused."""
    if isinstance(exc, DatabaseUnavailable) and exc.reason:
        exc = unreachable(config.database_url_from_env() or "(the embedded database)", exc.reason)
    # One line whatever the message quotes back (a key with a newline in it, say).
    message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in exc.message)
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code=2 if isinstance(exc, DatabaseUnavailable) else 1)
