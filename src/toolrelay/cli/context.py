"""What every CLI command needs: the database and who it acts as (the tenant named by
TOOLRELAY_OWNER, or the member signed in with `toolrelay login`)."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import cache
from pathlib import Path

import typer
from rich.console import Console

from toolrelay import config
from toolrelay.db import Database, migrate
from toolrelay.db.errors import unreachable
from toolrelay.db.migrate import check_schema
from toolrelay.errors import ConfigurationError, DatabaseUnavailable, ToolrelayError
from toolrelay.registry import Registry
from toolrelay.tokens import Acting, Authenticator, Caller, Unauthenticated

OWNER_FILE = "owner"
OWNER_ENV = "TOOLRELAY_OWNER"
SESSION_FILE = "session.json"  # `toolrelay login`'s member session (mode 0600)

console = Console()
err_console = Console(stderr=True)


@cache
def database() -> Database:
    """The database. The embedded one, toolrelay's own, is migrated here; one DATABASE_URL
    names is only checked: a command run against the wrong database, or before a deploy's
    `toolrelay migrate`, says so instead of installing or upgrading the schema there."""
    db = Database()
    if config.database_url_from_env() is None:
        migrate(db.url)
    else:
        check_schema(db.url)
    return db


def migrated_database() -> Database:
    """The database, migrated wherever it is: for `serve` and `worker`, deploy steps that
    apply what a new release brings (docs/operations.md, "Upgrading")."""
    db = Database()
    migrate(db.url)
    return db


def owner_id() -> uuid.UUID:
    """TOOLRELAY_OWNER; else the organization of the member signed in with `toolrelay login`;
    on the embedded database only, else the local default owner created once under
    TOOLRELAY_HOME. Against a shared database (DATABASE_URL) the owner is never guessed: a
    lost TOOLRELAY_HOME must not turn the CLI into a brand-new, empty owner."""
    value = os.environ.get(OWNER_ENV, "").strip()
    session = signed_in()
    if value:
        try:
            named = uuid.UUID(value)
        except ValueError:
            raise ConfigurationError(f"{OWNER_ENV} is not a uuid: {value!r}") from None
        if session is not None and session.owner != named:
            raise ConfigurationError(
                f"{OWNER_ENV} names {named}, but you are signed in to {session.owner} as"
                f" {session.name}: unset {OWNER_ENV}, or `toolrelay logout` first"
            )
        return named
    if session is not None:
        return session.owner
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


@dataclass(frozen=True)
class CliSession:
    """A member signed in with `toolrelay login`: their session token and who they are."""

    token: str
    owner: uuid.UUID
    member_id: uuid.UUID
    name: str
    role: str
    expires_at: datetime


def session_path() -> Path:
    return config.home() / SESSION_FILE


def signed_in() -> CliSession | None:
    path = session_path()
    try:
        raw = json.loads(path.read_text("utf-8"))
        return CliSession(
            token=raw["token"],
            owner=uuid.UUID(raw["owner"]),
            member_id=uuid.UUID(raw["member_id"]),
            name=raw["name"],
            role=raw["role"],
            expires_at=datetime.fromisoformat(raw["expires_at"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigurationError(
            f"{path} is not a sign-in this CLI wrote: delete it, or `toolrelay logout`"
        ) from None


def save_session(session: CliSession) -> Path:
    """Write the session readable by this user only (created 0600, then moved in place)."""
    path = session_path()
    temporary = path.with_suffix(".tmp")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    values = asdict(session) | {
        "owner": str(session.owner),
        "member_id": str(session.member_id),
        "expires_at": session.expires_at.isoformat(),
    }
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(values, out)
    os.replace(temporary, path)
    return path


def acting() -> Acting:
    """Who the command acts as: the signed-in member (their session checked now: expired,
    revoked or removed ends it), else the tenant."""
    session = signed_in()
    if session is None:
        return owner_id()
    owner_id()  # refuses a TOOLRELAY_OWNER naming another organization
    try:
        caller = Authenticator(database()).authenticate(session.token)
    except Unauthenticated:
        raise ConfigurationError(
            f"your sign-in as {session.name} has ended (expired, signed out, or no longer a"
            " member): `toolrelay login` again, or `toolrelay logout` to act as the tenant"
        ) from None
    return caller


def registry() -> Registry:
    """The registry as whoever the CLI acts as (acting())."""
    who = acting()
    if isinstance(who, Caller):
        return Registry(database(), who.owner, member_id=who.member_id)
    return Registry(database(), who)


def fail(exc: ToolrelayError) -> typer.Exit:
    """Print one clear line and return the exit to raise: 2 when the database cannot be
    reached (the environment is wrong), 1 for everything refused."""
    if isinstance(exc, DatabaseUnavailable) and exc.reason:
        exc = unreachable(config.database_url_from_env() or "(the embedded database)", exc.reason)
    # One line whatever the message quotes back (a key with a newline in it, say).
    message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in exc.message)
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code=2 if isinstance(exc, DatabaseUnavailable) else 1)
