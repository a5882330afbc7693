"""Plain data for tools as owners describe them (CLI, YAML, Python)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any
from uuid import UUID

from toolrelay.errors import InvalidArgument

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
AUTH_METHODS = ("none", "api_key", "oauth", "service_account", "basic")
EGRESS_CLASSES = ("none", "read_only", "write")
TOOL_STATUSES = ("active", "disabled", "deprecated")


@dataclass
class ToolSpec:
    """Everything an owner can say about a tool; ``None`` means "the default / unchanged"."""

    key: str
    name: str
    description: str | None = None
    category: str = "general"
    schema_input: dict[str, Any] = field(default_factory=dict)
    schema_output: dict[str, Any] = field(default_factory=dict)
    auth_method: str = "none"
    requires_approval: bool = False
    is_dangerous: bool = False
    endpoint_url: str | None = None
    http_method: str | None = None
    request_template: dict[str, Any] | None = None
    auth_placement: str | None = None
    auth_param_name: str | None = None
    auth_param_prefix: str | None = None
    credential_ref: UUID | None = None
    egress_class: str | None = None
    response_pointer: str | None = None
    connect_timeout_seconds: float | None = None
    timeout_seconds: float | None = None
    max_response_bytes: int | None = None
    max_attempts: int | None = None
    max_concurrency: int | None = None
    idempotency_header: str | None = None
    approval_ttl_seconds: int | None = None
    approvals_required: int | None = None
    status: str | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> ToolSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgument(f"tool {data.get('key', '?')}: unknown field(s) {unknown}")
        for required in ("key", "name"):
            if not data.get(required):
                raise InvalidArgument(f"tool definition is missing {required!r}")
        values = dict(data)
        if values.get("credential_ref") is not None:
            try:
                values["credential_ref"] = UUID(str(values["credential_ref"]))
            except ValueError:
                raise InvalidArgument(
                    f"tool {data['key']}: credential_ref is not a uuid: {data['credential_ref']!r}"
                ) from None
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Columns beyond fn_register_tool's parameters, written with a plain UPDATE.
EXTRA_COLUMNS = (
    "connect_timeout_seconds",
    "timeout_seconds",
    "max_response_bytes",
    "max_attempts",
    "max_concurrency",
    "idempotency_header",
    "approval_ttl_seconds",
    "approvals_required",
    "status",
)

# Columns an owner may change with ``update``.
UPDATABLE_COLUMNS = (
    "name",
    "description",
    "category",
    "schema_input",
    "schema_output",
    "auth_method",
    "requires_approval",
    "is_dangerous",
    "endpoint_url",
    "http_method",
    "request_template",
    "auth_placement",
    "auth_param_name",
    "auth_param_prefix",
    "credential_ref",
    "egress_class",
    "response_pointer",
    *EXTRA_COLUMNS,
)
