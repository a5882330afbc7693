"""Request and response bodies of the HTTP API (they are also its OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_TEXT = 10_000  # characters in a free-text field
MAX_NAME = 200


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul), Field(max_length=MAX_TEXT)]
Name = Annotated[str, AfterValidator(_no_nul), Field(min_length=1, max_length=MAX_NAME)]
JSONObject = dict[str, Any]
HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
AuthMethod = Literal["none", "api_key", "oauth", "service_account", "basic"]
EgressClass = Literal["none", "read_only", "write"]
AuthPlacement = Literal["header", "query"]
ToolStatus = Literal["active", "disabled", "deprecated"]
InvocationStatus = Literal["pending", "running", "completed", "failed", "rejected", "expired"]
CredentialKind = Literal["api_key", "oauth", "service_account", "basic"]
Seconds = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(BaseModel):
    code: str = Field(description="A stable, machine-readable code.")
    message: str = Field(description="What went wrong, for humans.")
    details: Any = None


class ErrorBody(BaseModel):
    error: ErrorDetail


# --- tools ---------------------------------------------------------------------------------


class _ToolSettings(_In):
    """The dispatch settings; null or absent keeps the stored value (or the default)."""

    endpoint_url: Text | None = None
    http_method: HttpMethod | None = None
    request_template: JSONObject | None = None
    auth_placement: AuthPlacement | None = None
    auth_param_name: Name | None = None
    auth_param_prefix: Text | None = None
    credential_ref: UUID | None = None
    egress_class: EgressClass | None = None
    response_pointer: Text | None = None
    connect_timeout_seconds: Seconds | None = None
    timeout_seconds: Seconds | None = None
    max_response_bytes: int | None = Field(None, ge=1, le=1024**3)
    max_attempts: int | None = Field(None, ge=1, le=20)
    max_concurrency: int | None = Field(None, ge=1, le=100_000)
    idempotency_header: Name | None = None
    approval_ttl_seconds: int | None = Field(None, ge=1, le=2**31 - 1)
    approvals_required: int | None = Field(
        None, ge=1, le=10, description="Distinct approvers a call needs (docs/approvals.md)."
    )
    status: ToolStatus | None = None


class ToolIn(_ToolSettings):
    """A whole tool, as `PUT /v1/tools/{key}` registers it (fn_register_tool's semantics)."""

    name: Name
    description: Text | None = None
    category: Name = "general"
    schema_input: JSONObject = Field(default_factory=dict)
    schema_output: JSONObject = Field(default_factory=dict)
    auth_method: AuthMethod = "none"
    requires_approval: bool = False
    is_dangerous: bool = False


class ToolCreate(ToolIn):
    key: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class ToolPatch(_ToolSettings):
    """Only the fields given change."""

    name: Name | None = None
    description: Text | None = None
    category: Name | None = None
    schema_input: JSONObject | None = None
    schema_output: JSONObject | None = None
    auth_method: AuthMethod | None = None
    requires_approval: bool | None = None
    is_dangerous: bool | None = None


class ToolOut(BaseModel):
    id: UUID
    key: str
    name: str
    description: str | None
    category: str
    status: str
    schema_input: JSONObject
    schema_output: JSONObject
    auth_method: str
    requires_approval: bool
    is_dangerous: bool
    egress_class: str
    endpoint_url: str | None
    http_method: str
    request_template: JSONObject
    auth_placement: str
    auth_param_name: str
    auth_param_prefix: str
    credential_ref: UUID | None
    response_pointer: str | None
    connect_timeout_seconds: float
    timeout_seconds: float
    max_response_bytes: int
    max_attempts: int
    max_concurrency: int | None
    idempotency_header: str | None
    approval_ttl_seconds: int
    approvals_required: int | None = None
    created_at: datetime
    updated_at: datetime


class ToolList(BaseModel):
    items: list[ToolOut]


# --- credentials ---------------------------------------------------------------------------


class CredentialIn(_In):
    kind: CredentialKind
    name: Name
    secret: Annotated[str, Field(min_length=1, max_length=65_536)] | JSONObject = Field(
        description="An api_key string, or the oauth / service_account / basic JSON object"
        " (basic: {username, password})."
    )
    allowed_hosts: list[Name] = Field(default_factory=list, max_length=100)


class RotateIn(_In):
    secret: Annotated[str, Field(min_length=1, max_length=65_536)] | JSONObject


class CredentialOut(BaseModel):
    """Metadata only: secret material never leaves the store."""

    id: UUID
    name: str
    kind: str
    allowed_hosts: list[str]
    status: str
    created_at: datetime
    rotated_at: datetime | None
    last_used_at: datetime | None
    expires_at: datetime | None
    reconnect: str | None = Field(
        None,
        description="For an oauth credential in needs_reauth: the approvals page's path"
        " where a person reconnects it (or POST /v1/credentials/connect {credential}).",
    )


class CredentialList(BaseModel):
    items: list[CredentialOut]


class CredentialDeleted(BaseModel):
    id: UUID
    unbound_tools: list[str]


# --- agents, assignments, tokens -----------------------------------------------------------


class AgentIn(_In):
    name: Name


class AgentOut(BaseModel):
    id: UUID
    name: str
    status: str
    created_at: datetime


class AgentList(BaseModel):
    items: list[AgentOut]


class AssignIn(_In):
    allowed: bool = True


class AssignmentOut(BaseModel):
    agent: str
    tool: str
    agent_id: UUID
    tool_id: UUID
    allowed: bool


class AssignmentList(BaseModel):
    items: list[AssignmentOut]


class Revoked(BaseModel):
    revoked: bool = Field(description="False when there was nothing to revoke.")


class TokenIn(_In):
    agent: Name | None = Field(None, description="An agent name or id; absent: an owner token.")
    member: UUID | None = Field(None, description="A member's id: a token of that member.")
    name: Name | None = None
    expires_at: datetime | None = None


class TokenOut(BaseModel):
    id: UUID
    kind: Literal["owner", "agent", "member"]
    agent_id: UUID | None
    member_id: UUID | None
    name: str | None
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="The bearer token. Shown once; only its hash is stored.")


class TokenList(BaseModel):
    items: list[TokenOut]


class Me(BaseModel):
    kind: Literal["owner", "agent"]
    owner: UUID
    agent_id: UUID | None
    member_id: UUID | None = Field(
        None, description="The member the token belongs to; null: the tenant's own token."
    )
    role: Literal["admin", "approver", "viewer"] | None = Field(
        None, description="The caller's role now (read from the database); null for an agent."
    )


# --- invocations ---------------------------------------------------------------------------


class AgentAttemptOut(BaseModel):
    """An attempt as its agent sees it: no egress detail, no request sent (owners' view)."""

    attempt: int
    started_at: datetime
    finished_at: datetime | None
    status_code: int | None
    duration_ms: float | None
    error_code: str | None


class AttemptOut(AgentAttemptOut):
    """An attempt as its owner sees it: the detail of any error, and the request sent."""

    error: str | None
    # The request handed to the HTTP client; all null when nothing was sent.
    request_method: str | None = None
    request_url: str | None = Field(
        default=None, description="As sent, the credential's value (if in the query) as ••••."
    )
    request_headers: dict[str, str] | None = Field(
        default=None,
        description="The headers toolrelay set, the credential's value as ••••; the HTTP"
        " client adds Host, Content-Length, User-Agent, Accept and Accept-Encoding.",
    )
    request_body_bytes: int | None = None
    request_body_sha256: str | None = Field(
        default=None, description="sha256 (hex) of the body bytes sent (of none: of b'')."
    )


class InvocationOut(BaseModel):
    id: UUID
    # None once the tool or agent was deleted (history outlives them; the key/name are kept)
    tool_id: UUID | None
    tool_key: str | None
    agent_id: UUID | None
    agent_name: str | None
    run_id: UUID | None
    input: JSONObject
    output: Any
    status: str
    approval_status: str
    approval_expires_at: datetime | None
    decided_at: datetime | None
    reject_reason: str | None
    error: str | None
    error_code: str | None
    http_status: int | None
    output_mismatch: str | None
    request_digest: str | None = Field(
        default=None, description="sha256 of the exact request the approval bound to."
    )
    attempt: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    retry_of: UUID | None = Field(default=None, description="The invocation this one retries.")
    reason: str | None = Field(default=None, description="The agent's stated reason for it.")


class ApprovalOut(BaseModel):
    member_id: UUID = Field(description="The approver (the tenant's uuid: the tenant itself).")
    approved_at: datetime
    counts: bool = Field(
        True,
        description="Whether it counts toward the quorum: false once its member was removed or"
        " may no longer approve (docs/approvals.md).",
    )


class InvocationDetail(InvocationOut):
    attempts: list[AttemptOut]
    retried_by: UUID | None = Field(
        default=None, description="The invocation that retries this one (at most one)."
    )
    decided_by: UUID | None = Field(
        None, description="The member who decided it (the tenant's uuid: the tenant itself)."
    )
    decided_by_policy: UUID | None = Field(
        None, description="The policy that decided it instead of a person (docs/approvals.md)."
    )
    approvals: list[ApprovalOut] = Field(
        default_factory=list, description="Who approved it so far (docs/approvals.md)."
    )
    approvals_needed: int | None = Field(
        None, description="While pending: the distinct approvers it needs in all."
    )


class AgentInvocationDetail(InvocationOut):
    attempts: list[AgentAttemptOut]


class InvocationPage(BaseModel):
    items: list[InvocationOut]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null at the end."
    )


class RejectIn(_In):
    reason: Text | None = None


class ApproveIn(_In):
    request_digest: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{64}$",
        description="The digest of the request you were shown (the approvals page sends it);"
        " when the call would now send anything else, nothing is approved (409).",
    )


# --- the agent's side ----------------------------------------------------------------------


class AgentTool(BaseModel):
    name: str = Field(description="The tool key, as the agent calls it.")
    title: str
    description: str | None
    input_schema: JSONObject = Field(description="JSON Schema of the input.")
    output_schema: JSONObject = Field(description="JSON Schema of the output.")
    requires_approval: bool = Field(description="Whether a call waits for a human's approval.")


class AgentToolList(BaseModel):
    tools: list[AgentTool]


class InvokeIn(_In):
    tool: Name = Field(description="The tool key.")
    input: JSONObject = Field(default_factory=dict)
    run_id: UUID | None = None
    reason: str | None = Field(
        None, max_length=1000, description="Why the agent makes this call; shown to approvers."
    )
