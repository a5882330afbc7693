"""Map PostgreSQL errors raised by our functions and constraints to toolrelay errors."""

from __future__ import annotations

import psycopg

from toolrelay import errors

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
