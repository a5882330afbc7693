"""Map PostgreSQL errors raised by our functions and constraints to toolrelay errors."""

from __future__ import annotations

import re

import psycopg
from psycopg import conninfo

from toolrelay import errors

# Connection exceptions, and the server going away under us: the database, not the request.
_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")

_BY_SQLSTATE: dict[str, type[errors.ToolrelayError]] = {
    "42501": errors.PermissionDenied,
    "P0002": errors.NotFound,
    "TR001": errors.ToolInactive,
    "TR002": errors.NotAssigned,
    "TR003": errors.InvalidState,
    "TR004": errors.ApprovalExpired,
    "TR005": errors.NoEndpoint,
}


def translate_db_error(exc: psycopg.Error) -> errors.ToolrelayError:
    """One clear toolrelay error for a database error, naming the constraint when there is one."""
    if is_connection_error(exc):
        return errors.DatabaseUnavailable("the database is unavailable; retry later", str(exc))
    diag = exc.diag
    state = exc.sqlstate or ""
    message = diag.message_primary or str(exc).strip()
    if state in _BY_SQLSTATE:
        return _BY_SQLSTATE[state](message)
    if state == "42501" or isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return errors.PermissionDenied(message)
    if state.startswith("23"):
        constraint = diag.constraint_name
        where = f" (constraint {constraint})" if constraint else ""
        if state == "23505":
            return errors.Conflict(f"already exists: {diag.message_detail or message}{where}")
        return errors.InvalidArgument(f"{message}{where}")
    if state.startswith("22") or state == "42804":  # bad value, or a value of the wrong type
        return errors.InvalidArgument(message)
    if not state and isinstance(exc, psycopg.ProgrammingError | psycopg.DataError):  # unadaptable
        return errors.InvalidArgument(f"invalid value: {message}")
    return errors.ToolrelayError(message)


def is_connection_error(exc: BaseException) -> bool:
    """Down, refused, timed out waiting for a pooled connection, or shut down mid-way."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate or ""
    return not state or state.startswith(_CONNECTION_STATES)


def mask_url(url: str) -> str:
    """A libpq URL or keyword string with any password replaced by ``***``."""
    masked = re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", url)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", masked)


def where(url: str) -> str:
    """HOST:PORT (or the socket directory) a URL points at, for messages."""
    try:
        params = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "an unparsable address"
    host = str(params.get("host") or params.get("hostaddr") or "the local socket")
    port = str(params.get("port") or "5432")
    return f"{host}:{port}" if not host.startswith("/") else f"{host} (socket, port {port})"


def unreachable(url: str, reason: str) -> errors.DatabaseUnavailable:
    """One line a person can act on: where, why, and the URL with its password hidden."""
    first = next((line for line in reason.splitlines() if line.strip()), reason).strip()
    why = first.rsplit("failed: ", 1)[-1].removeprefix("connection is bad: ")
    why = why[:1].lower() + why[1:]
    if "couldn't get a connection after" in first:
        why = f"timed out ({why})"
    return errors.DatabaseUnavailable(
        f"cannot reach the database at {where(url)}: {why} — is PostgreSQL running?"
        f" (DATABASE_URL={mask_url(url)}, password hidden)",
        reason,
    )


def check_url(url: str, source: str = "DATABASE_URL") -> None:
    """A connection string libpq can parse, or one clear error (never a traceback)."""
    try:
        conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise errors.DatabaseUnavailable(
            f"{source} is not a valid PostgreSQL connection string: {exc}"
            f" ({source}={mask_url(url)}, password hidden)"
        ) from None
