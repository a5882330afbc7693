"""Map PostgreSQL errors raised by our functions and constraints to toolrelay errors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

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
    "TR006": errors.Unauthenticated,  # agents.check_token (migration 0039)
    "TR007": errors.TooManyPending,  # agents.tg_pending_per_agent (migration 0049)
}


# What a constraint allows, in the words of the field it guards (the Python layer checks the
# same rules first, naming the value too; these cover plain SQL and anything missed).
_CHECKS = {
    "tools_registry_endpoint_url_scheme_check": "endpoint_url must be an http:// or https:// URL",
    "tools_registry_endpoint_required_unless_none_check":
        "endpoint_url is required unless egress_class is none",
    "tools_registry_http_method_check": "http_method must be one of GET, POST, PUT, PATCH, DELETE",
    "tools_registry_auth_method_check":
        "auth_method must be one of none, api_key, oauth, service_account, basic",
    "tools_registry_basic_in_a_header_check":
        "auth_method basic places its credential in a header: auth_placement must be header",
    "tools_registry_egress_class_check": "egress_class must be one of none, read_only, write",
    "tools_registry_auth_placement_check": "auth_placement must be header or query",
    "tools_registry_status_check": "status must be one of active, disabled, deprecated",
    "tools_registry_key_check":
        "key must be 1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit",
    "tools_registry_timeouts_check":
        "timeout_seconds must be more than 0 and at most 3600, connect_timeout_seconds more than 0",
    "tools_registry_connect_timeout_check": "connect_timeout_seconds must be at most 600",
    "tools_registry_max_attempts_check": "max_attempts must be from 1 to 20",
    "tools_registry_max_response_bytes_check": "max_response_bytes must be from 1 to 1073741824",
    "tools_registry_max_concurrency_check": "max_concurrency must be at least 1",
    "tools_registry_approval_ttl_check": "approval_ttl_seconds must be at least 1",
    "tools_registry_approvals_required_check": "approvals_required must be from 1 to 10",
    "tools_registry_response_pointer_check": "response_pointer must start with '/'",
    "tools_registry_auth_param_prefix_check": "auth_param_prefix must not contain line breaks",
    "tools_registry_request_template_shape_check":
        "request_template must be an object with only headers, query and body",
    "tools_registry_schema_input_check": "schema_input must be a JSON object",
    "tools_registry_schema_output_check": "schema_output must be a JSON object",
    "tools_registry_name_check": "name must not be empty",
    "agents_name_check": "an agent's name must not be empty",
    "agents_status_check": "an agent's status must be active or disabled",
    "credentials_name_check": "a credential's name must not be empty",
    "credentials_kind_check": "kind must be one of api_key, oauth, service_account, basic",
    "api_tokens_name_check": "a token's name must not be empty",
}  # fmt: skip
_UNIQUE = {
    "tools_registry_owner_key_key": "a tool with key {} already exists",
    "agents_owner_name_key": "an agent named {} already exists",
    "credentials_owner_name_key": "a credential named {} already exists",
    "tool_assignments_agent_tool_key": "that tool is already assigned to that agent",
    "members_email_key": "a member with email {} is already in this tenant",
    "members_oidc_subject_key": "a member with that sign-in subject is already in this tenant",
}
_KEY_VALUE = re.compile(r"^Key \(.*\)=\((?:[^,]*, )?(?P<value>.*)\) already exists\.?$")


def _constraint_error(
    state: str, constraint: str, detail: str | None, message: str
) -> errors.ToolrelayError:
    if state == "23505":
        found = _KEY_VALUE.match(detail or "")
        value = repr(found.group("value")) if found else "with that value"
        text = _UNIQUE.get(constraint, "something {} already exists").format(value)
        return errors.Conflict(text)
    if constraint in _CHECKS:
        return errors.InvalidArgument(_CHECKS[constraint])
    if not constraint:  # raised by one of our triggers: its message is written for people
        return errors.InvalidArgument(message)
    if state == "23503":
        return errors.InvalidArgument("it refers to something that does not exist (or not yours)")
    if state == "23502":
        return errors.InvalidArgument(message.replace(' of relation "', ' (in "'))
    return errors.InvalidArgument(message)


def _bad_syntax(message: str) -> str:
    found = re.match(r'invalid input syntax for type (\w+): "(.*)"', message, re.DOTALL)
    if found and found.group(1) == "uuid":
        return f"{found.group(2)!r} is not a valid id (a uuid like 0190a2b4-…)"
    if found:
        return f"{found.group(2)!r} is not a valid {found.group(1)}"
    return message


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
        return _constraint_error(state, diag.constraint_name or "", diag.message_detail, message)
    if state == "22P02":  # invalid input syntax, e.g. for a uuid
        return errors.InvalidArgument(_bad_syntax(message))
    if state.startswith("22") or state == "42804":  # bad value, or a value of the wrong type
        return errors.InvalidArgument(message)
    if not state and isinstance(exc, psycopg.ProgrammingError | psycopg.DataError):  # unadaptable
        return errors.InvalidArgument(f"invalid value: {message}")
    return errors.ToolrelayError(message)


@contextmanager
def translated() -> Iterator[None]:
    """Database errors raised inside, as ``translate_db_error`` says them."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate_db_error(exc) from None


@contextmanager
def storable_text() -> Iterator[None]:
    """A str holding an unpaired surrogate (JSON's "\\ud800", or argv bytes that are not
    UTF-8) cannot be encoded for PostgreSQL: psycopg raises UnicodeEncodeError before the
    statement is sent, and the transaction is rolled back. Said as the bad input it is."""
    try:
        yield
    except UnicodeEncodeError as exc:
        raise unstorable_text(exc) from None


UNSTORABLE_TEXT = (
    "a text holds an unpaired surrogate (U+D800 to U+DFFF), which cannot be stored;"
    " send valid Unicode (on a command line: UTF-8)"
)


def unstorable_text(exc: UnicodeEncodeError) -> Exception:
    """The error to raise for ``exc``: InvalidArgument when it is a surrogate that could not
    be encoded (the caller's text), else ``exc`` itself (a bug)."""
    return (
        errors.InvalidArgument(UNSTORABLE_TEXT) if exc.reason == "surrogates not allowed" else exc
    )


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
    first = mask_url(next((line for line in reason.splitlines() if line.strip()), reason).strip())
    why = first.rsplit("failed: ", 1)[-1].removeprefix("connection is bad: ")
    if not why[:2].isupper():  # "Connection refused" reads on; the server's "FATAL:" stays
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
            f"{source} is not a valid PostgreSQL connection string: {mask_url(str(exc)).strip()}"
            f" ({source}={mask_url(url)}, password hidden)"
        ) from None
