"""Path and query parameters shared by the routes, and the invocation cursor (defined in
toolrelay.registry.pages, so that the CLI hands out and takes the same cursors)."""

from __future__ import annotations

from functools import partial
from typing import Annotated
from uuid import UUID

from fastapi import Path, Query, Request
from starlette.concurrency import run_in_threadpool

from toolrelay.api.context import get_context
from toolrelay.db.connect import Row
from toolrelay.registry import Registry
from toolrelay.registry.pages import decode_cursor as decode_cursor
from toolrelay.registry.pages import encode_cursor as encode_cursor

TOOL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NAME_PATTERN = r"^[^\x00]{1,200}$"
MAX_WAIT = 60.0  # seconds a long poll may last
FINISHED = frozenset({"completed", "failed", "rejected", "expired"})

ToolKey = Annotated[str, Path(pattern=TOOL_KEY_PATTERN, description="A tool key (or id).")]
AgentRef = Annotated[str, Path(pattern=NAME_PATTERN, description="An agent name or id.")]
Wait = Annotated[
    float,
    Query(
        ge=0,
        description=f"Seconds to wait for the invocation to finish (long poll; at most {MAX_WAIT:g}).",
    ),
]


async def wait_for_invocation(
    request: Request,
    registry: Registry,
    invocation_id: UUID,
    wait: float,
    agent: str | None,
    *,
    stop_at_pending: bool = False,
    unread_since: int | None = None,
    own: bool = False,
) -> Row:
    """The invocation, once finished (or, ``stop_at_pending``, awaiting a decision) or when
    ``wait`` seconds (capped) have passed; ``unread_since``: Outcomes.mark() taken before
    the call was made; ``own``: this request made the call, so an outcome the in-process
    worker hands over is its answer, unread (Outcomes.wait_for's ``take_handed``).

    Woken by the outcome's NOTIFY (toolrelay.dispatch.outcomes), not by a fixed poll."""
    read = partial(run_in_threadpool, registry.get_invocation, invocation_id, agent=agent)
    settled = FINISHED | {"pending"} if stop_at_pending else FINISHED
    return await get_context(request).outcomes.wait_for(
        invocation_id,
        read,
        lambda row: row["status"] in settled,
        min(wait, MAX_WAIT),
        gone=request.is_disconnected,
        unread_since=unread_since,
        take_handed=own,
        agent=agent,
    )
