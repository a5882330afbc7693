"""/v1/members: a tenant's people and their roles (docs/approvals.md). Any member reads the
list; adding, changing and removing take an admin, as the database decides."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, status
from pydantic import BaseModel, ConfigDict, Field

from toolrelay.api.auth import owner_caller
from toolrelay.api.context import ApiContext, request_context
from toolrelay.api.errors import BODY, SPLIT, error_responses
from toolrelay.errors import InvalidArgument
from toolrelay.registry.members import Member, Members
from toolrelay.tokens import Caller

router = APIRouter(prefix="/v1")

Ctx = Annotated[ApiContext, Depends(request_context)]
Owner = Annotated[Caller, Depends(owner_caller)]
Role = Literal["admin", "approver", "viewer"]


class MemberIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    role: Role
    email: str | None = Field(None, max_length=320)


class MemberChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role | None = None
    email: str | None = Field(
        None,
        max_length=320,
        description="A new email (null: none); the member's sign-in binds anew with it.",
    )


class MemberOut(BaseModel):
    id: UUID
    name: str
    email: str | None
    role: Role
    created_at: datetime
    removed_at: datetime | None


class MemberInvited(MemberOut):
    token: str = Field(description="The member's bearer token. Shown once.")


class MemberList(BaseModel):
    items: list[MemberOut]


class MemberRemoved(BaseModel):
    removed: bool = Field(description="False when the member was removed already.")


def _out(member: Member) -> MemberOut:
    return MemberOut.model_validate(member, from_attributes=True)


@router.get(
    "/members",
    operation_id="listMembers",
    responses=error_responses(*SPLIT),
    tags=["members"],
    summary="List the tenant's members and their roles",
)
def list_members(context: Ctx, caller: Owner) -> MemberList:
    return MemberList(items=[_out(m) for m in Members(context.db).list(caller)])


@router.post(
    "/members",
    operation_id="addMember",
    responses=error_responses(*SPLIT, *BODY, 409),
    tags=["members"],
    status_code=status.HTTP_201_CREATED,
    summary="Add a member with a role; their token is shown once (an admin)",
)
def add_member(body: MemberIn, context: Ctx, caller: Owner) -> MemberInvited:
    member, token = Members(context.db).invite(caller, body.name, body.role, body.email)
    return MemberInvited(**_out(member).model_dump(), token=token)


@router.patch(
    "/members/{member_id}",
    operation_id="setMemberRole",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    tags=["members"],
    summary="Change a member's role or email (an admin; one admin always remains)",
)
def set_member_role(member_id: UUID, body: MemberChange, context: Ctx, caller: Owner) -> MemberOut:
    if not body.model_fields_set:
        raise InvalidArgument("give the member's new role or email")
    changed = Members(context.db).change(
        caller, member_id, body.role, body.email, set_email="email" in body.model_fields_set
    )
    return _out(changed)


@router.delete(
    "/members/{member_id}",
    operation_id="removeMember",
    responses=error_responses(*SPLIT, 404, 409, 422),
    tags=["members"],
    summary="Remove a member and revoke their tokens (an admin; one admin always remains)",
)
def remove_member(member_id: UUID, context: Ctx, caller: Owner) -> MemberRemoved:
    return MemberRemoved(removed=Members(context.db).remove(caller, member_id))
