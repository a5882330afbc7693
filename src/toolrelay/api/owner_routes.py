"""/v1 for owners: tools, credentials, agents, assignments, invocations, tokens."""

from __future__ import annotations

import json
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from toolrelay.api import schemas as s
from toolrelay.api.auth import any_caller, owner_caller
from toolrelay.api.context import ApiContext, request_context
from toolrelay.api.errors import AUTHENTICATED, BODY, SPLIT, error_responses
from toolrelay.api.paths import (
    AgentRef,
    ToolKey,
    Wait,
    decode_cursor,
    encode_cursor,
    wait_for_invocation,
)
from toolrelay.errors import Conflict, NotFound
from toolrelay.mcp.oauth import MAX_ISSUER_CHARS, MAX_SUBJECT_CHARS, OAuthBindings
from toolrelay.registry import Registry, ToolSpec
from toolrelay.registry.members import Members
from toolrelay.tokens import Caller

router = APIRouter(prefix="/v1")

Ctx = Annotated[ApiContext, Depends(request_context)]
Owner = Annotated[Caller, Depends(owner_caller)]


def _registry(context: Ctx, caller: Owner) -> Registry:
    return context.registry(caller)


Reg = Annotated[Registry, Depends(_registry)]


@router.get(
    "/me",
    operation_id="getMe",
    responses=error_responses(*AUTHENTICATED),
    tags=["auth"],
    summary="Who the token belongs to",
)
def me(context: Ctx, caller: Annotated[Caller, Depends(any_caller)]) -> s.Me:
    role = None if caller.is_agent else Members(context.db).role_of(caller)
    return s.Me(kind="agent" if caller.is_agent else "owner", owner=caller.owner,
                agent_id=caller.agent_id, member_id=caller.member_id,
                role=role)  # type: ignore[arg-type]  # fmt: skip


# --- tools -----------------------------------------------------------------------------------


@router.get(
    "/tools",
    operation_id="listTools",
    responses=error_responses(*SPLIT),
    tags=["tools"],
    summary="List tools",
)
def list_tools(registry: Reg) -> s.ToolList:
    return s.ToolList(items=[s.ToolOut.model_validate(r) for r in registry.list_tools()])


@router.post(
    "/tools",
    operation_id="createTool",
    responses=error_responses(*SPLIT, *BODY, 409),
    tags=["tools"],
    status_code=status.HTTP_201_CREATED,
    summary="Create a tool",
)
def create_tool(body: s.ToolCreate, registry: Reg, response: Response) -> s.ToolOut:
    try:
        registry.get_tool(body.key)
    except NotFound:
        pass
    else:
        raise Conflict(f"tool {body.key} already exists; PUT /v1/tools/{body.key} replaces it")
    row = registry.register_tool(ToolSpec(**body.model_dump()))
    response.headers["Location"] = f"/v1/tools/{row['key']}"
    return s.ToolOut.model_validate(row)


@router.get(
    "/tools/{key}",
    operation_id="getTool",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["tools"],
    summary="Show a tool",
)
def show_tool(key: ToolKey, registry: Reg) -> s.ToolOut:
    return s.ToolOut.model_validate(registry.get_tool(key))


@router.put(
    "/tools/{key}",
    operation_id="putTool",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    tags=["tools"],
    summary="Create or replace a tool (upsert by key)",
)
def put_tool(key: ToolKey, body: s.ToolIn, registry: Reg) -> s.ToolOut:
    return s.ToolOut.model_validate(registry.register_tool(ToolSpec(key=key, **body.model_dump())))


@router.patch(
    "/tools/{key}",
    operation_id="updateTool",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    tags=["tools"],
    summary="Change some of a tool's fields",
)
def patch_tool(key: ToolKey, body: s.ToolPatch, registry: Reg) -> s.ToolOut:
    return s.ToolOut.model_validate(registry.update_tool(key, body.model_dump(exclude_unset=True)))


@router.post(
    "/tools/{key}/disable",
    operation_id="disableTool",
    responses=error_responses(*SPLIT, 404, 409, 422),
    tags=["tools"],
    summary="Disable a tool",
)
def disable_tool(key: ToolKey, registry: Reg) -> s.ToolOut:
    return s.ToolOut.model_validate(registry.set_tool_status(key, "disabled"))


@router.post(
    "/tools/{key}/enable",
    operation_id="enableTool",
    responses=error_responses(*SPLIT, 404, 409, 422),
    tags=["tools"],
    summary="Enable a tool again",
)
def enable_tool(key: ToolKey, registry: Reg) -> s.ToolOut:
    return s.ToolOut.model_validate(registry.set_tool_status(key, "active"))


# --- credentials -----------------------------------------------------------------------------


def _secret(value: str | dict[str, Any]) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@router.get(
    "/credentials",
    operation_id="listCredentials",
    responses=error_responses(*SPLIT),
    tags=["credentials"],
    summary="List credentials (metadata only)",
)
def list_credentials(context: Ctx, caller: Owner) -> s.CredentialList:
    infos = context.credentials.list(caller)
    return s.CredentialList(items=[s.CredentialOut.model_validate(i, from_attributes=True)
                                   for i in infos])  # fmt: skip


@router.post(
    "/credentials",
    operation_id="createCredential",
    responses=error_responses(*SPLIT, *BODY, 409),
    tags=["credentials"],
    status_code=status.HTTP_201_CREATED,
    summary="Add a credential (the secret is encrypted; it is never returned)",
)
def add_credential(body: s.CredentialIn, context: Ctx, caller: Owner) -> s.CredentialOut:
    new_id = context.credentials.add(
        caller, body.kind, body.name, _secret(body.secret), body.allowed_hosts
    )
    info = context.credentials.get(caller, new_id)
    return s.CredentialOut.model_validate(info, from_attributes=True)


@router.get(
    "/credentials/{credential_id}",
    operation_id="getCredential",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["credentials"],
    summary="Show a credential",
)
def show_credential(credential_id: UUID, context: Ctx, caller: Owner) -> s.CredentialOut:
    info = context.credentials.get(caller, credential_id)
    return s.CredentialOut.model_validate(info, from_attributes=True)


@router.post(
    "/credentials/{credential_id}/rotate",
    operation_id="rotateCredential",
    responses=error_responses(*SPLIT, *BODY, 404),
    tags=["credentials"],
    summary="Replace the secret",
)
def rotate_credential(
    credential_id: UUID, body: s.RotateIn, context: Ctx, caller: Owner
) -> s.CredentialOut:
    context.credentials.rotate(caller, credential_id, _secret(body.secret))
    info = context.credentials.get(caller, credential_id)
    return s.CredentialOut.model_validate(info, from_attributes=True)


@router.delete(
    "/credentials/{credential_id}",
    operation_id="deleteCredential",
    responses=error_responses(*SPLIT, 404, 409, 422),
    tags=["credentials"],
    summary="Delete a credential",
)
def delete_credential(
    credential_id: UUID,
    context: Ctx,
    caller: Owner,
    force: Annotated[bool, Query(description="Unbind the tools that use it first.")] = False,
) -> s.CredentialDeleted:
    unbound = context.credentials.delete(caller, credential_id, force=force)
    return s.CredentialDeleted(id=credential_id, unbound_tools=unbound)


# --- agents and assignments ------------------------------------------------------------------


@router.get(
    "/agents",
    operation_id="listAgents",
    responses=error_responses(*SPLIT),
    tags=["agents"],
    summary="List agents",
)
def list_agents(registry: Reg) -> s.AgentList:
    return s.AgentList(items=[s.AgentOut.model_validate(r) for r in registry.list_agents()])


@router.post(
    "/agents",
    operation_id="createAgent",
    responses=error_responses(*SPLIT, *BODY, 409),
    tags=["agents"],
    status_code=status.HTTP_201_CREATED,
    summary="Create an agent",
)
def create_agent(body: s.AgentIn, registry: Reg) -> s.AgentOut:
    agent_id = registry.create_agent(body.name)
    return s.AgentOut.model_validate(registry.get_agent(str(agent_id)))


@router.get(
    "/agents/{agent}",
    operation_id="getAgent",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["agents"],
    summary="Show an agent",
)
def show_agent(agent: AgentRef, registry: Reg) -> s.AgentOut:
    return s.AgentOut.model_validate(registry.get_agent(agent))


class AgentOAuthIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    issuer: str = Field(
        max_length=MAX_ISSUER_CHARS,
        description="The authorization server (one of TOOLRELAY_MCP_AUTHORIZATION_SERVERS),"
        " exactly as its access tokens' iss says it.",
    )
    subject: str = Field(
        max_length=MAX_SUBJECT_CHARS, description="The identity there: its access tokens' sub."
    )


class AgentOAuthOut(BaseModel):
    agent_id: UUID
    agent: str
    issuer: str | None = Field(description="null: not bound")
    subject: str | None


def _oauth_out(context: ApiContext, caller: Caller, agent: Any) -> AgentOAuthOut:
    issuer, subject = OAuthBindings(context.db).get(caller, agent["id"])
    return AgentOAuthOut(agent_id=agent["id"], agent=agent["name"], issuer=issuer, subject=subject)


@router.get(
    "/agents/{agent}/oauth",
    operation_id="getAgentOAuth",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["agents"],
    summary="The identity at an authorization server the agent acts for over MCP",
)
def get_agent_oauth(agent: AgentRef, registry: Reg, context: Ctx, caller: Owner) -> AgentOAuthOut:
    return _oauth_out(context, caller, registry.get_agent(agent))


@router.put(
    "/agents/{agent}/oauth",
    operation_id="setAgentOAuth",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    tags=["agents"],
    summary="Let access tokens for an identity at an authorization server act as the agent"
    " over MCP (an identity acts as one agent only: 409 when another holds it)",
)
def set_agent_oauth(
    agent: AgentRef, body: AgentOAuthIn, registry: Reg, context: Ctx, caller: Owner
) -> AgentOAuthOut:
    row = registry.get_agent(agent)
    OAuthBindings(context.db).bind(caller, row["id"], body.issuer, body.subject)
    return _oauth_out(context, caller, row)


@router.delete(
    "/agents/{agent}/oauth",
    operation_id="deleteAgentOAuth",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["agents"],
    summary="Unbind the agent from its identity at an authorization server",
)
def delete_agent_oauth(
    agent: AgentRef, registry: Reg, context: Ctx, caller: Owner
) -> AgentOAuthOut:
    row = registry.get_agent(agent)
    OAuthBindings(context.db).unbind(caller, row["id"])
    return _oauth_out(context, caller, row)


@router.get(
    "/assignments",
    operation_id="listAssignments",
    responses=error_responses(*SPLIT),
    tags=["assignments"],
    summary="List assignments",
)
def list_assignments(registry: Reg) -> s.AssignmentList:
    rows = registry.list_assignments()
    return s.AssignmentList(items=[s.AssignmentOut.model_validate(r) for r in rows])


@router.put(
    "/assignments/{agent}/{key}",
    operation_id="putAssignment",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    tags=["assignments"],
    summary="Let an agent call a tool (or deny it with allowed=false)",
)
def assign(
    agent: AgentRef, key: ToolKey, registry: Reg, body: s.AssignIn | None = None
) -> s.AssignmentOut:
    allowed = body.allowed if body is not None else True
    registry.assign(agent, key, allowed=allowed)
    agent_row, tool_row = registry.get_agent(agent), registry.get_tool(key)
    return s.AssignmentOut(agent=agent_row["name"], tool=tool_row["key"], agent_id=agent_row["id"],
                           tool_id=tool_row["id"], allowed=allowed)  # fmt: skip


@router.delete(
    "/assignments/{agent}/{key}",
    operation_id="revokeAssignment",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["assignments"],
    summary="Revoke an assignment",
)
def revoke(agent: AgentRef, key: ToolKey, registry: Reg) -> s.Revoked:
    return s.Revoked(revoked=registry.revoke(agent, key))


# --- invocations -----------------------------------------------------------------------------


@router.get(
    "/invocations",
    operation_id="listInvocations",
    responses=error_responses(*SPLIT, 422),
    tags=["invocations"],
    summary="List invocations, newest first",
)
def list_invocations(
    registry: Reg,
    status_: Annotated[s.InvocationStatus | None, Query(alias="status")] = None,
    tool: Annotated[
        str | None, Query(pattern=r"^[^\x00]{1,200}$", description="Key or id.")
    ] = None,
    agent: Annotated[
        str | None, Query(pattern=r"^[^\x00]{1,200}$", description="Name or id.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None, Query(max_length=200, description="next_cursor of the previous page.")
    ] = None,
) -> s.InvocationPage:
    registry.expire_pending()
    before = decode_cursor(cursor) if cursor else None
    rows = registry.list_invocations(status_, limit + 1, tool=tool, agent=agent, before=before)
    page = rows[:limit]
    next_cursor = encode_cursor(page[-1]) if len(rows) > limit else None
    return s.InvocationPage(items=[s.InvocationOut.model_validate(r) for r in page],
                            next_cursor=next_cursor)  # fmt: skip


@router.get(
    "/invocations/{invocation_id}",
    operation_id="getInvocation",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["invocations"],
    summary="Show an invocation with its attempts (optionally waiting for it to finish)",
)
async def show_invocation(
    invocation_id: UUID, request: Request, registry: Reg, wait: Wait = 0
) -> s.InvocationDetail:
    row = await wait_for_invocation(request, registry, invocation_id, wait, agent=None)
    return s.InvocationDetail.model_validate(row)


@router.post(
    "/invocations/{invocation_id}/approve",
    operation_id="approveInvocation",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    tags=["invocations"],
    summary="Approve (a human owner)",
)
def approve(
    invocation_id: UUID, registry: Reg, body: s.ApproveIn | None = None
) -> s.InvocationDetail:
    registry.approve(invocation_id, body.request_digest if body is not None else None)
    return s.InvocationDetail.model_validate(registry.get_invocation(invocation_id))


@router.post(
    "/invocations/{invocation_id}/reject",
    operation_id="rejectInvocation",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    tags=["invocations"],
    summary="Reject",
)
def reject(
    invocation_id: UUID, registry: Reg, body: s.RejectIn | None = None
) -> s.InvocationDetail:
    registry.reject(invocation_id, body.reason if body is not None else None)
    return s.InvocationDetail.model_validate(registry.get_invocation(invocation_id))


@router.post(
    "/invocations/{invocation_id}/retry",
    operation_id="retryInvocation",
    responses=error_responses(*SPLIT, 404, 409, 422),
    tags=["invocations"],
    status_code=status.HTTP_201_CREATED,
    summary="Make a failed, rejected or expired call again (a human owner): a new invocation"
    " with the same input, retry_of the first, gated again if its tool is gated now",
)
def retry(invocation_id: UUID, registry: Reg, response: Response) -> s.InvocationDetail:
    new_id = registry.retry(invocation_id)
    response.headers["Location"] = f"/v1/invocations/{new_id}"
    return s.InvocationDetail.model_validate(registry.get_invocation(new_id))


# --- tokens ----------------------------------------------------------------------------------


@router.get(
    "/tokens",
    operation_id="listTokens",
    responses=error_responses(*SPLIT),
    tags=["auth"],
    summary="List API tokens (never the tokens themselves)",
)
def list_tokens(context: Ctx, caller: Owner) -> s.TokenList:
    infos = context.tokens.list(caller)
    return s.TokenList(items=[s.TokenOut.model_validate(i, from_attributes=True) for i in infos])


@router.post(
    "/tokens",
    operation_id="createToken",
    responses=error_responses(*SPLIT, *BODY, 404),
    tags=["auth"],
    status_code=status.HTTP_201_CREATED,
    summary="Make a token for the owner, one of their agents or one of their members (shown once)",
)
def create_token(body: s.TokenIn, context: Ctx, caller: Owner, registry: Reg) -> s.TokenCreated:
    agent_id = registry.get_agent(body.agent)["id"] if body.agent is not None else None
    info, token = context.tokens.create(
        caller, agent_id, body.name, body.expires_at, member_id=body.member
    )
    out = s.TokenOut.model_validate(info, from_attributes=True)
    return s.TokenCreated(**out.model_dump(), token=token)


@router.delete(
    "/tokens/{token_id}",
    operation_id="revokeToken",
    responses=error_responses(*SPLIT, 404, 422),
    tags=["auth"],
    summary="Revoke a token",
)
def revoke_token(token_id: UUID, context: Ctx, caller: Owner) -> s.Revoked:
    return s.Revoked(revoked=context.tokens.revoke(caller, token_id))
