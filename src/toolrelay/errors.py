"""Exceptions, one class per stable error code.

Every failure that ends an invocation maps to exactly one ``error_code`` stored in
``agents.tool_invocations.error_code``. The message is for humans and must never contain
secret material; the code is for programs and never changes meaning.
"""

from __future__ import annotations


class ToolrelayError(Exception):
    """Base of every error toolrelay raises on purpose."""

    code: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --- caller mistakes (raised before anything is written) -----------------------------------


class Unauthenticated(ToolrelayError):
    """No credentials, or credentials that do not identify anyone (HTTP 401)."""

    code = "unauthenticated"


class NotFound(ToolrelayError):
    code = "not_found"


class PermissionDenied(ToolrelayError):
    code = "permission_denied"


class InvalidArgument(ToolrelayError):
    code = "invalid_argument"


class Conflict(ToolrelayError):
    code = "conflict"


class InvalidState(ToolrelayError):
    """The object is not in a state that allows the operation (e.g. approving twice)."""

    code = "invalid_state"


class ConfigurationError(ToolrelayError):
    """The environment is missing something (a master key, a database)."""

    code = "configuration_error"


class DatabaseUnavailable(ConfigurationError):
    """The database cannot be reached (down, refused, a bad DATABASE_URL). ``reason`` is the
    driver's text, for the local user only: it may name hosts."""

    code = "database_unavailable"

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


# --- invocation outcomes (one per error_code) -----------------------------------------------


class InvocationError(ToolrelayError):
    """An error that ends an invocation; ``code`` is stored as its error_code."""

    code = "invocation_error"


class OutcomeUnknown(InvocationError):
    code = "outcome_unknown"


class EgressBlocked(InvocationError):
    code = "egress_blocked"


class HTTPError(InvocationError):
    code = "http_error"


class Timeout(InvocationError):
    code = "timeout"


class InvalidInput(InvocationError):
    code = "invalid_input"


class InvalidOutput(InvocationError):
    code = "invalid_output"


class TemplateError(InvocationError):
    code = "template_error"


class CredentialMissing(InvocationError):
    code = "credential_missing"


class CredentialError(InvocationError):
    code = "credential_error"


class CredentialNeedsReauth(CredentialError):
    code = "credential_needs_reauth"


class UnknownMasterKey(CredentialError):
    """The credential is sealed with a master key this process does not have: a fault of
    this process's configuration, not of the call (the worker leaves the call to another)."""

    def __init__(self, message: str, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


class WrongMasterKey(UnknownMasterKey):
    """This process has a master key of the credential's key id, but not the one that sealed
    it (two machines each made a key under one id): as a missing key, the worker leaves the
    call to another."""


class CredentialHostMismatch(CredentialError):
    code = "credential_host_mismatch"


class ToolChanged(InvocationError):
    code = "tool_changed"


class ToolInactive(InvocationError):
    code = "tool_inactive"


class NotAssigned(InvocationError):
    code = "not_assigned"


class ResponseTooLarge(InvocationError):
    code = "response_too_large"


class NetworkError(InvocationError):
    code = "network_error"


class ApprovalExpired(InvocationError):
    code = "approval_expired"


class NoEndpoint(InvocationError):
    code = "no_endpoint"


class TooManyPending(InvocationError):
    """The agent already has as many calls waiting for approval as it may (migration 0049)."""

    code = "too_many_pending"


class DispatchError(InvocationError):
    """The worker failed on this call itself (a bug): recorded at once, not sent again."""

    code = "dispatch_error"
