"""Path and query parameters shared by the routes, and the invocation cursor (defined in
toolrelay.registry.pages, so that the CLI hands out and takes the same cursors)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated
from uuid import UUID

from fastapi import Path, Query, Request
from starlette.concurrency import run_in_threadpool

from toolrelay.db.connect import Row
from toolrelay.registry import Registry
from toolrelay.registry.pages import decode_cursor as decode_cursor
from toolrelay.registry.pages import encode_cursor as encode_cursor

TOOL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NAME_PATTERN = r"^[^\x00]{1,200}$"
MAX_WAIT = 60.0  # seconds a long poll may last
WAIT_POLL_INTERVAL = 0.2  # seconds between looks at the database while waiting
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
    request: Request, registry: Registry, invocation_id: UUID, wait: float, agent: str | None
) -> Row:
    """The invocation, once finished or when ``wait`` seconds (capped) have passed."""
    deadline = time.monotonic() + min(wait, MAX_WAIT)
    while True:
        row = await run_in_threadpool(registry.get_invocation, invocation_id, agent=agent)
        if row["status"] in FINISHED or time.monotonic() >= deadline:
            return row
        if await request.is_disconnected():
            return row
        await asyncio.sleep(min(WAIT_POLL_INTERVAL, max(0.0, deadline - time.monotonic())))
