"""/v1/audit for owners: who changed the configuration, when, and what (docs/audit.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from toolrelay.api.auth import owner_caller
from toolrelay.api.context import ApiContext, request_context
from toolrelay.api.errors import SPLIT, error_responses
from toolrelay.registry.audit import AUDIT_PAGE_MOST, DEFAULT_AUDIT_LIMIT, audit_page
from toolrelay.tokens import Caller

router = APIRouter(prefix="/v1")

AuditKind = Literal[  # AUDIT_KINDS
    "agent", "assignment", "credential", "member", "policy", "policy_confirmation", "token",
    "tool", "webhook",
]  # fmt: skip


class AuditEntry(BaseModel):
    id: int = Field(description="Increasing with each row written (ties in `at` break by it).")
    at: datetime = Field(description="When the change was made (the statement's clock).")
    actor: UUID | None = Field(description="auth.uid() of who made it; null: no sub claim.")
    actor_member: UUID | None = Field(
        None, description="The member who made it (docs/approvals.md); null: the tenant itself."
    )
    actor_role: str = Field(
        description="The database role it acted as: authenticated (an owner), service_role"
        " (the dispatcher, an operator), or a login role outside the convention (psql)."
    )
    session_role: str = Field(description="The role the session logged in as.")
    xact_id: int = Field(description="The transaction: rows of one change share it.")
    kind: str = Field(description="tool, credential, assignment, agent or token.")
    object_id: UUID | None
    object_label: str | None = Field(
        description="The tool's key, the agent's, credential's or token's name, at the time."
    )
    action: Literal["insert", "update", "delete"]
    changes: dict[str, Any] = Field(
        description='{"<column>": {"old": …, "new": …}}: an insert has only new, a delete only'
        " old, an update only the columns that changed. Never a secret."
    )


class AuditPage(BaseModel):
    items: list[AuditEntry]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null at the end."
    )


@router.get(
    "/audit",
    operation_id="listAudit",
    responses=error_responses(*SPLIT, 422),
    tags=["audit"],
    summary="The audit log of configuration, newest first (an owner token)",
)
def list_audit(
    context: Annotated[ApiContext, Depends(request_context)],
    caller: Annotated[Caller, Depends(owner_caller)],
    since: Annotated[
        datetime | None, Query(description="Only changes at or after this time (ISO 8601).")
    ] = None,
    kind: AuditKind | None = None,
    object: Annotated[
        str | None,
        Query(
            pattern=r"^[^\x00]{1,200}$",
            description="An object's id, or its key or name as it was then.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=AUDIT_PAGE_MOST)] = DEFAULT_AUDIT_LIMIT,
    cursor: Annotated[
        str | None, Query(max_length=200, description="next_cursor of the previous page.")
    ] = None,
) -> AuditPage:
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    rows, next_cursor = audit_page(
        context.registry(caller), limit, cursor=cursor, since=since, kind=kind, object=object
    )
    return AuditPage(items=[AuditEntry.model_validate(r) for r in rows], next_cursor=next_cursor)
