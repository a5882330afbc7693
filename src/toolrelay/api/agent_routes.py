"""/v1/agent for agents: their tools as JSON Schema, invoke, and an invocation's outcome."""

from __future__ import annotations

from functools import partial
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response, status
from starlette.concurrency import run_in_threadpool

from toolrelay.api import schemas as s
from toolrelay.api.auth import agent_caller, calling_agent, failures_limited
from toolrelay.api.context import ApiContext, request_context
from toolrelay.api.errors import BODY, SPLIT, error_responses
from toolrelay.api.paths import Wait, wait_for_invocation
from toolrelay.db.connect import Row
from toolrelay.export.names import key_for, may_be_exported
from toolrelay.registry import Registry
from toolrelay.registry.service import Claim
from toolrelay.tokens import Caller, Unauthenticated

router = APIRouter(prefix="/v1/agent", tags=["agent"])

Ctx = Annotated[ApiContext, Depends(request_context)]
Agent = Annotated[Caller, Depends(agent_caller)]
CallingAgent = Annotated[Caller, Depends(calling_agent)]  # its token checked by the call


def _me(caller: Caller) -> str:
    assert caller.agent_id is not None
    return str(caller.agent_id)


def _tool(row: Row) -> s.AgentTool:
    return s.AgentTool(
        name=row["key"],
        title=row["name"],
        description=row["description"],
        input_schema=row["schema_input"],
        output_schema=row["schema_output"],
        requires_approval=row["gated"],
    )


def _tool_key(registry: Registry, agent: str, name: str) -> str:
    """The key an exported function name (``gh__…``, shortened) stands for; a key as it is.
    Only a name that can differ from its key costs the lookup of the agent's tools."""
    if not may_be_exported(name):
        return name
    return key_for(name, (row["key"] for row in registry.agent_tools(agent))) or name


@router.get(
    "/tools",
    operation_id="listAgentTools",
    responses=error_responses(*SPLIT),
    summary="The tools this agent may call now (assigned, allowed, active)",
)
def tools(context: Ctx, caller: Agent) -> s.AgentToolList:
    rows = context.registry(caller).agent_tools(_me(caller))
    return s.AgentToolList(tools=[_tool(r) for r in rows])


@router.post(
    "/invocations",
    operation_id="createAgentInvocation",
    responses=error_responses(*SPLIT, *BODY, 404, 409),
    status_code=status.HTTP_202_ACCEPTED,
    summary="Invoke a tool; ?wait=N answers with its outcome (or 'pending': awaiting a human)",
)
async def invoke(
    body: s.InvokeIn,
    request: Request,
    context: Ctx,
    caller: CallingAgent,
    response: Response,
    wait: Wait = 0,
) -> s.InvocationOut:
    with failures_limited(request, context):
        if may_be_exported(body.tool):  # its lookup of the agent's tools reads as the agent
            caller = await context.authenticator.looked_up(caller)
        registry = context.registry(caller)
        mark = context.outcomes.mark()  # before the call: its first read may be skipped
        try:  # with a slot of the in-process worker, if there is one (dispatch/handoff.py)
            invocation_id = await context.handoff.make(
                partial(_invoke, registry, _me(caller), body), lambda made: made, registry.owner
            )
        except Unauthenticated:  # the token, remembered, was refused by the call's check
            context.authenticator.forget(caller)
            raise
    caller = caller.checked()  # the call's transaction checked it
    registry = context.registry(caller)
    response.headers["Location"] = f"/v1/agent/invocations/{invocation_id}"
    # One request instead of POST + GET ?wait: settled once finished or awaiting approval
    # (GET ?wait waits on the decision).
    row = await wait_for_invocation(
        request, registry, invocation_id, wait, agent=_me(caller), stop_at_pending=True,
        unread_since=mark, own=True,
    )  # fmt: skip
    return s.InvocationOut.model_validate(row)


async def _invoke(registry: Registry, me: str, body: s.InvokeIn, claim: Claim | None) -> UUID:
    """In the event loop (db/aio.py): a hand-off to a thread cost more than the trip."""
    tool = body.tool
    if may_be_exported(tool):  # the lookup of the agent's tools runs in a thread
        tool = await run_in_threadpool(_tool_key, registry, me, tool)
    return await registry.invoke_async(
        me, tool, body.input, body.run_id, reason=body.reason, claim=claim
    )


@router.get(
    "/invocations/{invocation_id}",
    operation_id="getAgentInvocation",
    responses=error_responses(*SPLIT, 404, 422),
    summary="One of this agent's invocations; ?wait=N waits up to N s for its outcome",
)
async def show(
    invocation_id: UUID, request: Request, context: Ctx, caller: Agent, wait: Wait = 0
) -> s.AgentInvocationDetail:
    registry = context.registry(caller)
    row = await wait_for_invocation(request, registry, invocation_id, wait, agent=_me(caller))
    # Attempts are the owner's rows (RLS): read on the owner's behalf, then only the parts
    # an agent may see — no egress detail, no request sent.
    owner_view = Registry(context.db, caller.owner)
    row["attempts"] = await run_in_threadpool(owner_view.attempts_of, invocation_id)
    return s.AgentInvocationDetail.model_validate(row)
