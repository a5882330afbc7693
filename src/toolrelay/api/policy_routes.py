"""/v1/policies: rules that approve or reject the obvious calls (docs/approvals.md). Any
member reads them; adding and removing take an admin, as the database decides."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Query, status
from pydantic import BaseModel, ConfigDict, Field

from toolrelay.api.auth import owner_caller
from toolrelay.api.context import ApiContext, request_context
from toolrelay.api.errors import BODY, SPLIT, error_responses
from toolrelay.registry.policies import Policies, Policy
from toolrelay.tokens import Caller

router = APIRouter(prefix="/v1")

Ctx = Annotated[ApiContext, Depends(request_context)]
Owner = Annotated[Caller, Depends(owner_caller)]


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool: str = Field(min_length=1, description="The tool's key or id.")
    name: str = Field(min_length=1, max_length=200, description="Named in the call's history.")
    action: Literal["approve", "reject"]
    input_schema: dict[str, Any] = Field(
        description="A JSON Schema the call's input must match for the rule to decide."
    )


class PolicyOut(BaseModel):
    id: UUID
    tool_id: UUID
    tool_key: str
    name: str
    action: Literal["approve", "reject"]
    input_schema: dict[str, Any]
    created_at: datetime
    current: bool = Field(
        description="False once the tool's request changed since the rule was added or"
        " confirmed: an approval rule then decides nothing until an admin confirms it."
    )
    confirmations: int = Field(
        description="Admins who confirmed the rule for the tool as it is (adding it is one)."
    )
    confirmations_needed: int = Field(
        description="How many a call to the tool needs approvers: an approval rule takes as"
        " many admins' confirmations."
    )
    in_force: bool = Field(
        description="Whether the rule decides calls now: a rejection rule always; an approval"
        " rule when current, confirmed by enough admins, and (in a team) not only by the"
        " tool's last editor."
    )


class PolicyList(BaseModel):
    items: list[PolicyOut]


def _out(policy: Policy) -> PolicyOut:
    return PolicyOut.model_validate(policy, from_attributes=True)


@router.get(
    "/policies",
    operation_id="listPolicies",
    responses=error_responses(*SPLIT, 422),
    tags=["policies"],
    summary="List the rules, of one tool with ?tool=",
)
def list_policies(context: Ctx, caller: Owner, tool: str | None = Query(None)) -> PolicyList:
    return PolicyList(items=[_out(p) for p in Policies(context.db).list(caller, tool)])


@router.post(
    "/policies",
    operation_id="addPolicy",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    tags=["policies"],
    status_code=status.HTTP_201_CREATED,
    summary="Add a rule to a tool (an admin)",
)
def add_policy(body: PolicyIn, context: Ctx, caller: Owner) -> PolicyOut:
    policies = Policies(context.db)
    return _out(policies.add(caller, body.tool, body.name, body.action, body.input_schema))


@router.post(
    "/policies/{policy_id}/confirm",
    operation_id="confirmPolicy",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["policies"],
    summary="Bind a rule to its tool as it is now (an admin)",
)
def confirm_policy(policy_id: UUID, context: Ctx, caller: Owner) -> PolicyOut:
    return _out(Policies(context.db).confirm(caller, policy_id))


@router.delete(
    "/policies/{policy_id}",
    operation_id="removePolicy",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["policies"],
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove a rule (an admin)",
)
def remove_policy(policy_id: UUID, context: Ctx, caller: Owner) -> None:
    Policies(context.db).remove(caller, policy_id)
